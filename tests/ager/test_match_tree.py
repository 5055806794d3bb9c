"""``fsage age --match`` on a checkout of many small directories (a project with locale trees:
``locale/xx/LC_MESSAGES/`` holding two files each): the match is as scattered in a
path-order read as the target, with about as many directories. The directories are counted
with ``os.walk`` on a read-only mount of each image."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from fsage.ager.images import loop_mount, make_image
from fsage.ager.match import match_layout, target_from_layout
from fsage.ager.match_target import DYNAMIC_TOL, FULLNESS_TOL
from fsage.snapshotter.ext import read_ext_layout
from tests.ager.gitaged import age_with_history, git
from tests.ager.helpers import fsck_clean
from tests.ager.oracles import free_histograms

MIB = 1 << 20


def locale_repo(repo: Path, *, commits: int, langs: int, seed: int) -> list[str]:
    """A repository of a package with ``langs`` locale directories of two files each (and a
    few modules per package directory), each commit rewriting a fifth of the catalogues and
    a tenth of the modules. Returns the commit ids, oldest first."""
    rng = random.Random(seed)
    repo.mkdir(parents=True)
    git("init", "-q", str(repo))
    tree: dict[str, int] = {}
    for app in range(langs // 20 + 1):
        for lang in range(20):
            d = f"app{app}/locale/l{lang:02d}/LC_MESSAGES"
            tree[f"{d}/django.po"] = int(rng.lognormvariate(9.0, 0.8))
            tree[f"{d}/django.mo"] = int(rng.lognormvariate(8.5, 0.8))
        for m in range(12):
            tree[f"app{app}/mod{m:02d}.py"] = int(rng.lognormvariate(8.3, 1.2))
    ids = []
    changed = set(tree)
    for c in range(commits):
        if c:
            names = sorted(tree)
            changed = {n for n in names if rng.random() < (0.2 if "locale" in n else 0.1)}
            for n in changed:
                tree[n] = max(1, int(tree[n] * rng.uniform(0.9, 1.3)))
        for n in changed:
            p = repo / n
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes((f"# {n} v{c}\n".encode() * (tree[n] // 16 + 1))[: tree[n]])
        git("add", "-A", cwd=repo)
        git("commit", "-q", "-m", f"v{c}", cwd=repo)
        ids.append(git("rev-parse", "HEAD", cwd=repo).strip())
    git("gc", "-q", cwd=repo)  # one pack, as a released project's history comes
    return ids


def _dirs_and_files(image: Path) -> tuple[int, int]:
    dirs = files = 0
    with loop_mount(image, options="ro") as mnt:
        for d, subdirs, names in os.walk(mnt):
            dirs += len(subdirs)
            files += sum(1 for n in names if os.path.isfile(os.path.join(d, n)))
    return dirs, files


@pytest.fixture(scope="module")
def locale_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from fsage.ager.images import can_loop_mount

    if not can_loop_mount():
        pytest.skip("needs root and loop devices")
    work = tmp_path_factory.mktemp("locale")
    ids = locale_repo(work / "repo", commits=8, langs=400, seed=3)
    img = make_image(work / "target.img", "ext4", 128 * MIB)
    with loop_mount(img) as mnt:
        age_with_history(mnt, work / "repo", ids, trees=3)
    return img


@pytest.mark.slow
@pytest.mark.needs_root
@pytest.mark.parametrize("seed", [1, 2])
def test_match_a_checkout_of_small_directories(
    locale_target: Path, tmp_path: Path, seed: int
) -> None:
    target = target_from_layout(read_ext_layout(locale_target), "locale checkout")
    want_dirs, want_files = _dirs_and_files(locale_target)
    # Fewer than two files per directory: most directories hold only directories or two
    # catalogues.
    assert want_files / want_dirs < 2.0
    img = make_image(tmp_path / "matched.img", "ext4", 128 * MIB)
    res = match_layout(img, target, seed=seed, mode="mount", time_limit=600.0)
    fsck_clean(img)
    got_dirs, got_files = _dirs_and_files(img)
    # As many directories for as many files as the target, within a tenth.
    assert abs((got_files / got_dirs) / (want_files / want_dirs) - 1) <= 0.1, (
        (want_dirs, want_files),
        (got_dirs, got_files),
    )
    # The path-order read jumps as often as the target's.
    want_dyn = target.locality["dynamic_score"]
    assert abs(res.report["locality"]["dynamic_score"] - want_dyn) <= DYNAMIC_TOL, (
        res.report["locality"]["dynamic_score"],
        want_dyn,
    )
    want_full = free_histograms(locale_target)[0]
    got_full = free_histograms(img)[0]
    assert abs(got_full - want_full) <= FULLNESS_TOL, (got_full, want_full)
