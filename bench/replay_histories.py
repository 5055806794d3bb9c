"""Rebuild a real history from a directory of release tarballs, for ``fsage replay`` to judge.

The releases of each project (``NAME-VERSION.tar.gz``, as ``pip download --no-deps
--no-binary NAME NAME==VERSION`` leaves them) are unpacked in version order over one directory
per project on a loop-mounted ext4 (``fsage.replay.unpack``), with a snapshot after each
batch; the file system is sized so the last state fills it to ``--fill``. The image and the
database are kept in ``--out``, and the commands that judge a recreation of the middle and the
last snapshot are printed (and run, with ``--judge``, then each replay's verdict under both
rules summed up: the judged distances, the free extents, where the replay lies between a
rerun and a plain copy, and what fails it; with ``--closed-loop`` a closed-loop replay of each
snapshot too, beside the open loop: per size bucket, locality, free space, the modeled cold
path-order scan on a modern HDD and seed 000's DSP 3105 with the plain copy's beside it, replay
time and the churn it inferred):

    python3 bench/replay_histories.py --sdists /work/cache/replay/sympy --out /tmp/h-sympy \\
        --block-size 1024 --fill 0.8 [--members '*/lib/*,*/test/*'] [--snapshots 30] [--judge]

A history of another shape: ``--git-repo REPO`` checks out REPO's first-parent commits (one
per release, as bench/git_history.py builds them) one after another onto one work tree on the
ext4, a snapshot every ``--every`` checkouts; git replaces every changed file by a new one, so a
file changed by several checkouts of an interval is written that often and only its last
version is seen. The bytes the checkouts wrote that no snapshot shows (written minus the net
change of the interval) are counted from the repository and kept in history.json as the true
hidden churn, beside the closed loop's inferred churn:

    python3 bench/replay_histories.py --git-repo /tmp/gitwork-cache/django/repo \
        --out /tmp/h-django --every 20 --fill 0.8 --judge --closed-loop

A release history whose files do fragment: with ``--population SHARE`` the releases are
unpacked over a second population (``pop/``: files of sizes drawn from a log-normal around
6 KiB, SHARE times the releases' bytes) that is churned between releases: before each
release a ``--churn`` share of it is deleted, a tenth of the rest is appended to, and the
deleted files are written anew while tar unpacks the release (their blocks interleave in
writeback), beside short-lived scratch files that are deleted before the snapshot (the true
hidden churn, kept in history.json):

    python3 bench/replay_histories.py --sdists /tmp/rel/src --out /tmp/h-rel --block-size 1024 \
        --fill 0.8 --population 1.0 --churn 0.3 --snapshots 12 --judge --closed-loop --runs 3

With ``--judge`` the last snapshot's scan time is judged too: cold path-order reads of the
original image, the open- and closed-loop recreations and a plain copy of the tree, in paired
rounds (order rotated each round) until each side's median ratio to the original is decided
against the band of 10 %: its 95 % sign-test interval inside the band ("within") or outside it
("outside"), or the round limit (``--scan-rounds``) or budget is reached ("undecided"). The
criterion applies where the copy is outside the band.

``--reuse`` judges the history already built in ``--out``.

Needs root and loop devices. Fetch releases with, for instance,
``pip download --no-deps --no-binary SQLAlchemy SQLAlchemy==2.0.20 -d DIR`` (``--no-binary``
naming the project alone: with ``:all:`` pip also builds the project's build tools from
source, which fails for projects that need Cython).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from replay import batches_from, fit_size

from fsage.ager.images import can_loop_mount
from fsage.replay.unpack import history_size, unpack_history

GIT = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null"}


def _git(repo: Path, *args: str, env: dict[str, str] | None = None) -> str:
    full = {**os.environ, **GIT, **(env or {})}
    return subprocess.run(["git", "--git-dir", str(repo), *args], capture_output=True,
                          text=True, check=True, env=full).stdout  # fmt: skip


def _tree(repo: Path, commit: str) -> dict[str, tuple[str, int]]:
    """Path -> (blob, size) of the commit's regular files."""
    out = {}
    for line in _git(repo, "ls-tree", "-r", "-l", commit).splitlines():
        meta, path = line.split("\t", 1)
        _mode, kind, blob, size = meta.split()
        if kind == "blob" and size != "-":
            out[path] = (blob, int(size))
    return out


