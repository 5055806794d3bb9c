"""A git-aged file system, as a developer's disk ages: one repository's history checked out
commit after commit in several work trees in turn (git writes each file whole, deletes and
rewrites what a commit changed, so a directory's files end up scattered and the free space in
small holes). The repository is generated here (seeded source-like trees); bench/match_git.py
also builds one from a real project's released versions."""

from __future__ import annotations

import os
import random
import subprocess
from pathlib import Path

_GIT_ENV = {
    "GIT_AUTHOR_NAME": "fsage",
    "GIT_AUTHOR_EMAIL": "fsage@localhost",
    "GIT_COMMITTER_NAME": "fsage",
    "GIT_COMMITTER_EMAIL": "fsage@localhost",
    "GIT_AUTHOR_DATE": "2020-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2020-01-01T00:00:00Z",
}


def git(*args: str, cwd: Path | None = None) -> str:
    env = {**os.environ, **_GIT_ENV}
    proc = subprocess.run(
        ["git", "-c", "init.defaultBranch=main", "-c", "gc.auto=0", *args],
        cwd=cwd, env=env, capture_output=True, text=True,
    )  # fmt: skip
    if proc.returncode:
        raise RuntimeError(f"git {' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout


def _size(rng: random.Random) -> int:
    """Source files: lognormal around 4 KiB, a few up to a few hundred KiB."""
    return min(int(rng.lognormvariate(8.3, 1.3)), 400_000)


def generated_repo(repo: Path, *, commits: int, files: int, seed: int) -> list[str]:
    """A repository of ``commits`` commits over a tree of about ``files`` files in nested
    directories; each commit rewrites a tenth of the files, adds and deletes a few. Returns
    the commit ids, oldest first."""
    rng = random.Random(seed)
    repo.mkdir(parents=True)
    git("init", "-q", str(repo))
    dirs = [f"pkg{d}/sub{s}" for d in range(max(1, files // 120)) for s in range(4)]
    tree: dict[str, int] = {}
    for i in range(files):
        tree[f"{rng.choice(dirs)}/m{i:05d}.py"] = _size(rng)
    serial = files
    ids = []
    changed = set(tree)
    for c in range(commits):
        if c:
            names = sorted(tree)
            changed = set(rng.sample(names, len(names) // 10))
            for name in changed:
                tree[name] = max(1, int(tree[name] * rng.uniform(0.8, 1.3)))
            for name in rng.sample(names, len(names) // 50):
                del tree[name]
                changed.discard(name)
                (repo / name).unlink()
            for _ in range(len(names) // 40):
                name = f"{rng.choice(dirs)}/m{serial:05d}.py"
                tree[name] = _size(rng)
                changed.add(name)
                serial += 1
        for name in changed:
            p = repo / name
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes((f"# {name} v{c}\n".encode() * (tree[name] // 16 + 1))[: tree[name]])
        git("add", "-A", cwd=repo)
        git("commit", "-q", "-m", f"v{c}", cwd=repo)
        ids.append(git("rev-parse", "HEAD", cwd=repo).strip())
    return ids


def age_with_history(root: Path, repo: Path, ids: list[str], *, trees: int) -> None:
    """Clone ``repo`` into ``root`` and check its history out in ``trees`` work trees, each
    commit in every tree in turn (interleaved), ending at the last commit."""
    clone = root / "repo"
    git("clone", "-q", "--no-checkout", "--no-hardlinks", str(repo), str(clone))
    for t in range(trees):
        git("worktree", "add", "-q", "--detach", str(root / f"w{t}"), ids[0], cwd=clone)
    for cid in ids[1:]:
        for t in range(trees):
            git("checkout", "-q", "--detach", cid, cwd=root / f"w{t}")
