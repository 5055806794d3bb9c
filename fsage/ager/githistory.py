"""A git repository's history as a Workload: work trees that pull commit after commit.

Conway et al. (FAST'17) age a file system by pulling a real project's history into a work tree
and scanning it after every pull. ``git_workload`` turns a repository's history into the op
stream such pulls leave on disk, for ``trees`` work trees (``tree0`` .. ``treeN-1``) pulled
in turn, so their files interleave on the disk as several checkouts of one project do.

What a checkout does on disk (git's unpack-trees and entry code): first every path that
leaves the tree is unlinked, in path order, each directory it empties removed as the walk
leaves it; then every path that is new or changed is written in path order, missing parent
directories made first. A changed file is never rewritten in place: git unlinks it and
creates a new inode, so here it is a ``delete`` then a ``create`` of the blob's size. Renames
are such a delete and create (git does not rename on checkout). Executable files get a
``setattr`` to 0755 (git creates them 0777 less the umask), symlinks are ``symlink`` ops with
their target, a submodule is the empty directory git leaves for it.

The repository is read with git plumbing in four subprocess calls whatever its length:
``rev-list`` for the commits, one ``diff-tree --stdin`` for every commit's changes against the
one before it, and ``cat-file --batch-check`` / ``--batch`` for blob sizes and symlink targets.
"""

from __future__ import annotations

import itertools
import os
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fsage.errors import WorkloadError
from fsage.workload import SYMLINK_MAX, Op, WorkloadHeader

GENERATOR = "git"
EXEC_MODE = 0o755

# git's tree-entry modes.
_FILE = 0o100644
_EXEC = 0o100755
_LINK = 0o120000
_GITLINK = 0o160000
_BLOB_MODES = (_FILE, _EXEC, _LINK)


class GitHistoryError(WorkloadError):
    """The repository cannot be read as a history (not a repository, no commits, shallow)."""


@dataclass(frozen=True)
class Entry:
    """One path of a commit's tree: its git mode and object id."""

    mode: int
    oid: str


@dataclass
class History:
    """The commits to check out, in order, and what each changes against the one before."""

    commits: list[str]
    #: per commit: path -> its entry after the commit, or None where the commit deletes it.
    deltas: list[dict[str, Entry | None]]
    sizes: dict[str, int]
    targets: dict[str, str]
    head: str


# ---------------------------------------------------------------------- reading git


def _git(repo: Path, args: Sequence[str], stdin: bytes | None = None) -> bytes:
    try:
        proc = subprocess.run(
            ["git", "-C", str(repo), *args],
            input=stdin,
            capture_output=True,
            check=False,
            env={**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "LC_ALL": "C"},
        )
    except FileNotFoundError:
        raise GitHistoryError("git is not installed (it is needed to read a repository)") from None
    if proc.returncode != 0:
        lines = proc.stderr.decode("utf-8", "replace").strip().splitlines()
        why = lines[-1] if lines else f"exit status {proc.returncode}"
        raise GitHistoryError(f"git {args[0]} failed in {repo}: {why}")
    return proc.stdout


def _check_repo(repo: Path, rev: str) -> str:
    """The commit ``rev`` names, after refusing what is not a complete repository."""
    if not repo.is_dir():
        raise GitHistoryError(f"{repo} is not a directory")
    probe = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--is-shallow-repository"],
        capture_output=True,
        check=False,
    )
    if probe.returncode != 0:
        raise GitHistoryError(f"{repo} is not a git repository")
    if probe.stdout.strip() == b"true":
        raise GitHistoryError(
            f"{repo} is a shallow clone: its history is cut off (git fetch --unshallow first)"
        )
    head = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
        capture_output=True,
        check=False,
    )
    if head.returncode != 0:
        if rev == "HEAD":
            raise GitHistoryError(f"{repo} has no commits")
        raise GitHistoryError(f"{rev!r} is not a commit of {repo}")
    return head.stdout.decode().strip()