def checkout_history(
    src: Path, out: Path, name: str, every: int, bs: int, fill: float
) -> dict[str, object]:
    """Check out ``src``'s first-parent commits in order onto one work tree on a fresh ext4
    (sized so the largest tree fills it to ``fill``), a snapshot every ``every`` checkouts;
    returns what history.json records, the true hidden bytes per interval included."""
    from fsage.ager.images import loop_mount
    from fsage.db.store import Store
    from fsage.snapshotter import read_source

    repo = out / "repo.git"
    if repo.exists():
        subprocess.run(["rm", "-rf", str(repo)], check=True)
    subprocess.run(["git", "clone", "-q", "--bare", str(src), str(repo)], check=True,
                   env={**os.environ, **GIT})  # fmt: skip
    commits = _git(repo, "rev-list", "--reverse", "--first-parent", "HEAD").split()
    trees = [_tree(repo, c) for c in commits]
    need = 0
    files = 0
    for t in trees:
        dirs = {p.rpartition("/")[0] for p in t}
        need = max(need, sum(-(-n // bs) * bs for _, n in t.values()) + len(dirs) * bs)
        files = max(files, len(t) + len(dirs))
    size = fit_size(need, files * 2, bs, fill)
    img = out / "orig.img"
    with open(img, "wb") as fh:
        fh.truncate(size)
    subprocess.run(["mkfs.ext4", "-F", "-q", "-b", str(bs), "-N", str(max(files * 2, 16384)),
                    "-L", name[:16], str(img)], check=True)  # fmt: skip
    index = {"GIT_INDEX_FILE": str(out / "index")}
    (out / "index").unlink(missing_ok=True)
    ids: list[int] = []
    written: list[int] = []
    hidden: list[int] = []
    with Store.open(out / "h.db", create=True) as store:
        prev: dict[str, tuple[str, int]] = {}
        for start in range(0, len(commits), every):
            before = prev
            w = 0
            with loop_mount(img) as mnt:
                for k in range(start, min(start + every, len(commits))):
                    _git(repo, "--work-tree", str(mnt), "checkout", "-q", "-f", commits[k],
                         env=index)  # fmt: skip
                    w += sum(n for p, (b, n) in trees[k].items() if prev.get(p, ("",))[0] != b)
                    prev = trees[k]
            net = sum(n for p, (b, n) in prev.items() if before.get(p, ("",))[0] != b)
            written.append(w)
            hidden.append(w - net)
            ids.append(store.add_snapshot(read_source(img), name=name).snapshot_id)
            last = min(start + every, len(commits))
            print(f"  checkouts {start + 1}-{last}: snapshot {ids[-1]}, {w / 2**20:.1f} MiB "
                  f"written, {(w - net) / 2**20:.1f} MiB hidden")  # fmt: skip
    subprocess.run(["rm", "-rf", str(repo)], check=True)
    return {"name": name, "block_size": bs, "size": size, "snapshot_ids": ids,
            "checkouts": len(commits), "every": every, "written_bytes": written,
            "hidden_bytes": hidden}  # fmt: skip


def judge_commands(
    out: Path, fs: str, ids: list[int], closed_loop: bool = False, runs: int = 5
) -> list[tuple[list[str], Path | None]]:
    """The fsage commands (and the file each one's output goes to) that judge recreations of
    the middle and the last snapshot (and, ``closed_loop``, closed-loop recreations of them)."""
    db = str(out / "h.db")
    fsage = [sys.executable, "-m", "fsage"]
    cmds: list[tuple[list[str], Path | None]] = []
    for which, sid in (("middle", ids[(len(ids) - 1) // 2]), ("last", ids[-1])):
        floor = out / f"floor-{which}.json"
        rec = str(out / f"rec-{which}.img")
        cmds.append(([*fsage, "noise-floor", "--db", db, "--fs", fs, "--until", str(sid),
                      "--runs", str(runs), "--workdir", str(out), "--format", "json"],
                     floor))  # fmt: skip
        cmds.append(([*fsage, "replay", "--db", db, "--fs", fs, "--until", str(sid),
                      "--noise-floor", str(floor), "--force", "--format", "json", rec],
                     out / f"replay-{which}.json"))  # fmt: skip
        if closed_loop:
            cmds.append(([*fsage, "replay", "--db", db, "--fs", fs, "--until", str(sid),
                          "--noise-floor", str(floor), "--closed-loop", "--journal",
                          str(out / f"closed-{which}.jsonl"), "--force", "--format", "json",
                          str(out / f"rec-{which}-closed.img")],
                         out / f"replay-{which}-closed.json"))  # fmt: skip
    return cmds


def open_vs_closed(out: Path, which: str) -> list[str]:
    """The open- and the closed-loop replay of the ``which`` snapshot side by side: each size
    bucket of 50 files or more, the path-order dynamic layout score, the free space, the
    replay's time and the churn the closed loop inferred."""
    try:
        runs = [json.loads((out / f"replay-{which}{s}.json").read_text()) for s in ("", "-closed")]
    except (OSError, ValueError) as exc:
        return [f"  {which}: no open/closed comparison ({exc})"]
    from fsage.replay.fidelity import FREE_BLOCKS, FREE_EXTENTS

    fids = [_fid(r["fidelity"]) for r in runs]
    from fsage.replay.fidelity import NoiseFloor

    spread: NoiseFloor | None = None
    with contextlib.suppress(OSError, ValueError):
        spread = NoiseFloor.from_json(json.loads((out / f"floor-{which}.json").read_text()))

    def mark(d: float | None, tol: float, key: str) -> str:
        """ok: within ``tol``; spread: outside it but within the tolerance the runs' spread
        gives (the verdict's, capped: ``fsage.replay.verdict.allowed_noise``)."""
        from fsage.replay.verdict import floor_allowance, tolerance

        if d is None:
            return "-"
        if abs(d) <= tol:
            return "ok"
        noise = floor_allowance(spread, key, spread.copy if spread else None)
        return "spread" if abs(d) <= tolerance(key, noise) else "FAIL"

    lines = [f"  {which}: {'':24} {'original':>9} {'open':>9} {'closed':>9}  open/closed"]
    for row_open, row_closed in zip(fids[0].by_size, fids[1].by_size, strict=True):
        if (row_open["files_original"] or 0) < 50:
            continue
        key = f"bucket:{row_open['min_blocks']}"
        orig = row_open["layout_score_original"] or 0
        got = [r["layout_score_recreated"] for r in (row_open, row_closed)]
        ok = [mark(None if g is None else g - orig, 0.02, key) for g in got]
        lines.append(
            f"    {row_open['label']:<24} {orig:9.3f} {got[0] or 0:9.3f} {got[1] or 0:9.3f}"
            f"  {ok[0]}/{ok[1]}"
        )
    dyn = [f.dynamic_score_recreated for f in fids]
    dorig = fids[0].dynamic_score_original or 0
    ok = [mark(None if d is None else d - dorig, 0.02, "dynamic") for d in dyn]
    lines.append(
        f"    {'path-order dynamic score':<24} {dorig:9.3f} {dyn[0] or 0:9.3f} {dyn[1] or 0:9.3f}"
        f"  {ok[0]}/{ok[1]}"
    )
    for key in (FREE_BLOCKS, FREE_EXTENTS):
        d = [f.distances()[key] for f in fids]
        ok = [mark(x, 0.1, key) for x in d]
        lines.append(
            f"    {'free TV, ' + key:<24} {'':>9} {d[0]:9.3f} {d[1]:9.3f}  {ok[0]}/{ok[1]}"
        )
    lines += scan_rows(fids, spread)
    t = [r["elapsed"] for r in runs]
    lines.append(f"    {'replay seconds':<24} {'':>9} {t[0]:9.1f} {t[1]:9.1f} ({t[1] / t[0]:.1f}x)")
    true: dict[int, int] = {}
    with contextlib.suppress(OSError, ValueError, KeyError):
        info = json.loads((out / "history.json").read_text())
        true = dict(zip(info["snapshot_ids"], info["hidden_bytes"], strict=True))
    for c in (runs[1].get("closed_loop") or {}).get("intervals", []):
        hid = true.get(c["snapshot"])
        lines.append(
            f"    snapshot {c['snapshot']}: {c['inferred_bytes'] / 2**20:.2f} MiB inferred"
            + ("" if hid is None else f" (true hidden {hid / 2**20:.2f})")
            + ", "
            f"{c['visible_bytes'] / 2**20:.2f} MiB visible, distance {c['distance_before']:.3f}"
            f" -> {c['distance_after']:.3f} ({c['stopped']})"
        )
    return lines


def _fid(data: dict[str, Any]) -> Any:
    """A replay's fidelity read back from its JSON (a replay stored before the scan was
    modeled has none)."""
    from fsage.replay.fidelity import Fidelity as Fid
    from fsage.replay.fidelity_scan import ScanModel

    fields = {k: data[k] for k in Fid.__dataclass_fields__ if k not in ("verdict", "scan")}
    return Fid(**fields, scan=ScanModel.from_json(data.get("scan")))


def scan_rows(fids: list[Any], floor: Any) -> list[str]:
    """The modeled cold path-order scan of the original, the open and the closed loop on each
    disk model, the plain copy's beside them (the floor's, else -), and the criterion per
    loop: met or MISSED where the copy is outside the band, else "n/a"."""
    from fsage.replay.fidelity_scan import COPY_FROM_FLOOR, SCAN_MODELS

    scans = [f.scan for f in fids]
    if any(s is None for s in scans):
        return ["    modeled scan: not in these replays' output (made before it was modeled)"]
    if floor is not None and floor.copy_scan is not None:
        for s in scans:
            s.copy, s.copy_source = floor.copy_scan, COPY_FROM_FLOOR
    word = {"met": "ok", "MISSED": "FAIL", "does not apply": "n/a", "unknown": "?"}
    lines = []
    for m in SCAN_MODELS:
        orig = scans[0].original["seconds"][m]
        got = [s.recreated["seconds"][m] for s in scans]
        copy = scans[0].copy["seconds"][m] if scans[0].copy else None
        ok = "/".join(word[s.status()] for s in scans) if m == SCAN_MODELS[0] else ""
        lines.append(
            f"    {'scan s, ' + m:<24} {orig:9.2f} {got[0]:9.2f} {got[1]:9.2f}  {ok}"
            + ("" if copy is None else f"  (plain copy {copy:.2f})")
        )
    ratios = [s.ratio("recreated") for s in scans]
    rc = scans[0].ratio("copy")
    lines.append(
        f"    {'scan / original, ' + SCAN_MODELS[0]:<24} {1:9.3f} {ratios[0] or 0:9.3f} "
        f"{ratios[1] or 0:9.3f}  plain copy {'-' if rc is None else format(rc, '.3f')}"
    )
    return lines


def verdict_summary(out: Path, which: str) -> list[str]:
    """The replay of the ``which`` snapshot judged under both rules against its floor."""
    from fsage.replay.fidelity import DYNAMIC, FREE_BLOCKS, FREE_EXTENTS, RULES, NoiseFloor

    try:
        res = json.loads((out / f"replay-{which}.json").read_text())
        floor = NoiseFloor.from_json(json.loads((out / f"floor-{which}.json").read_text()))
    except (OSError, ValueError) as exc:
        return [f"  {which}: no verdict ({exc})"]
    fid = _fid(res["fidelity"])
    d = fid.distances()
    lines = [
        f"  {which} (snapshot {res['snapshot_id']}): free space {d[FREE_BLOCKS]:.3f} by blocks, "
        f"{d[FREE_EXTENTS]:.3f} by extents (free extents {fid.free_original['free_extent_count']}"
        f" vs {fid.free_recreated['free_extent_count']}); dynamic layout score "
        f"{fid.dynamic_score_original or 0:.3f} vs {fid.dynamic_score_recreated or 0:.3f} "
        f"({d.get(DYNAMIC, float('nan')):+.3f}); floor: {floor.describe()}"
    ]
    for rule in RULES:
        lines.append(f"    {rule}: {fid.judge(floor, rule).line()}")
    if floor.copy:
        from fsage.replay.verdict import judge_distances

        # The plain copy judged as a recreation would be: its distances, the replay's
        # judged dimensions, the same floor.
        copy = {k: v for k, v in floor.copy.items() if k in fid.judged()}
        for rule in RULES:
            v = judge_distances(copy, fid.judged(), floor, rule)
            lines.append(f"    plain copy, {rule}: {'FAITHFUL' if v.faithful else 'NOT FAITHFUL'}"
                         f" ({'; '.join(v.reasons[:3])})")  # fmt: skip
    if floor.copy_scan is not None and fid.scan is not None:
        from fsage.replay.fidelity_scan import JUDGED_MODEL, SCAN_BAND

        # the copy judged by the scan criterion: it misses wherever the criterion applies
        rc = floor.copy_scan["seconds"][JUDGED_MODEL] / fid.scan.original["seconds"][JUDGED_MODEL]
        out = abs(rc - 1) > SCAN_BAND
        lines.append(f"    plain copy, modeled scan ({JUDGED_MODEL}): {rc:.3f} of the original's: "
                     + ("MISSED (the criterion applies)" if out else "within the band: the "
                        "criterion does not apply"))  # fmt: skip
    return lines


#: The scan criterion's band: a side's scan time within this of the original's.
SCAN_BAND = 0.10
#: Seconds of scanning after which no scan round starts.
SCAN_BUDGET = 900.0


def plain_copy(out: Path, fs: str, sid: int) -> Path:
    """An image of snapshot ``sid``'s tree written in one go onto a fresh file system of the
    recorded geometry (as ``fsage.replay.unaged`` makes it, kept for scanning)."""
    from fsage.ager.run import AgeOptions, age
    from fsage.db.store import Store
    from fsage.replay.deltas import DeltaBuilder, history, make_header, to_ns
    from fsage.replay.recreate import make_filesystem
    from fsage.workload import write_workload

    with Store.open(out / "h.db") as store:
        chain, _ = history(store, fs, str(sid))
        first = store.load_layout(chain[0].id)
        final = store.load_layout(chain[-1].id)
    builder = DeltaBuilder()
    ops = builder.interval(None, final, start_ns=None, end_ns=to_ns(chain[-1].taken_at))
    ops_file, image = out / "copy.jsonl", out / "copy-last.img"
    write_workload(ops_file, make_header(fs, None, [chain[-1]], builder, None, "first"), ops)
    image.unlink(missing_ok=True)
    make_filesystem(image, first)
    (out / "copy.db").unlink(missing_ok=True)
    age(image, AgeOptions(ops_file=ops_file, db=out / "copy.db", name="copy", force=True))
    return image


def band_verdict(ratios: list[float]) -> tuple[str, str]:
    """(within / outside / undecided, the median and its interval) for a side's scan-time
    ratios to the original's, against the band of ``SCAN_BAND``."""
    import statistics

    from fsage.replay.bench.paired import median_interval

    med = statistics.median(ratios)
    ci = median_interval(ratios)
    if ci is None:
        return "undecided", f"{med:.3f} (no interval yet)"
    lo, hi = ci
    text = f"{med:.3f} (95% interval {lo:.3f}-{hi:.3f}, {len(ratios)} rounds)"
    if lo >= 1 - SCAN_BAND and hi <= 1 + SCAN_BAND:
        return "within", text
    if hi < 1 - SCAN_BAND or lo > 1 + SCAN_BAND:
        return "outside", text
    return "undecided", text


def scan_judgement(out: Path, fs: str, sid: int, max_rounds: int) -> list[str]:
    """Cold path-order reads of the last snapshot's original image and of its open-loop,
    closed-loop and plain-copy recreations, in rounds (the order rotated each round) until
    every side's ratio to the original is decided against the band, ``max_rounds`` or the
    budget; the criterion (within the band where the copy is outside it) per side."""
    from fsage.replay.bench.scan import image_tree, scan_tree

    images = {"open": out / "rec-last.img", "closed": out / "rec-last-closed.img"}
    images = {k: v for k, v in images.items() if v.exists()}
    images["copy"] = plain_copy(out, fs, sid)
    say = print
    times: dict[str, list[float]] = {k: [] for k in ["original", *images]}
    verdicts: dict[str, tuple[str, str]] = {}
    t0 = time.perf_counter()
    with contextlib.ExitStack() as stack:
        trees = {"original": image_tree(out / "orig.img", "ext", "original", say, stack)[0]}
        for k, img in images.items():
            trees[k] = image_tree(img, "ext", k, say, stack)[0]
        order = list(trees)
        for r in range(max_rounds):
            for k in order[r % len(order) :] + order[: r % len(order)]:
                times[k].append(scan_tree(trees[k], trace=False, label=k, notes=[],
                                          say=say).seconds)  # fmt: skip
            verdicts = {
                k: band_verdict([a / b for a, b in zip(times[k], times["original"], strict=True)])
                for k in images
            }
            if all(v[0] != "undecided" for v in verdicts.values()):
                break
            if time.perf_counter() - t0 > SCAN_BUDGET:
                break
    import statistics

    base = statistics.median(times["original"])
    lines = [f"  scan of snapshot {sid}: original {base:.2f} s (median); time / original's:"]
    copy_out = verdicts["copy"][0] == "outside"
    met = {"within": "met", "outside": "NOT met", "undecided": "undecided"}
    for k, (word, text) in verdicts.items():
        crit = ""
        if k != "copy":
            crit = f"  criterion {met[word]}" if copy_out else "  criterion not applicable"
        lines.append(f"    {k:<8} {word:<9} {text}{crit}")
    json_out = {k: {"seconds": times[k]} for k in times}
    (out / "scan-last.json").write_text(json.dumps(json_out, indent=1))
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--sdists", type=Path, help="directory of release tarballs")
    src.add_argument("--git-repo", type=Path, help="a repository of releases to check out")
    ap.add_argument("--out", type=Path, required=True, help="where the image and database go")
    ap.add_argument("--name", default=None, help="file system name (default: the directory's)")
    ap.add_argument("--snapshots", type=int, default=30)
    ap.add_argument("--every", type=int, default=20, help="--git-repo: checkouts per snapshot")
    ap.add_argument("--members", default="", help="comma-separated tar patterns ('' = all)")
    ap.add_argument("--block-size", type=int, default=4096)
    ap.add_argument("--fill", type=float, default=0.8)
    ap.add_argument("--runs", type=int, default=5, help="noise-floor runs")
    ap.add_argument("--population", type=float, default=0.0,
                    help="--sdists: a second population of this many times the releases' "
                         "bytes, churned between releases (0: none)")  # fmt: skip
    ap.add_argument(
        "--churn",
        type=float,
        default=0.3,
        help="share of the population deleted and written anew per release",
    )
    ap.add_argument("--scratch", type=float, default=0.5,
                    help="scratch files per release (deleted before the snapshot), as a share "
                         "of the population written anew")  # fmt: skip
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--scan-rounds", type=int, default=20, help="most paired scan rounds (0: no scan judgement)"
    )
    ap.add_argument("--judge", action="store_true", help="run the printed commands too")
    ap.add_argument("--reuse", action="store_true", help="judge the history built in --out")
    ap.add_argument(
        "--closed-loop", action="store_true", help="replay each snapshot closed-loop as well"
    )
    args = ap.parse_args()
    if not can_loop_mount():
        sys.exit("bench/replay_histories.py needs root and loop devices")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.reuse:
        info = json.loads((args.out / "history.json").read_text())
    else:
        for stale in ("h.db", "orig.img"):
            (args.out / stale).unlink(missing_ok=True)
        t0 = time.perf_counter()
        if args.git_repo is not None:
            name = args.name or args.git_repo.resolve().parent.name
            info = checkout_history(args.git_repo, args.out, name, args.every, args.block_size,
                                    args.fill)  # fmt: skip
        elif args.population > 0:
            info = churned_unpack(args)
        else:
            info = unpack(args)
        info["build_seconds"] = time.perf_counter() - t0
        (args.out / "history.json").write_text(json.dumps(info, indent=1))
        print(f"built in {info['build_seconds']:.0f} s")
    name = str(info["name"])
    ids = [int(i) for i in info["snapshot_ids"]]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    for cmd, dest in judge_commands(args.out, name, ids, args.closed_loop, args.runs):
        print("  " + shlex.join(cmd) + (f" > {dest}" if dest else ""))
        if args.judge:
            t0 = time.perf_counter()
            with open(dest, "w") if dest else contextlib.nullcontext() as fh:
                subprocess.run(cmd, check=False, stdout=fh, env=env)
            print(f"    ({time.perf_counter() - t0:.0f} s)")
    if args.judge:
        for which in ("middle", "last"):
            print("\n".join(verdict_summary(args.out, which)))
            if args.closed_loop:
                print("\n".join(open_vs_closed(args.out, which)))
        if args.scan_rounds > 0:
            print("\n".join(scan_judgement(args.out, name, ids[-1], args.scan_rounds)))


class Population:
    """The second population of a churned release history: files under ``pop/`` in 64
    directories, written, deleted and appended to with a seeded generator."""

    def __init__(self, root: Path, bs: int, seed: int) -> None:
        import random

        self.root, self.bs = root, bs
        self.rng = random.Random(seed)
        self.files: dict[str, int] = {}
        self.serial = 0
        self.buf = bytes(range(256)) * 8192  # 2 MiB of filler

    def size(self) -> int:
        import math

        return max(1, min(int(math.exp(self.rng.gauss(math.log(6000), 1.3))), 2 << 20))

    def _write(self, path: Path, n: int, mode: str = "wb") -> None:
        with open(path, mode) as fh:
            while n > 0:
                k = min(n, len(self.buf))
                fh.write(self.buf[:k])
                n -= k

    def create(self, nbytes: int, prefix: str = "p") -> int:
        """New files until ``nbytes`` are written; returns the bytes written."""
        done = 0
        while done < nbytes:
            self.serial += 1
            rel = f"d{self.rng.randrange(64):02d}/{prefix}{self.serial:06d}"
            n = self.size()
            (self.root / rel).parent.mkdir(parents=True, exist_ok=True)
            self._write(self.root / rel, n)
            if prefix == "p":
                self.files[rel] = n
            done += n
        return done

    def churn(self, share: float) -> int:
        """Delete ``share`` of the files, append to a tenth of the rest; returns the bytes the
        deleted files held (written anew by the caller)."""
        names = sorted(self.files)
        gone = self.rng.sample(names, int(len(names) * share))
        freed = 0
        for rel in gone:
            (self.root / rel).unlink()
            freed += self.files.pop(rel)
        for rel in self.rng.sample(sorted(self.files), len(self.files) // 10):
            n = self.rng.randint(1, 8) * self.bs
            self._write(self.root / rel, n, "ab")
            self.files[rel] += n
        return freed


def churned_unpack(args: argparse.Namespace) -> dict[str, object]:
    """Releases unpacked over a churned second population (see the module doc); what
    history.json records, the scratch bytes no snapshot saw per interval included."""
    from fsage.ager.images import mount, mount_dir, run_tool, umount
    from fsage.db.store import Store
    from fsage.snapshotter import read_source

    name = args.name or args.sdists.resolve().name
    batches = batches_from(args.sdists, args.snapshots)
    need, inodes = history_size(batches, args.block_size)
    pop_bytes = int(need * args.population)
    # a population file takes half a block more than its bytes on average
    files_guess = pop_bytes // 6000 + 1
    size = fit_size(need + pop_bytes + files_guess * args.block_size // 2,
                    (inodes + 2 * files_guess) * 2, args.block_size, args.fill)  # fmt: skip
    print(f"{name}: {len(batches)} releases over a population of {pop_bytes >> 20} MiB "
          f"(churn {args.churn}), ext4 {args.block_size} B blocks, {size >> 20} MiB")  # fmt: skip
    img = args.out / "orig.img"
    with open(img, "wb") as fh:
        fh.truncate(size)
    run_tool(["mkfs.ext4", "-F", "-q", "-b", str(args.block_size), "-L", name[:16], "-N",
              str(max((inodes + 2 * files_guess) * 2, 16384)), "-E", "nodiscard", str(img)],
             "mkfs")  # fmt: skip
    mnt = mount_dir("churned")
    ids: list[int] = []
    full: list[float] = []
    hidden: list[int] = []
    written: list[int] = []
    pop = Population(mnt / "pop", args.block_size, args.seed)
    mounted = False
    try:
        with Store.open(args.out / "h.db", create=True) as store:
            for i, batch in enumerate(batches):
                mount(img, mnt)
                mounted = True
                renew = pop.churn(args.churn) if i else pop_bytes
                # The release and the population's new files are written at once: writeback
                # allocates their blocks interleaved, into the holes the deletes left.
                tars = []
                for where, tarball in batch:
                    (mnt / where).mkdir(parents=True, exist_ok=True)
                    tars.append(subprocess.Popen(
                        ["tar", "-xf", str(tarball), "--strip-components=1", "--no-same-owner",
                         "-C", str(mnt / where)]))  # fmt: skip
                w = pop.create(renew)
                scratch = pop.create(int(renew * args.scratch), prefix="tmp")
                if any(t.wait() != 0 for t in tars):
                    raise SystemExit(f"tar failed on batch {i + 1}")
                os.sync()
                for tmp in sorted((mnt / "pop").glob("d*/tmp*")):
                    tmp.unlink()
                st = os.statvfs(mnt)
                full.append(1 - st.f_bfree / st.f_blocks)
                umount(mnt)
                mounted = False
                ids.append(int(store.add_snapshot(read_source(img), name=name, source=str(img))
                               .snapshot_id))  # fmt: skip
                hidden.append(scratch)
                written.append(w + scratch)
                print(f"  release {i + 1}/{len(batches)}: snapshot {ids[-1]}, fullness "
                      f"{full[-1]:.3f}, {w / 2**20:.1f} MiB of population written, "
                      f"{scratch / 2**20:.1f} MiB scratch (hidden)")  # fmt: skip
    finally:
        if mounted:
            umount(mnt)
        with contextlib.suppress(OSError):
            mnt.rmdir()
    return {"name": name, "block_size": args.block_size, "size": size, "snapshot_ids": ids,
            "fullness": full, "population_bytes": pop_bytes, "churn": args.churn,
            "hidden_bytes": hidden, "written_bytes": written,
            "releases": [[str(p.name) for _, p in b] for b in batches]}  # fmt: skip


def unpack(args: argparse.Namespace) -> dict[str, object]:
    """Unpack ``args.sdists``'s releases (see the module doc); what history.json records."""
    name = args.name or args.sdists.resolve().name
    batches = batches_from(args.sdists, args.snapshots)
    members = [m for m in args.members.split(",") if m]
    need, inodes = history_size(batches, args.block_size, members)
    size = fit_size(need, inodes * 2, args.block_size, args.fill)
    print(
        f"{name}: {len(batches)} batches, ext4 {args.block_size} B blocks, {size >> 20} MiB "
        f"(last state about {need >> 20} MiB, {inodes} inodes)"
    )
    hist = unpack_history(batches, args.out / "orig.img", args.out / "h.db", name,
                          block_size=args.block_size, size=size,
                          inodes=max(inodes * 2, 16384), members=members,
                          echo=print)  # fmt: skip
    print(f"fullness at the end {hist.fullness[-1]:.3f}")
    return {
        "name": name,
        "block_size": args.block_size,
        "size": size,
        "snapshot_ids": hist.snapshot_ids,
        "fullness": hist.fullness,
        "releases": [[str(p.name) for _, p in b] for b in batches],
    }


if __name__ == "__main__":
    main()
