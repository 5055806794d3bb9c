"""`fsage lfs info` as plain data: geometry, preferred checkpoint, utilization."""

from __future__ import annotations

import os
from typing import Any

from fsage.lfs.cleaner import utilization_histogram
from fsage.lfs.fs import LFS


def lfs_info(path: str | os.PathLike[str]) -> dict[str, Any]:
    fs = LFS.open(path, readonly=True)
    try:
        geo = fs.geo
        log = range(geo.first_log_segment, geo.segments)
        total, live = fs.usage()
        return {
            "geometry": geo.to_json(),
            "checkpoint": {
                "region": fs.cp_which,
                "timestamp_ms": fs.cp_stamp,
                "next_segment": fs.cp_next,
                "rolled_forward_segments": fs.rolled_forward,
                "notes": list(fs.notes),
            },
            "utilization": {
                "data_blocks": total,
                "live_blocks": live,
                "fraction": live / total if total else 0.0,
                "clean_segments": len(fs.clean),
            },
            "histogram": utilization_histogram(fs.live, geo.data_blocks_per_segment, list(log)),
            "segments": [
                {"segment": s, "live_blocks": fs.live[s], "mtime_ms": fs.mtime[s]} for s in log
            ],
        }
    finally:
        fs.close()
