"""A second aging run on an aged target: every preset runs twice on one target (the same seed,
so the same names come up again), and each run says what it changed on disk, as a walk of the
target before and after sees it."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fsage.ager.profile import PRESETS
from fsage.ager.run import AgeOptions, age, shape_profile
from tests.ager.helpers import fsck_clean, tree_of

MIB = 1 << 20


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "t"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64M", "fsage-test", mnt], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def _age(target: Path, env: dict[str, str], *args: str) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "fsage", "age", str(target), "--format", "json", *args]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    res: dict[str, Any] = json.loads(done.stdout)
    return res


def _seen(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """What a walk before and after a run sees changed (the oracle of ``changes``)."""
    files_b = {p: s for p, s in before.items() if not p.endswith("/")}
    files_a = {p: s for p, s in after.items() if not p.endswith("/")}
    dirs_b = {p for p in before if p.endswith("/")}
    dirs_a = {p for p in after if p.endswith("/")}
    both = files_b.keys() & files_a.keys()
    return {
        "files_created": len(files_a.keys() - files_b.keys()),
        "bytes_created": sum(files_a[p] for p in files_a.keys() - files_b.keys()),
        "files_deleted": len(files_b.keys() - files_a.keys()),
        "bytes_deleted": sum(files_b[p] for p in files_b.keys() - files_a.keys()),
        "files_grown": sum(files_a[p] > files_b[p] for p in both),
        "bytes_grown": sum(max(0, files_a[p] - files_b[p]) for p in both),
        "files_shrunk": sum(files_a[p] < files_b[p] for p in both),
        "bytes_shrunk": sum(max(0, files_b[p] - files_a[p]) for p in both),
        "dirs_created": len(dirs_a - dirs_b),
        "dirs_deleted": len(dirs_b - dirs_a),
    }


def _check_changes(res: dict[str, Any], before: dict[str, int], after: dict[str, int]) -> None:
    seen = _seen(before, after)
    got = res["changes"]
    assert {k: got[k] for k in seen} == seen
    assert got["net_files"] == seen["files_created"] - seen["files_deleted"]
    assert got["net_bytes"] == sum(s for p, s in after.items() if not p.endswith("/")) - sum(
        s for p, s in before.items() if not p.endswith("/")
    )


@pytest.mark.needs_root
@pytest.mark.slow
@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_preset_ages_an_aged_target_again(preset: str, small_fs: Path) -> None:
    profile = shape_profile(PRESETS[preset], fill=0.4, churn=4, ops_limit=800)
    before = tree_of(small_fs)
    first = age(small_fs, AgeOptions(profile=profile)).to_json()
    middle = tree_of(small_fs)
    _check_changes(first, before, middle)
    second = age(small_fs, AgeOptions(profile=profile)).to_json()
    after = tree_of(small_fs)
    # (it may end sooner: the fill is reached earlier on a fuller target)
    assert second["finished"] and 0 < second["ops"] <= first["ops"]
    _check_changes(second, middle, after)
    assert after != middle  # the second run changed the target


@pytest.mark.needs_root
@pytest.mark.slow
def test_news_ages_a_loop_mounted_image_twice(tmp_path: Path, fsage_env: dict[str, str]) -> None:
    """The same command twice on an image (the second run's first mkdir was the first run's);
    e2fsck finds the image clean after each."""
    img = tmp_path / "resume-news.img"
    subprocess.run(["truncate", "-s", "128M", str(img)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(img)], check=True)
    for _ in range(2):
        res = _age(img, fsage_env, "--profile", "news", "--ops-limit", "3000", "--mount")
        assert res["finished"] and res["ops"] == 3000
        assert res["changes"]["files_created"] > 0
        fsck_clean(img)


def test_second_run_keeps_clear_of_names_on_the_target() -> None:
    """Without root: a run of the same seed on a directory holding the first run's tree makes
    none of its names again, and a fixed-name profile takes the next free name."""
    from fsage.ager.generator import Generator

    prof = PRESETS["hfs-surge"]
    first = [op for _, op in zip(range(300), Generator(prof, 1, 256 * MIB).ops(), strict=False)]
    made = {op.path for op in first if op.op in ("create", "mkdir")}
    again = Generator(prof, 1, 256 * MIB)
    again.reserve([(p, op.op == "mkdir", op.size) for op in first for p in [op.path] if p in made])
    second = [op for _, op in zip(range(300), again.ops(), strict=False)]
    assert not made & {op.path for op in second if op.op in ("create", "mkdir")}
    ru = Generator(PRESETS["random-update"], 1, 64 * MIB)
    ru.reserve([("ru", True, 0), ("ru.2", True, 0)])
    assert next(ru.ops()).path == "ru.3"


@pytest.mark.needs_root
@pytest.mark.slow
def test_adopt_ages_the_files_already_there(small_fs: Path, fsage_env: dict[str, str]) -> None:
    args = ["--profile", "desktop", "--ops-limit", "1500"]
    _age(small_fs, fsage_env, *args)
    plain = _age(small_fs, fsage_env, *args)
    assert plain["changes"]["files_deleted"] == 0  # it deleted only what it made
    middle = tree_of(small_fs)
    adopted = _age(small_fs, fsage_env, *args, "--adopt")
    after = tree_of(small_fs)
    _check_changes(adopted, middle, after)
    gone = [p for p in middle if p not in after and not p.endswith("/")]
    assert len(gone) == adopted["changes"]["files_deleted"] > 0
