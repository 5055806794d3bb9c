"""A real project's release history as a git repository, and ext4 images aged by pulling it.

Conway et al. (FAST'17) age file systems by pulling a real project's git history. This script
makes such a history from PyPI: one commit per released version of a package, in version
order, each commit the installed tree of that release (a wheel is a zip of it). Downloads are
kept in a cache directory the user names; nothing is fetched at test time.

    # the repository: 80 releases of botocore (wheels kept in the cache)
    python3 bench/git_history.py build --package botocore --from 1.29.0 --count 80 \\
        --cache /tmp/gitwork-cache
    # age a 512 MiB ext4 by pulling it into 5 interleaved work trees, release by release
    python3 bench/git_history.py age --repo /tmp/gitwork-cache/botocore/repo --trees 5 \\
        --size 512M --image /tmp/gitwork-botocore.img
    # how long converting a 1,000-commit history takes (a synthetic repository)
    python3 bench/git_history.py convert --commits 1000 --files 3000 --workdir /tmp

``age`` makes the image (mkfs.ext4 -b 4096), writes the stream with ``fsage workload git``,
runs it with ``fsage age IMAGE --ops`` (loop-mounted: root), snapshots the image into a
database beside it and prints fsage analyze's layout and locality and e2freefrag's histogram.
Then ``python3 -m fsage bench IMAGE --suite scan --repeat 5`` gives the aged/clean scan ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from packaging.version import InvalidVersion, Version

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fsage.ager.githistory import git_workload  # noqa: E402

GIT_ENV = {
    "GIT_AUTHOR_NAME": "fsage",
    "GIT_AUTHOR_EMAIL": "fsage@localhost",
    "GIT_COMMITTER_NAME": "fsage",
    "GIT_COMMITTER_EMAIL": "fsage@localhost",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
}


def git(
    repo: Path, *args: str, stdin: bytes | None = None, env: dict[str, str] | None = None
) -> str:
    proc = subprocess.run(
        ["git", "-C", str(repo), *args],
        input=stdin,
        capture_output=True,
        check=False,
        env={**os.environ, **GIT_ENV, **(env or {})},
    )
    if proc.returncode != 0:
        sys.exit(f"git {args[0]} failed: {proc.stderr.decode(errors='replace').strip()}")
    return proc.stdout.decode()


def fsage(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fsage", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )


# ---------------------------------------------------------------------- build


def released_versions(package: str) -> list[Version]:
    """Final releases of ``package`` on the index, oldest first (`pip index versions`)."""
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "index", "versions", package],
        capture_output=True,
        text=True,
        check=False,
    )
    m = re.search(r"Available versions:\s*(.*)", proc.stdout)
    if proc.returncode != 0 or not m:
        sys.exit(f"pip index versions {package} failed: {proc.stderr.strip()[-300:]}")
    out = []
    for text in m.group(1).split(","):
        try:
            v = Version(text.strip())
        except InvalidVersion:
            continue
        if not v.is_prerelease and not v.is_devrelease:
            out.append(v)
    return sorted(out)


def wheel_of(package: str, version: Version, wheels: Path) -> Path | None:
    """The release's pure-Python wheel, downloaded into ``wheels`` unless already there."""

    def find() -> Path | None:
        norm = re.sub(r"[-_.]+", "_", package).lower()
        for w in wheels.glob("*.whl"):
            name, ver = w.name.split("-")[:2]
            if re.sub(r"[-_.]+", "_", name).lower() == norm and Version(ver) == version:
                return w
        return None

    found = find()
    if found is not None:
        return found
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:",
         "--python-version", "3.11", "--implementation", "py", "-d", str(wheels),
         f"{package}=={version}"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        print(f"  {package} {version}: no pure-Python wheel, skipped", file=sys.stderr)
        return None
    return find()


