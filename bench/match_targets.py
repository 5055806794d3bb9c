"""The acceptance table of `fsage age --match` on targets none of fsage's generators made.

Builds (or takes) a target image, matches fresh images of the same mkfs parameters to it on
the kernel path (loop-mounted), copies the target's tree onto another fresh image in path
order (a plain copy), and prints for each, read after unmount:

* the layout score of every size bucket with at least 50 files in the target, by fsage's
  reader and by ``filefrag -v`` (ext4 and xfs);
* the free-space histogram's total variation from the target's, by fsage and by e2freefrag
  (ext4) or ``xfs_db freesp`` (xfs), in blocks and in extent counts;
* the modeled path-order dynamic layout score and the distances between consecutive files of
  a directory (share adjacent / within 1 MiB / within a group / farther);
* the fullness, by fsage and by e2freefrag or xfs_db;
* the match's wall time, and which dimension failed and why where one did.

Targets (root and loop devices needed):

    # the mail preset at 1 KiB blocks
    python3 bench/match_targets.py mail --size 128M --block-size 1024 --fill 0.82 --churn 1
    # a real project's releases (a local repository, one commit per release) checked out in
    # interleaved work trees; sdists of a package instead with --sdists DIR
    python3 bench/match_targets.py git --repo /tmp/gitwork-cache/django/repo --trees 8 \\
        --size 1G
    python3 bench/match_targets.py git --sdists /tmp/match-sdists --trees 4 --size 512M --fs xfs
    # any target image made elsewhere
    python3 bench/match_targets.py image target.img

``--scan`` adds ``fsage bench IMG --suite scan``'s aged/clean ratio of the target and the first
matched image; ``--keep DIR`` keeps the images.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from bench.match_git import plain_copy, sdist_repo  # noqa: E402
from fsage.ager.images import loop_mount, make_image  # noqa: E402
from fsage.ager.match import match_layout, target_from_layout  # noqa: E402
from fsage.ager.match_target import (  # noqa: E402
    DYNAMIC_TOL,
    FREE_TV,
    FULLNESS_TOL,
    MIN_FILES,
    SCORE_TOL,
    LayoutTarget,
    compare,
)
from tests.ager.gitaged import age_with_history, git  # noqa: E402
from tests.ager.mailaged import ext4_image, mail_aged  # noqa: E402
from tests.ager.oracles import filefrag_buckets, free_histograms, fs_kind, tv  # noqa: E402

_UNIT = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _size(text: str) -> int:
    return int(float(text[:-1]) * _UNIT[text[-1].upper()])


# ------------------------------------------------------------------------------- reading


def read_target(image: Path, name: str) -> LayoutTarget:
    """The image's layout target, read unmounted (ext4: fsage's offline reader) or from a
    read-only mount (xfs: the live reader, FIEMAP and GETFSMAP)."""
    if fs_kind(image) == "xfs":
        from fsage.snapshotter.live import read_live_layout

        with loop_mount(image, options="ro") as mnt:
            return target_from_layout(read_live_layout(mnt), name)
    from fsage.snapshotter.ext import read_ext_layout

    return target_from_layout(read_ext_layout(image), name)


def group_tails(image: Path) -> list[str]:
    """xfs: each allocation group's longest free-extent bucket and its free blocks, as
    ``xfs_db freesp -a`` counts them (a git-aged target's free space is the groups' tails)."""
    if fs_kind(image) != "xfs":
        return []
    out = []
    sb = subprocess.run(
        ["xfs_db", "-r", "-c", "sb 0", "-c", "p agcount", str(image)],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    for ag in range(int(sb.split("=")[1])):
        text = subprocess.run(
            ["xfs_db", "-r", "-c", f"freesp -a {ag}", str(image)],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        rows = [ln.split() for ln in text.splitlines() if ln.split() and ln.split()[0].isdigit()]
        free = sum(int(r[3]) for r in rows)
        out.append(f"{rows[-1][0]}+ of {free}" if rows else "none")
    return out


def measure_row(
    name: str, image: Path, target: LayoutTarget, oracle_target: tuple[Any, ...], bs: int
) -> dict[str, Any]:
    st = read_target(image, name)
    rep = compare(target, st)
    full, blocks, extents = free_histograms(image)
    _tf, tblocks, textents, tff = oracle_target
    ff = filefrag_buckets(image, bs)
    buckets = []
    failed: list[str] = []
    for r in rep["buckets"]:
        k = r["bucket"]
        tn, tc, td = tff.get(k, (0, 0, 0))
        if tn < MIN_FILES or not td:
            continue
        n, c, d = ff.get(k, (0, 0, 0))
        oracle = c / d if d else None
        buckets.append(
            {"bucket": k, "label": r["label"], "target": tc / td, "fsage": r["score"],
             "filefrag": oracle, "files": n, "target_files": tn}
        )  # fmt: skip
        if oracle is None or abs(oracle - tc / td) > SCORE_TOL:
            failed.append(f"bucket {r['label']}")
    free_tv, free_tv_n = tv(tblocks, blocks), tv(textents, extents)
    if free_tv > FREE_TV:
        failed.append("free space")
    dyn, tdyn = st.locality.get("dynamic_score"), target.locality.get("dynamic_score")
    if dyn is None or tdyn is None or abs(dyn - tdyn) > DYNAMIC_TOL:
        failed.append("path-order dynamic layout score")
    if abs(full - oracle_target[0]) > FULLNESS_TOL:
        failed.append("fullness")
    return {
        "name": name, "buckets": buckets, "free_tv": free_tv, "free_tv_extents": free_tv_n,
        "fsage_free_tv": rep["free_tv"], "fullness": full, "fsage_fullness": st.fullness,
        "dynamic": dyn, "locality": st.locality, "failed": failed, "free_blocks": blocks,
        "group_tails": group_tails(image),
    }  # fmt: skip


def print_row(row: dict[str, Any]) -> None:
    loc = row["locality"]
    print(
        f"  {row['name']:>10}: fullness {row['fullness']:.3f} (fsage {row['fsage_fullness']:.3f});"
        f" free TV {row['free_tv']:.3f} by blocks, {row['free_tv_extents']:.3f} by extents"
        f" (fsage {row['fsage_free_tv']:.3f}); dynamic {row['dynamic']:.3f};"
        f" consecutive files adjacent/≤1MiB/≤group/farther {loc.get('adjacent', 0):.2f}/"
        f"{loc.get('within_mib', 0):.2f}/{loc.get('within_group', 0):.2f}/"
        f"{loc.get('farther', 0):.2f}"
    )
    cells = " ".join(
        f"{b['label'].split('-')[0].strip()}:{b['target']:.3f}>"
        + ("-" if b["filefrag"] is None else f"{b['filefrag']:.3f}")
        + ("" if b["fsage"] is None else f"({b['fsage']:.3f})")
        for b in row["buckets"]
    )
    print(f"  {'':>10}  buckets ≥{MIN_FILES} files, target>filefrag(fsage): {cells}")
    holes = " ".join(f"{1 << k}+:{n}" for k, n in sorted(row["free_blocks"].items()) if n)
    print(f"  {'':>10}  free blocks in holes of (blocks): {holes}")
    if row["group_tails"]:
        tails = "; ".join(f"AG {g}: {t}" for g, t in enumerate(row["group_tails"]))
        print(f"  {'':>10}  longest free extent bucket of free blocks (xfs_db): {tails}")
    verdict = "matched" if not row["failed"] else "off in " + ", ".join(row["failed"])
    print(f"  {'':>10}  {verdict}")


# ------------------------------------------------------------------------------- targets


def fresh(path: Path, kind: str, size: int, bs: int) -> Path:
    if kind == "ext4" and bs != 4096:
        return ext4_image(path, size, bs)
    return make_image(path, kind, size)


def build_mail(work: Path, args: argparse.Namespace) -> Path:
    if args.fs != "ext4":
        raise SystemExit("the mail target is built on ext4")
    return mail_aged(
        work / "target.img", _size(args.size), block_size=args.block_size, fill=args.fill,
        churn=args.churn, seed=args.target_seed,
    )  # fmt: skip


def build_git(work: Path, args: argparse.Namespace) -> Path:
    if args.sdists:
        repo = work / "repo"
        ids = sdist_repo(repo, sorted(Path(args.sdists).glob("*.tar.gz")))
    else:
        repo = Path(args.repo)
        ids = git("rev-list", "--reverse", "--first-parent", "HEAD", cwd=repo).split()
    ids = ids[:: args.every]
    img = fresh(work / "target.img", args.fs, _size(args.size), args.block_size)
    with loop_mount(img) as mnt:
        age_with_history(mnt, repo, ids, trees=args.trees)
    return img


def scan_ratio(image: Path, budget: float) -> str:
    """``fsage bench IMG --suite scan``'s aged/clean line: the image's cold path-order read
    against a clean copy of its tree made in the same run."""
    out = subprocess.run(
        [sys.executable, "-m", "fsage", "bench", str(image), "--suite", "scan", "--repeat", "3",
         "--budget", str(budget)],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    if out.returncode:
        return f"scan failed: {out.stderr.strip()[-200:]}"
    return " ".join(ln for ln in out.stdout.splitlines() if ln.startswith("aged/clean"))


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    ap.add_argument("what", choices=["mail", "git", "image"])
    ap.add_argument("image", nargs="?", help="with 'image': the target image")
    ap.add_argument("--fs", choices=["ext4", "xfs"], default="ext4")
    ap.add_argument("--size", default="512M")
    ap.add_argument("--block-size", type=int, default=4096)
    ap.add_argument("--fill", type=float, default=0.82, help="mail: fullness")
    ap.add_argument("--churn", type=float, default=1.0, help="mail: churn")
    ap.add_argument("--target-seed", type=int, default=1, help="mail: the aging's seed")
    ap.add_argument("--repo", help="git: a local repository, one commit per release")
    ap.add_argument("--sdists", help="git: a directory of a project's sdists instead")
    ap.add_argument("--trees", type=int, default=4, help="git: work trees checked out in turn")
    ap.add_argument("--every", type=int, default=1, help="git: take every K-th commit")
    ap.add_argument("--seeds", default="1", help="matcher seeds, comma separated")
    ap.add_argument("--time-limit", type=float, default=600.0)
    ap.add_argument("--no-copy", action="store_true", help="leave out the plain copy")
    ap.add_argument("--scan", action="store_true", help="scan ratios (fsage bench --suite scan)")
    ap.add_argument("--scan-budget", type=float, default=120.0, help="seconds per scan")
    ap.add_argument("--dir", default=None, help="where the images go (default: $TMPDIR)")
    ap.add_argument("--keep", default=None, help="directory to move the images to")
    ap.add_argument("--json", default=None, help="write the rows here as JSON")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="match-targets-", dir=args.dir) as tmp:
        work = Path(tmp)
        t0 = time.perf_counter()
        if args.what == "image":
            if not args.image:
                ap.error("'image' needs the target image")
            target_img = Path(args.image)
        else:
            target_img = (build_mail if args.what == "mail" else build_git)(work, args)
        kind = fs_kind(target_img)
        bs = args.block_size
        target = read_target(target_img, "target")
        bs, size = target.block_size, target_img.stat().st_size
        print(
            f"target {args.what} on {size >> 20} MiB {kind}, {bs}-byte blocks"
            f" (built in {time.perf_counter() - t0:.0f} s): fullness {target.fullness:.3f},"
            f" {sum(n for n, _s in target.buckets.values())} files"
        )
        tfull, tblocks, textents = free_histograms(target_img)
        oracle_t = (tfull, tblocks, textents, filefrag_buckets(target_img, bs))
        rows = [measure_row("target", target_img, target, oracle_t, bs)]
        made = []
        for seed in [int(s) for s in args.seeds.split(",")]:
            img = fresh(work / f"matched-{seed}.img", kind, size, bs)
            t1 = time.perf_counter()
            res = match_layout(img, target, seed=seed, mode="mount", time_limit=args.time_limit)
            took = time.perf_counter() - t1
            row = measure_row(f"seed {seed}", img, target, oracle_t, bs)
            row["wall_s"], row["fsage_matched"], row["stop"] = took, res.matched, res.stop
            row["reasons"] = res.reasons
            rows.append(row)
            made.append(img)
        if not args.no_copy:
            copy_img = fresh(work / "copy.img", kind, size, bs)
            with loop_mount(target_img, options="ro") as src, loop_mount(copy_img) as dst:
                plain_copy(src, dst)
            rows.append(measure_row("plain copy", copy_img, target, oracle_t, bs))
            made.append(copy_img)
        for row in rows:
            print_row(row)
            if "wall_s" in row:
                print(
                    f"  {'':>10}  match: {'matched' if row['fsage_matched'] else 'NOT matched'}"
                    f" ({row['stop']}) in {row['wall_s']:.0f} s"
                )
                for dim, why in row["reasons"].items():
                    print(f"  {'':>10}    {dim}: {why}")
        if args.scan:
            for img in [target_img, *made[:1], *made[-1:]]:
                print(f"  scan {img.name}: {scan_ratio(img, args.scan_budget)}")
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1, default=str))
        if args.keep:
            keep = Path(args.keep)
            keep.mkdir(parents=True, exist_ok=True)
            for p in [target_img, *made]:
                if p.parent == work:
                    shutil.move(p, keep / p.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
