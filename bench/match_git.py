"""Does `fsage age --match` reach a git-aged file system that none of fsage's generators made?

Makes a local git repository whose commits are successive released versions of a real project
(the sdists given, unpacked one per commit, in version order), checks its history out in
``--trees`` work trees in turn on a fresh ext4 image of ``--size`` (the target), then

* matches a fresh image of the same size to the target (mounted, the kernel's allocator), and
* copies the target's tree onto another fresh image in path order, one writer (a plain copy),

and prints for the target, the matched image and the copy, read after unmount: the layout
score per size bucket (fsage's offline reader and `filefrag -v`), the free-space histogram's
total variation from the target's (fsage and e2freefrag), the modeled path-order dynamic layout
score, the fullness (fsage and e2freefrag), and the match's wall time.

Needs root and loop devices; the sdists come from pip, e.g.

    for v in 0 2 4 6 8; do pip download --no-deps --no-binary :all: sqlalchemy==1.4.$v -d sd; done
    python3 bench/match_git.py --sdists sd --size 512M --trees 4 --dir /tmp --keep /tmp/imgs
    python3 -m fsage bench /tmp/imgs/matched.img --suite scan --repeat 3
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from fsage.ager.images import loop_mount, make_image  # noqa: E402
from fsage.ager.match import match_layout, target_from_layout  # noqa: E402
from fsage.ager.match_target import compare  # noqa: E402
from fsage.snapshotter.ext import read_ext_layout  # noqa: E402
from tests.ager.gitaged import age_with_history, git  # noqa: E402
from tests.ager.test_match_git import _e2freefrag, _filefrag_buckets, _tv  # noqa: E402


def _version(p: Path) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", p.name.split("-", 1)[-1]))


def sdist_repo(repo: Path, sdists: list[Path]) -> list[str]:
    """One commit per sdist, in version order: the tree replaced by the unpacked release."""
    git("init", "-q", str(repo))
    ids = []
    for sd in sorted(sdists, key=_version):
        for p in repo.iterdir():
            if p.name != ".git":
                shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
        with tempfile.TemporaryDirectory(dir=repo.parent) as tmp, tarfile.open(sd) as tar:
            tar.extractall(tmp, filter="data")
            (top,) = Path(tmp).iterdir()
            for p in top.iterdir():
                p.rename(repo / p.name)
        git("add", "-A", cwd=repo)
        git("commit", "-q", "-m", sd.name, cwd=repo)
        ids.append(git("rev-parse", "HEAD", cwd=repo).strip())
    return ids


def plain_copy(src: Path, dst: Path) -> None:
    """The target's tree copied file by file in path order (names sorted), one writer."""
    for d, dirs, files in os.walk(src):
        dirs.sort()
        rel = Path(d).relative_to(src)
        if rel.parts and rel.parts[0] == "lost+found":
            continue
        (dst / rel).mkdir(exist_ok=True)
        for f in sorted(files):
            s = Path(d) / f
            if s.is_symlink():
                os.symlink(os.readlink(s), dst / rel / f)
            else:
                shutil.copyfile(s, dst / rel / f)


def row(name: str, image: Path, target_img: Path, target: object) -> list[str]:
    st = target_from_layout(read_ext_layout(image), name)
    rep = compare(target, st)  # type: ignore[arg-type]
    full, hist = _e2freefrag(image)
    _, thist = _e2freefrag(target_img)
    ff = _filefrag_buckets(image)
    scores = " ".join(
        f"{r['label'].split('-')[0].strip()}:{r['score']:.3f}/"
        f"{ff.get(r['bucket'], (0, 0, 0))[1] / max(ff.get(r['bucket'], (0, 0, 1))[2], 1):.3f}"
        for r in rep["buckets"]
        if r["judged"] and r["score"] is not None
    )
    dyn = st.locality.get("dynamic_score")
    tv = rep["free_tv"]
    return [
        f"{name:>8}: fullness {st.fullness:.3f} (e2freefrag {full:.3f}); free-space TV "
        f"{tv:.3f} (e2freefrag {_tv(thist, hist):.3f}); path-order dynamic layout score "
        f"{dyn:.3f}; buckets ok {rep['buckets_ok']}",
        f"{'':>8}  layout score per judged bucket, fsage/filefrag: {scores}",
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sdists", required=True, help="directory of a project's sdists")
    ap.add_argument("--size", default="512M", help="image size (default 512M)")
    ap.add_argument("--trees", type=int, default=4, help="work trees checked out in turn")
    ap.add_argument("--seed", type=int, default=1, help="matcher seed")
    ap.add_argument("--dir", default=None, help="where the images go (default: $TMPDIR)")
    ap.add_argument(
        "--keep",
        default=None,
        help="directory to move target.img, matched.img and copy.img to (for the scan suite)",
    )
    args = ap.parse_args()
    size = int(args.size[:-1]) << {"M": 20, "G": 30}[args.size[-1].upper()]
    sdists = sorted(Path(args.sdists).glob("*.tar.gz"))
    with tempfile.TemporaryDirectory(prefix="match-git-", dir=args.dir) as tmp:
        work = Path(tmp)
        t0 = time.perf_counter()
        ids = sdist_repo(work / "repo", sdists)
        target_img = make_image(work / "target.img", "ext4", size)
        with loop_mount(target_img) as mnt:
            age_with_history(mnt, work / "repo", ids, trees=args.trees)
        print(
            f"target: {len(ids)} releases of {sdists[0].name.split('-')[0]} in {args.trees} "
            f"work trees on {args.size} ext4, built in {time.perf_counter() - t0:.0f} s"
        )
        target = target_from_layout(read_ext_layout(target_img), "git-aged target")
        img = make_image(work / "matched.img", "ext4", size)
        t1 = time.perf_counter()
        res = match_layout(img, target, seed=args.seed, mode="mount", time_limit=600.0)
        took = time.perf_counter() - t1
        print(f"match: {'matched' if res.matched else 'NOT matched'} ({res.stop}) in {took:.0f} s")
        for why in res.reasons.values():
            print(f"  {why}")
        copy_img = make_image(work / "copy.img", "ext4", size)
        with loop_mount(target_img, options="ro") as src, loop_mount(copy_img) as dst:
            plain_copy(src, dst)
        for line in (
            row("target", target_img, target_img, target)
            + row("matched", img, target_img, target)
            + row("copy", copy_img, target_img, target)
        ):
            print(line)
        if args.keep:
            keep = Path(args.keep)
            keep.mkdir(parents=True, exist_ok=True)
            for p in (target_img, img, copy_img):
                shutil.move(p, keep / p.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
