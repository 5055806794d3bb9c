"""Makes store_v5.db and store_v5.json.gz: a database in store schema 5 (file versions in
fixed-width column chunks) and what `fsage show` and `fsage snapshots` printed for it.

Run with fsage at store schema 5 (commit 3968701); tests/db/test_store.py opens the database
with the current fsage, which converts it, and checks that every snapshot reads back the same.

    python3 tests/db/data/make_store_v5.py
"""

from __future__ import annotations

import gzip
import json
import os
import random
import sqlite3
import subprocess
import tempfile
from dataclasses import fields
from pathlib import Path

from click.testing import CliRunner

from fsage.cli import main
from fsage.db.store import Store
from fsage.layout import FileTable, Layout

HERE = Path(__file__).resolve().parent


def run(*args: str) -> str:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def debugfs(image: Path, commands: list[str]) -> None:
    subprocess.run(["debugfs", "-w", "-f", "-", str(image)], input="\n".join(commands) + "\n",
                   text=True, check=True, capture_output=True)  # fmt: skip


def layout_columns(layout: Layout) -> dict[str, object]:
    """Every stored column of a rebuilt snapshot, as lists."""
    out: dict[str, object] = {}
    for part in ("files", "special"):
        table = getattr(layout, part)
        for f in fields(FileTable):
            out[f"{part}.{f.name}"] = getattr(table, f.name).tolist()
    out["links.parent"] = layout.links.parent.tolist()
    out["links.ino"] = layout.links.ino.tolist()
    out["links.names"] = [n.decode("utf-8", "surrogateescape") for n in layout.links.iter_names()]
    out["free"] = [layout.free.start.tolist(), layout.free.length.tolist()]
    return out


def main_() -> None:
    rng = random.Random(5)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        tree = work / "tree"
        for i in range(150):
            d = tree / f"d{i % 6}"
            d.mkdir(parents=True, exist_ok=True)
            (d / f"f{i:03d}").write_bytes(rng.randbytes(rng.choice([0, 60, 2000, 9000, 70000])))
        os.symlink("d0/f000", tree / "link")
        image = work / "fs.img"
        subprocess.run(["mke2fs", "-q", "-F", "-t", "ext4", "-b", "1024", "-N", "400", "-d",
                        str(tree), str(image), "16M"], check=True)  # fmt: skip
        blob = work / "blob"
        blob.write_bytes(rng.randbytes(30000))
        db = HERE / "store_v5.db"
        db.unlink(missing_ok=True)
        run("snapshot", str(image), "--db", str(db), "--name", "old")
        debugfs(
            image,
            [f"write {blob} /d1/new{i}" for i in range(5)]
            + ["rm /d2/f002", "rm /d3/f003", "ln /d4/f004 /d0/again", "mkdir /fresh"],
        )
        run("snapshot", str(image), "--db", str(db), "--name", "old")
        debugfs(image, ["rm /d1/new0", "rm /d1/new1", f"write {blob} /fresh/x",
                        "rm /d5/f005"])  # fmt: skip
        run("snapshot", str(image), "--db", str(db), "--name", "old")
        debugfs(image, [f"write {blob} /fresh/y"])
        run("snapshot", str(image), "--db", str(db), "--name", "old")
        # Retention's kind of deletion: a snapshot in the middle goes.
        with Store.open(db) as store:
            store.delete_snapshots([2])
        expected = {
            "snapshots": json.loads(run("snapshots", "--db", str(db), "--format", "json")),
            "show": {
                str(s): json.loads(run("show", str(s), "--db", str(db), "--format", "json"))
                for s in (1, 3, 4)
            },
            "layouts": {},
        }
        with Store.open(db) as store:
            for s in (1, 3, 4):
                expected["layouts"][str(s)] = layout_columns(store.load_layout(s))
        con = sqlite3.connect(db)
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        con.execute("PRAGMA journal_mode=DELETE")
        con.execute("VACUUM")
        con.close()
    with gzip.open(HERE / "store_v5.json.gz", "wt") as fh:
        json.dump(expected, fh, indent=0, sort_keys=True)


if __name__ == "__main__":
    main_()