def _decode(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def read_history(repo: Path, *, rev: str = "HEAD", first_parent: bool = True) -> History:
    """The commits of ``rev``'s history, oldest first (first parents only, or every commit in
    topological order), with each commit's changes against the commit before it in that
    order."""
    head = _check_repo(repo, rev)
    walk = ["rev-list", "--reverse", "--first-parent" if first_parent else "--topo-order", head]
    commits = _git(repo, walk).decode().split()
    # One diff-tree for all: "commit previous" diffs commit against previous as its parent.
    lines = [commits[0]] + [f"{c} {p}" for p, c in itertools.pairwise(commits)]
    raw = _git(
        repo,
        ["diff-tree", "--stdin", "--root", "--always", "-r", "--raw", "-z", "--no-renames"],
        ("\n".join(lines) + "\n").encode(),
    )
    deltas: list[dict[str, Entry | None]] = []
    blobs: set[str] = set()
    links: set[str] = set()
    tokens = raw.split(b"\0")
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        i += 1
        if not tok:
            continue
        if not tok.startswith(b":"):  # the header of the next commit's diff
            deltas.append({})
            continue
        # ":oldmode newmode oldoid newoid status", then the path
        fields = tok[1:].split()
        path = _decode(tokens[i])
        i += 1
        mode = int(fields[1], 8)
        if fields[4][:1] == b"D" or mode == 0:
            deltas[-1][path] = None
            continue
        oid = fields[3].decode()
        if mode not in _BLOB_MODES and mode != _GITLINK:
            raise GitHistoryError(f"{path!r}: unknown git mode {mode:o}")
        deltas[-1][path] = Entry(mode, oid)
        if mode in _BLOB_MODES:
            blobs.add(oid)
        if mode == _LINK:
            links.add(oid)
    if len(deltas) != len(commits):
        raise GitHistoryError(f"git diff-tree gave {len(deltas)} diffs for {len(commits)} commits")
    return History(commits, deltas, _blob_sizes(repo, blobs), _link_targets(repo, links), head)


def _blob_sizes(repo: Path, oids: set[str]) -> dict[str, int]:
    if not oids:
        return {}
    order = sorted(oids)
    out = _git(
        repo,
        ["cat-file", "--batch-check=%(objectname) %(objectsize)"],
        ("\n".join(order) + "\n").encode(),
    )
    sizes: dict[str, int] = {}
    for line in out.decode().splitlines():
        oid, _, size = line.partition(" ")
        if not size.isdigit():
            raise GitHistoryError(f"blob {oid} is missing from the repository")
        sizes[oid] = int(size)
    return sizes


def _link_targets(repo: Path, oids: set[str]) -> dict[str, str]:
    """Symlink blobs' contents (their targets), read in one ``cat-file --batch``."""
    if not oids:
        return {}
    order = sorted(oids)
    out = _git(repo, ["cat-file", "--batch"], ("\n".join(order) + "\n").encode())
    targets: dict[str, str] = {}
    pos = 0
    for oid in order:
        end = out.index(b"\n", pos)
        size = int(out[pos:end].split()[2])
        targets[oid] = _decode(out[end + 1 : end + 1 + size])
        pos = end + 1 + size + 1  # the content, then a newline
    return targets


# ---------------------------------------------------------------------- checkouts


def _bkey(path: str) -> bytes:
    # git's index order: paths compared as bytes.
    return path.encode("utf-8", "surrogateescape")


def _parent(path: str) -> str:
    return path.rpartition("/")[0]


@dataclass
class WorkTree:
    """One work tree's files as git sees them, and the ops that bring it to another commit."""

    root: str
    history: History
    position: int = -1  # index of the commit checked out; -1: not cloned yet
    entries: dict[str, Entry] = field(default_factory=dict)
    #: directories (relative to the root, "" is the root) -> how many names they hold
    children: dict[str, int] = field(default_factory=dict)

    def _op_path(self, path: str) -> str:
        return f"{self.root}/{path}"

    def checkout(self, target: int) -> list[Op]:
        """The ops of a pull from the current commit to commit ``target``."""
        ops: list[Op] = []
        if target <= self.position:
            return ops
        if self.position < 0:
            ops.append(Op("mkdir", self.root))
            self.children[""] = 0
        changes: dict[str, Entry | None] = {}
        for delta in self.history.deltas[self.position + 1 : target + 1]:
            changes.update(delta)
        self.position = target
        removed = sorted(
            (p for p, e in changes.items() if e is None and p in self.entries), key=_bkey
        )
        updated = sorted(
            (p for p, e in changes.items() if e is not None and self.entries.get(p) != e),
            key=_bkey,
        )
        self._remove(removed, ops)
        for path in updated:
            new = changes[path]
            assert new is not None
            self._write(path, new, ops)
        return ops

    def _remove(self, paths: list[str], ops: list[Op]) -> None:
        # Directories a removal empties go as the walk leaves them, deepest first.
        current = ""
        for path in paths:
            parent = _parent(path)
            self._leave(current, parent, ops)
            current = parent
            ops.append(Op("delete", self._op_path(path)))
            old = self.entries.pop(path)
            if old.mode == _GITLINK:
                del self.children[path]
            self.children[parent] -= 1
        self._leave(current, "", ops)

    def _leave(self, current: str, nxt: str, ops: list[Op]) -> None:
        """Remove the empty directories of ``current`` that ``nxt`` is not inside."""
        while current and not (nxt == current or nxt.startswith(current + "/")):
            if self.children.get(current) == 0:
                ops.append(Op("delete", self._op_path(current)))
                del self.children[current]
                self.children[_parent(current)] -= 1
            current = _parent(current)

    def _make_parents(self, path: str, ops: list[Op]) -> None:
        missing: list[str] = []
        d = _parent(path)
        while d not in self.children:
            missing.append(d)
            d = _parent(d)
        for d in reversed(missing):
            ops.append(Op("mkdir", self._op_path(d)))
            self.children[d] = 0
            self.children[_parent(d)] += 1

    def _write(self, path: str, new: Entry, ops: list[Op]) -> None:
        old = self.entries.get(path)
        if old is not None:  # git unlinks the old file and writes a new one
            ops.append(Op("delete", self._op_path(path)))
            if old.mode == _GITLINK:
                del self.children[path]
        else:
            self._make_parents(path, ops)
        where = self._op_path(path)
        if new.mode == _LINK:
            target = self.history.targets[new.oid]
            if not target or len(_bkey(target)) > SYMLINK_MAX or "\0" in target:
                # git fails to make such a link too: the tree goes on without it
                if old is not None:
                    self.children[_parent(path)] -= 1
                    del self.entries[path]
                return
            ops.append(Op("symlink", where, size=len(_bkey(target)), dest=target))
        elif new.mode == _GITLINK:
            ops.append(Op("mkdir", where))
            self.children[path] = 0
        else:
            ops.append(Op("create", where, size=self.history.sizes[new.oid]))
            if new.mode == _EXEC:
                ops.append(Op("setattr", where, mode=EXEC_MODE))
        if old is None:
            self.children[_parent(path)] += 1
        self.entries[path] = new


# ---------------------------------------------------------------------- the workload


def _check_params(trees: int, every: int, steps: int | None, offset: int) -> None:
    if trees < 1:
        raise GitHistoryError(f"--trees must be at least 1 (got {trees})")
    if every < 1:
        raise GitHistoryError(f"--every must be at least 1 commit per pull (got {every})")
    if steps is not None and steps < 1:
        raise GitHistoryError(f"--steps must be at least 1 (got {steps})")
    if offset < 0:
        raise GitHistoryError(f"--offset must not be negative (got {offset})")


def step_positions(
    commits: int, *, trees: int, every: int, steps: int | None, offset: int
) -> list[list[int]]:
    """Per step, the commit index each tree is pulled to (-1: not cloned yet).

    Step s brings tree i to commit s*every - i*offset (the last commit at most): every tree
    pulls ``every`` commits per step, tree i ``i*offset`` commits behind tree 0. Without
    ``steps``, until every tree has the last commit."""
    last = commits - 1
    needed = -(-(last + (trees - 1) * offset) // every) + 1
    count = needed if steps is None else min(steps, needed)
    return [[min(s * every - i * offset, last) for i in range(trees)] for s in range(count)]


def _header(
    repo: Path, history: History, positions: list[list[int]], *, trees: int, every: int,
    offset: int, first_parent: bool, rev: str,
) -> WorkloadHeader:  # fmt: skip
    return WorkloadHeader(
        generator=GENERATOR,
        params={
            "repo": str(repo.resolve()),
            "rev": rev,
            "head": history.head,
            "commits": len(history.commits),
            "first_parent": first_parent,
            "trees": trees,
            "every": every,
            "offset": offset,
            "steps": len(positions),
            "last_commit": history.commits[max(positions[-1])] if positions else None,
        },
    )


def _steps(history: History, positions: list[list[int]], trees: int) -> Iterator[list[Op]]:
    work = [WorkTree(f"tree{i}", history) for i in range(trees)]
    for targets in positions:
        ops: list[Op] = []
        for tree, target in zip(work, targets, strict=True):
            if target >= 0:
                ops.extend(tree.checkout(target))
        yield ops


def git_workload(
    repo: Path, *, trees: int = 1, every: int = 1, steps: int | None = None, offset: int = 0,
    first_parent: bool = True, rev: str = "HEAD",
) -> tuple[WorkloadHeader, list[list[Op]]]:  # fmt: skip
    """The ops of each step of pulling ``repo``'s history into ``trees`` work trees.

    A step is one pull of ``every`` commits into every tree, tree0 first; the first step
    clones the first commit. ``steps`` stops early (default: until every tree has ``rev``).
    Paths are ``treeI/<path in the repository>``."""
    header, history, positions = _prepare(repo, trees, every, steps, offset, first_parent, rev)
    return header, list(_steps(history, positions, trees))


def _prepare(
    repo: Path, trees: int, every: int, steps: int | None, offset: int, first_parent: bool,
    rev: str,
) -> tuple[WorkloadHeader, History, list[list[int]]]:  # fmt: skip
    _check_params(trees, every, steps, offset)
    history = read_history(repo, rev=rev, first_parent=first_parent)
    positions = step_positions(
        len(history.commits), trees=trees, every=every, steps=steps, offset=offset
    )
    header = _header(
        repo, history, positions, trees=trees, every=every, offset=offset,
        first_parent=first_parent, rev=rev,
    )  # fmt: skip
    return header, history, positions


def git_stream(
    repo: Path,
    *,
    trees: int = 1,
    every: int = 1,
    steps: int | None = None,
    offset: int = 0,
    first_parent: bool = True,
    rev: str = "HEAD",
) -> tuple[WorkloadHeader, Iterator[Op]]:
    """The header, and the whole stream lazily: each step's ops, then a snapshot marker
    labelled with the step and the commit tree0 has."""
    header, history, positions = _prepare(repo, trees, every, steps, offset, first_parent, rev)

    def ops() -> Iterator[Op]:
        for s, step_ops in enumerate(_steps(history, positions, trees)):
            yield from step_ops
            at = history.commits[max(positions[s])][:12]
            yield Op("snapshot", label=f"git step {s}: {at}")

    return header, ops()