def unpack(wheel: Path, tree: Path) -> None:
    """Replace the files of ``tree`` (all but .git) with the wheel's, executable bits kept."""
    for child in tree.iterdir():
        if child.name == ".git":
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            parts = info.filename.split("/")
            if info.filename.startswith("/") or ".." in parts or ".git" in parts:
                continue
            dest = tree / info.filename
            if info.is_dir():
                dest.mkdir(parents=True, exist_ok=True)
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, open(dest, "wb") as out:
                shutil.copyfileobj(src, out)
            if (info.external_attr >> 16) & stat.S_IXUSR:
                dest.chmod(0o755)


def build(package: str, start: str | None, count: int, cache: Path) -> Path:
    """``cache/PACKAGE/repo``: one commit per release from ``start``, ``count`` releases."""
    versions = released_versions(package)
    if start is not None:
        versions = [v for v in versions if v >= Version(start)]
    base = cache / package
    wheels = base / "wheels"
    repo = base / "repo"
    wheels.mkdir(parents=True, exist_ok=True)
    if repo.exists():
        shutil.rmtree(repo)
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    done = 0
    t0 = time.perf_counter()
    for v in versions:
        if done == count:
            break
        wheel = wheel_of(package, v, wheels)
        if wheel is None:
            continue
        unpack(wheel, repo)
        git(repo, "add", "-A")
        # Fixed dates: the same releases give the same commit ids.
        date = f"@{1_600_000_000 + done * 86400} +0000"
        env = {"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date}
        git(repo, "commit", "-q", "--allow-empty", "-m", f"{package} {v}", env=env)
        done += 1
        print(f"  {done:3d} {package} {v} ({time.perf_counter() - t0:.0f} s)", flush=True)
    # The checkout of the last release is not needed: the workload reads the history.
    git(repo, "gc", "-q")
    if done < count:
        print(f"only {done} releases with wheels (asked for {count})", file=sys.stderr)
    print(f"{repo}: {done} commits, releases {package} {versions[0]}..", flush=True)
    return repo


# ---------------------------------------------------------------------- age


def run(argv: list[str]) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.exit(f"{argv[0]} failed: {proc.stderr.strip()[-500:]}")
    return proc.stdout


def age(repo: Path, image: Path, size: str, trees: int, every: int, steps: int | None,
        offset: int, snapshot_steps: bool) -> None:  # fmt: skip
    ops = image.with_suffix(".ops.jsonl.gz")
    args = ["workload", "git", str(repo), "--trees", str(trees), "--every", str(every),
            "--offset", str(offset), "-o", str(ops), "--format", "json"]  # fmt: skip
    if steps is not None:
        args += ["--steps", str(steps)]
    t0 = time.perf_counter()
    p = fsage(*args)
    if p.returncode != 0:
        sys.exit(p.stderr.strip())
    made = json.loads(p.stdout)
    nsteps = made["header"]["params"]["steps"]
    print(f"stream {ops}: {made['ops']} ops, {made['bytes_written'] / 2**20:,.0f} MiB, "
          f"{nsteps} steps ({time.perf_counter() - t0:.1f} s)")  # fmt: skip
    run(["truncate", "-s", "0", str(image)])
    run(["truncate", "-s", size, str(image)])
    run(["mkfs.ext4", "-q", "-F", "-b", "4096", "-L", "git-aged", str(image)])
    for leftover in (image.with_name(image.name + ".fsage-age"),):
        if leftover.exists():
            leftover.unlink()
    db = image.with_suffix(".db")
    if db.exists():
        db.unlink()
    # With --snapshot-steps, the layout after every pull (the stream's snapshot markers).
    recorded = ["--db", str(db), "--name", image.stem] if snapshot_steps else []
    t0 = time.perf_counter()
    p = fsage("age", str(image), "--ops", str(ops), "--mount", *recorded)
    if p.returncode != 0:
        sys.exit(f"fsage age failed: {p.stderr.strip()}")
    print(f"aged {image} in {time.perf_counter() - t0:.0f} s")
    fsck = subprocess.run(["e2fsck", "-fn", str(image)], capture_output=True, text=True)
    print(f"e2fsck -fn: exit {fsck.returncode}" + ("" if fsck.returncode else " (clean)"))
    p = fsage("snapshot", str(image), "--db", str(db), "--name", image.stem)
    if p.returncode != 0:
        sys.exit(f"fsage snapshot failed: {p.stderr.strip()}")
    print(fsage("analyze", "--db", str(db), "--fs", image.stem).stdout)
    print(run(["e2freefrag", str(image)]))
    print(f"scan: python3 -m fsage bench {image} --suite scan --repeat 5")


# ---------------------------------------------------------------------- convert


def synthetic_repo(path: Path, commits: int, files: int, seed: int = 1) -> None:
    """A repository of ``commits`` commits over ``files`` paths, made with git fast-import
    (a few adds, changes and deletes per commit), to time the conversion."""
    import random

    rng = random.Random(seed)
    git(path.parent, "init", "-q", "-b", "main", str(path))
    live: list[str] = []
    stream: list[bytes] = []
    n = 0
    for c in range(commits):
        msg = f"commit {c}".encode()
        stream.append(b"commit refs/heads/main\n")
        stream.append(f"committer fsage <f@l> {1_600_000_000 + c} +0000\n".encode())
        stream.append(b"data %d\n%s\n" % (len(msg), msg))
        todo = files // 4 if c == 0 else rng.randint(1, 12)
        for _ in range(todo):
            r = rng.random()
            if (r < 0.5 or len(live) < 10) and len(live) < files:
                name = f"d{rng.randint(0, 40)}/s{rng.randint(0, 5)}/f{n}.txt"
                n += 1
                live.append(name)
            elif r < 0.85:
                name = rng.choice(live)
            else:
                name = live.pop(rng.randrange(len(live)))
                stream.append(f"D {name}\n".encode())
                continue
            body = rng.randbytes(rng.choice([100, 2000, 9000, 40000]))
            stream.append(f"M 100644 inline {name}\ndata {len(body)}\n".encode() + body + b"\n")
    git(path, "fast-import", "--quiet", stdin=b"".join(stream))


def convert(commits: int, files: int, workdir: Path, trees: int) -> None:
    with tempfile.TemporaryDirectory(prefix="gitwork-convert-", dir=workdir) as tmp:
        repo = Path(tmp) / "repo"
        t0 = time.perf_counter()
        synthetic_repo(repo, commits, files)
        print(f"synthetic repository: {commits} commits in {time.perf_counter() - t0:.1f} s")
        t0 = time.perf_counter()
        _header, steps = git_workload(repo, trees=trees)
        took = time.perf_counter() - t0
        ops = sum(len(s) for s in steps)
        print(f"git_workload(trees={trees}): {len(steps)} steps, {ops:,} ops in {took:.2f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="a repository of a package's releases")
    b.add_argument("--package", required=True)
    b.add_argument("--from", dest="start", help="first release (default: the oldest)")
    b.add_argument("--count", type=int, default=80)
    b.add_argument("--cache", type=Path, required=True)
    a = sub.add_parser("age", help="age an ext4 image by pulling a repository")
    a.add_argument("--repo", type=Path, required=True)
    a.add_argument("--image", type=Path, required=True)
    a.add_argument("--size", default="512M")
    a.add_argument("--trees", type=int, default=5)
    a.add_argument("--every", type=int, default=1)
    a.add_argument("--steps", type=int)
    a.add_argument("--offset", type=int, default=0)
    a.add_argument("--snapshot-steps", action="store_true", help="snapshot after every pull")
    c = sub.add_parser("convert", help="time the conversion of a synthetic history")
    c.add_argument("--commits", type=int, default=1000)
    c.add_argument("--files", type=int, default=3000)
    c.add_argument("--trees", type=int, default=1)
    c.add_argument("--workdir", type=Path, default=Path("/tmp"))
    args = ap.parse_args()
    if args.cmd == "build":
        build(args.package, args.start, args.count, args.cache)
    elif args.cmd == "age":
        age(
            args.repo,
            args.image,
            args.size,
            args.trees,
            args.every,
            args.steps,
            args.offset,
            args.snapshot_steps,
        )
    else:
        convert(args.commits, args.files, args.workdir, args.trees)


if __name__ == "__main__":
    main()
