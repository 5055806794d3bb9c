"""A simple disk model: service time = positioning + transfer.

A request that starts exactly where the previous one ended is pure transfer. Any other request
pays positioning: for presets with a known geometry, a seek that grows with the square root of
the distance (calibrated so that random requests average the published average seek) plus half
a rotation; for presets known only by their average access time (seed 001: "15 ms / 5 MB/s"),
that access time, whatever the distance — which is the model of seed 001 §5.2.2.

Presets (name: source):

* ``dsp3105`` — seed 000 Table 1: 5400 RPM, 57 sectors/track, 14 tracks/cylinder,
  2568 cylinders, 9.5 ms average seek; 2.2 MB/s, the SCSI bus limit the paper reports.
* ``hp-sunos`` — seed 000 Table 3 (HP SCSI disk): 5400 RPM, 57 sectors/track,
  19 tracks/cylinder, 2255 cylinders, 11.5 ms average seek; media rate 57 sectors per turn.
* ``lfs-15ms``, ``sprite-17.5ms``, ``lfs-10ms`` — seed 001 §5: 15 ms / 5 MB/s,
  17.5 ms / 1.3 MB/s (Sprite LFS), 10 ms / 15 MB/s.
* ``hp97560`` — seed 001: 1.2 GB, 2.10 MB/s, ~19 ms average access.
* ``hpc3323a`` — seed 001: 1.05 GB, 4.0 MB/s, ~14 ms average access.
* ``hdd`` — a modern 7200 RPM disk: 8.5 ms average seek, 180 MB/s, 4 TB.
* ``ssd`` — a SATA SSD: 0.08 ms per non-sequential request, 500 MB/s.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from fsage.errors import UsageError

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

MB = 1_000_000


@dataclass(frozen=True)
class DiskModel:
    name: str
    description: str
    bandwidth: float  # bytes per second
    access_ms: float | None = None  # flat positioning time (seek + half rotation)
    avg_seek_ms: float = 0.0
    rpm: float = 0.0
    capacity: int = 0  # bytes; the span the seek curve is scaled to

    @property
    def half_rotation_ms(self) -> float:
        return 30_000.0 / self.rpm if self.rpm else 0.0

    @property
    def average_access_ms(self) -> float:
        if self.access_ms is not None:
            return self.access_ms
        return self.avg_seek_ms + self.half_rotation_ms

    def positioning_ms(self, distance_bytes: I64) -> F64:
        """Positioning time for non-sequential requests at these distances (bytes)."""
        d = np.abs(distance_bytes).astype(np.float64)
        if self.access_ms is not None or self.capacity <= 0:
            return np.full(d.shape, self.average_access_ms)
        # seek(d) = t1 + k * sqrt(d / capacity); E[sqrt(|x - y|)] over uniform x, y is 8/15,
        # so k is chosen to make random requests average avg_seek_ms.
        t1 = min(1.0, self.avg_seek_ms / 5.0)
        k = (self.avg_seek_ms - t1) * 15.0 / 8.0
        frac = np.minimum(d / self.capacity, 1.0)
        return t1 + k * np.sqrt(frac) + self.half_rotation_ms

    def service_ms(self, start_bytes: I64, length_bytes: I64, head_bytes: int = -1) -> F64:
        """Service time of each request, read in order; the head starts at ``head_bytes``
        (negative: unknown, so the first request pays an average access)."""
        start = start_bytes.astype(np.int64)
        length = length_bytes.astype(np.int64)
        transfer = length / self.bandwidth * 1000.0
        if start.size == 0:
            return transfer.astype(np.float64)
        prev_end = np.empty_like(start)
        prev_end[1:] = start[:-1] + length[:-1]
        prev_end[0] = head_bytes if head_bytes >= 0 else start[0]
        dist = start - prev_end
        pos = self.positioning_ms(dist)
        seq = dist == 0
        if head_bytes < 0:
            seq[0] = False
            pos[0] = self.average_access_ms
        return np.where(seq, 0.0, pos) + transfer


def _geo(sectors: int, tracks: int, cylinders: int) -> int:
    return 512 * sectors * tracks * cylinders


PRESETS: dict[str, DiskModel] = {
    m.name: m
    for m in [
        DiskModel(
            "dsp3105",
            "DSP 3105 SCSI, seed 000 Table 1",
            2.2 * MB,
            avg_seek_ms=9.5,
            rpm=5400,
            capacity=_geo(57, 14, 2568),
        ),
        DiskModel(
            "hp-sunos",
            "HP SCSI disk, seed 000 Table 3",
            512 * 57 * 5400 / 60.0,
            avg_seek_ms=11.5,
            rpm=5400,
            capacity=_geo(57, 19, 2255),
        ),
        DiskModel("lfs-15ms", "15 ms access, 5 MB/s (seed 001)", 5 * MB, access_ms=15.0),
        DiskModel(
            "sprite-17.5ms", "17.5 ms, 1.3 MB/s, Sprite LFS (seed 001)", 1.3 * MB, access_ms=17.5
        ),
        DiskModel("lfs-10ms", "10 ms access, 15 MB/s (seed 001)", 15 * MB, access_ms=10.0),
        DiskModel(
            "hp97560", "HP97560, 1.2 GB, 2.10 MB/s, ~19 ms (seed 001)", 2.10 * MB, access_ms=19.0
        ),
        DiskModel(
            "hpc3323a", "HPC3323A, 1.05 GB, 4.0 MB/s, ~14 ms (seed 001)", 4.0 * MB, access_ms=14.0
        ),
        DiskModel(
            "hdd",
            "modern 7200 RPM HDD, 8.5 ms seek, 180 MB/s",
            180 * MB,
            avg_seek_ms=8.5,
            rpm=7200,
            capacity=4_000_000_000_000,
        ),
        DiskModel(
            "ssd", "SATA SSD, 0.08 ms per random request, 500 MB/s", 500 * MB, access_ms=0.08
        ),
    ]
}


def get_model(name: str) -> DiskModel:
    try:
        return PRESETS[name]
    except KeyError:
        raise UsageError(
            f"unknown disk model {name!r} (known: {', '.join(sorted(PRESETS))})"
        ) from None
