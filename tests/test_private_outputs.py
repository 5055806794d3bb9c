"""Everything fsage writes that names files is readable by its owner only (files 0600,
directories 0700) under umask 022, unless ``--follow-umask`` asks for the umask's modes."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from fsage.cli import main


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def _run(*args: str) -> None:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, f"{args}: {result.output}{result.exception!r}"


def _every_output(tmp: Path, out: Path, extra: tuple[str, ...] = ()) -> None:
    """Run every command that writes a file into ``out`` (``extra``: options for the group)."""
    tree = tmp / "tree"
    if not tree.exists():
        for i in range(30):
            (tree / f"d{i % 3}").mkdir(parents=True, exist_ok=True)
            (tree / f"d{i % 3}" / f"f{i}").write_bytes(b"x" * (i * 1000))
    image = tmp / "fs.img"
    if not image.exists():
        subprocess.run(
            ["mke2fs", "-q", "-F", "-t", "ext4", "-b", "1024", "-d", str(tree), str(image), "4M"],
            check=True,
        )
    db = out / "fsage.db"
    _run(*extra, "snapshot", str(image), "--db", str(db), "--name", "one")
    _run(*extra, "snapshot", str(image), "--db", str(db), "--name", "one")
    _run(*extra, "report", "--db", str(db), "-o", str(out / "report.html"))
    _run(*extra, "analyze", "--db", str(db), "--format", "json")
    _run(*extra, "export", "--db", str(db), str(out / "fleet" / "data"))
    _run(*extra, "fleet", "compact", "--keep-sources", str(out / "fleet" / "data"))
    _run(*extra, "fleet", "report", str(out / "fleet" / "data"), "-o", str(out / "fleet.html"))
    _run(*extra, "deltas", "--db", str(db), "--fs", "one", "-o", str(out / "ops.jsonl.gz"))
    _run(*extra, "workload", "generate", "--profile", "hfs-surge", "--capacity", "4M",
         "--ops-limit", "20", "-o", str(out / "gen.jsonl"))  # fmt: skip
    target = out / "aged"
    target.mkdir()
    _run(*extra, "age", str(target), "--ops", str(out / "gen.jsonl"), "--db", str(db))
    # again on the tree the first left: the tree it starts on is kept beside the journal
    _run(*extra, "age", str(target), "--ops", str(out / "gen.jsonl"), "--force")
    blkparse = tmp / "read.txt"  # the user's input: only what fsage makes of it is checked
    blkparse.write_text("8,0 1 1 0.0 1 D R 2048 + 8 [cat]\n8,0 1 2 0.1 1 D R 4096 + 16 [cat]\n")
    _run(*extra, "trace", "import", str(blkparse), "--db", str(out / "trace.db"),
         "--block-size", "4096")  # fmt: skip
    bench = out / "bench"  # the benchmark's own files, as the suite makes them
    bench.mkdir()
    _run(*extra, "bench", "run", str(bench), "--suite", "seq", "--size", "256K",
         "--db", str(out / "bench.db"))  # fmt: skip
    _run(*extra, "demo", "--dir", str(out / "demo"), "--files", "10", "--churn", "0")


_TARGETS = {"aged", "bench"}  # the targets of age and bench: the user's directories


def _modes(out: Path) -> dict[str, int]:
    """The mode of everything under ``out`` but the aged tree's own files (the workload's,
    made as the workload says)."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(out):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = str(path.relative_to(out))
            if rel.startswith(("aged/", "bench/")):
                continue
            found[rel] = stat.S_IMODE(path.lstat().st_mode)
    return found


@pytest.mark.slow
def test_every_output_is_private(tmp_path: Path, umask_022: None) -> None:
    if shutil.which("mke2fs") is None:
        pytest.skip("needs mke2fs")
    pytest.importorskip("duckdb")
    out = tmp_path / "out"
    out.mkdir()
    _every_output(tmp_path, out)
    modes = _modes(out)
    # what the commands wrote, checked to be there: a test that found nothing passes nothing
    for rel in ("fsage.db", "report.html", "fleet/data", "fleet/data/_compacted.json",
                "fleet.html", "ops.jsonl.gz", "gen.jsonl", "aged.fsage-age", "trace.db",
                "bench.db", "demo", "demo/demo.img", "demo/fsage.db", "demo/report.html",
                "demo/.fsage-demo", "demo/demo.img.fsage-age"):  # fmt: skip
        assert rel in modes, sorted(modes)
    assert any(rel.endswith(".parquet") for rel in modes)
    assert any(rel.startswith("aged.fsage-age") and rel.endswith(".ops.jsonl") for rel in modes)
    assert any(rel.startswith("aged.fsage-age") and rel.endswith(".start.json") for rel in modes)
    shared = {rel: oct(mode) for rel, mode in modes.items() if mode & 0o077 and rel not in _TARGETS}
    assert shared == {}
    dirs = {rel for rel in modes if (out / rel).is_dir() and rel not in _TARGETS}
    assert dirs and all(modes[d] == 0o700 for d in dirs)
    assert all(modes[f] == 0o600 for f in set(modes) - dirs - _TARGETS)


@pytest.mark.slow
def test_follow_umask_gives_the_umask_modes(tmp_path: Path, umask_022: None) -> None:
    if shutil.which("mke2fs") is None:
        pytest.skip("needs mke2fs")
    pytest.importorskip("duckdb")
    out = tmp_path / "out"
    out.mkdir()
    _every_output(tmp_path, out, ("--follow-umask",))
    modes = _modes(out)
    assert modes["report.html"] == 0o644
    assert modes["fleet/data"] == 0o755
    assert modes["fleet/data/_compacted.json"] == 0o644
    assert modes["fsage.db"] == 0o644
    assert modes["demo"] == 0o755
    assert modes["demo/demo.img"] == 0o644
    assert modes["demo/.fsage-demo"] == 0o644
    # and the option does not stay on for the next command of the same process
    _run("report", "--db", str(out / "fsage.db"), "-o", str(out / "again.html"))
    assert stat.S_IMODE((out / "again.html").stat().st_mode) == 0o600


@pytest.mark.slow
@pytest.mark.needs_root
@pytest.mark.parametrize("kind", ["ext4", "xfs"])
def test_the_scan_suites_clean_copy_is_private(
    tmp_path: Path, umask_022: None, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """The clean copy (a copy of the whole scanned tree, beside the image while the scan runs)
    is made private; it is gone after the run, so its mode is taken as it is made."""
    from fsage.ager.images import MIN_SIZE, loop_mount, make_image
    from fsage.replay.bench import cleancopy

    if shutil.which(f"mkfs.{kind}") is None:
        pytest.skip(f"needs mkfs.{kind}")
    image = make_image(tmp_path / f"{kind}.img", kind, max(MIN_SIZE[kind], 32 << 20))
    with loop_mount(image) as mnt:
        for i in range(5):
            (mnt / f"f{i}").write_bytes(b"y" * 5000)
    seen: dict[str, int] = {}
    real = cleancopy.make_clean_copy

    def watched(clean: Path, *args: object, **kwargs: object) -> list[str]:
        notes = real(clean, *args, **kwargs)  # type: ignore[arg-type]
        seen[clean.name] = stat.S_IMODE(clean.stat().st_mode)
        return notes

    monkeypatch.setattr(cleancopy, "make_clean_copy", watched)
    _run("bench", "run", str(image), "--suite", "scan", "--repeat", "1",
         "--db", str(tmp_path / "b.db"))  # fmt: skip
    assert seen == {f".{image.name}.fsage-scan-clean": 0o600}
