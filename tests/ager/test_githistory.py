"""`fsage workload git`: the stream leaves what `git checkout` leaves in real work trees.

The oracle is git itself: a work tree made with `git worktree add` and moved with
`git checkout` to the commit each of the stream's trees has at every step, compared name by
name (type, size, permission bits, symlink target).
"""

from __future__ import annotations

import os
import random
import shutil
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from fsage.ager.githistory import GitHistoryError, git_stream, git_workload
from fsage.ager.posix import PosixExecutor
from fsage.cli import main
from fsage.workload import read_workload

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")

GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.org",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.org",
    "GIT_AUTHOR_DATE": "2020-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2020-01-01T00:00:00Z",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
}


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, **GIT_ENV}
    return subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True, env=env
    ).stdout


@pytest.fixture(autouse=True)
def umask_022() -> Iterator[None]:
    # git and the executor both create under the umask: give them the usual one.
    old = os.umask(0o022)
    yield
    os.umask(old)


def _write(path: Path, rng: random.Random, size: int | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    n = rng.choice([0, 1, 100, 4095, 4096, 5000, 70000]) if size is None else size
    path.write_bytes(rng.randbytes(n))


def make_repo(repo: Path, seed: int = 3) -> list[str]:
    """A history with every case a checkout meets; returns its first-parent commits."""
    rng = random.Random(seed)
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")

    def commit(msg: str) -> None:
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "--allow-empty", "-m", msg)

    for name in ("src/a.py", "src/b.py", "docs/x.md", "run.sh", "lib/sub/deep.txt", "lib/k"):
        _write(repo / name, rng)
    (repo / "empty").write_bytes(b"")
    commit("first")
    _write(repo / "src/a.py", rng, 3000)  # modified
    _write(repo / "bin/tool", rng, 200)
    (repo / "bin/tool").chmod(0o755)  # executable
    os.symlink("src/a.py", repo / "link")  # symlink
    os.symlink("../nowhere/at/all", repo / "docs/dangling")
    commit("modify, executable, symlinks")
    (repo / "src/b.py").rename(repo / "src/c.py")  # rename
    (repo / "lib/sub/deep.txt").unlink()  # lib/sub left empty: git removes it
    (repo / "lib/k").unlink()
    commit("rename, a directory emptied")
    (repo / "docs/x.md").unlink()  # a file replaced by a directory
    _write(repo / "docs/x.md/inner", rng, 10)
    (repo / "run.sh").chmod(0o755)  # only the mode changes
    commit("file to directory, mode change")
    shutil.rmtree(repo / "docs/x.md")  # a directory replaced by a file
    _write(repo / "docs/x.md", rng, 9000)
    (repo / "link").unlink()  # a symlink replaced by a file
    _write(repo / "link", rng, 33)
    (repo / "bin/tool").unlink()  # a file replaced by a symlink
    os.symlink("../run.sh", repo / "bin/tool")
    commit("directory to file, type changes")
    # a side branch merged back: first parent follows main only
    git(repo, "checkout", "-q", "-b", "side")
    _write(repo / "side/only.txt", rng)
    commit("side")
    git(repo, "checkout", "-q", "main")
    _write(repo / "main.txt", rng)
    commit("main moves on")
    git(repo, "merge", "-q", "--no-ff", "-m", "merge side", "side")
    names = ["src/a.py", "src/c.py", "docs/x.md", "run.sh", "empty", "main.txt"]
    for i in range(8):  # random churn
        for _ in range(rng.randint(1, 5)):
            kind = rng.random()
            if kind < 0.4:
                name = f"r{rng.randint(0, 3)}/f{rng.randint(0, 20)}.txt"
                _write(repo / name, rng)
                names.append(name)
            elif kind < 0.7:
                name = rng.choice(names)
                if (repo / name).is_file() and not (repo / name).is_symlink():
                    _write(repo / name, rng)
            else:
                name = rng.choice(names)
                if (repo / name).is_file() and not (repo / name).is_symlink():
                    (repo / name).unlink()
                    parent = (repo / name).parent
                    if parent != repo and not any(parent.iterdir()):
                        parent.rmdir()
        commit(f"churn {i}")
    return git(repo, "rev-list", "--first-parent", "--reverse", "HEAD").split()


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    old = os.umask(0o022)
    try:
        path = tmp_path_factory.mktemp("gitrepo") / "repo"
        return path, make_repo(path)
    finally:
        os.umask(old)


def listing(root: Path) -> dict[str, tuple[str, int, int, str]]:
    """{path: (type, size, permission bits, symlink target)} below ``root`` (sizes of files
    only), without git's own '.git' file."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            if rel == ".git":
                continue
            st = p.lstat()
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("l", 0, 0, os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("d", 0, stat.S_IMODE(st.st_mode), "")
            else:
                out[rel] = ("f", st.st_size, stat.S_IMODE(st.st_mode), "")
    return out


class GitTrees:
    """Real work trees of ``repo``, moved with git checkout."""

    def __init__(self, repo: Path, where: Path) -> None:
        self.repo = repo
        self.where = where
        self.made: set[int] = set()

    def at(self, tree: int, commit: str) -> Path:
        path = self.where / f"wt{tree}"
        if tree not in self.made:
            git(self.repo, "worktree", "add", "-q", "--detach", str(path), commit)
            self.made.add(tree)
        else:
            git(path, "checkout", "-q", "--detach", commit)
        return path


def expected_position(step: int, tree: int, every: int, offset: int, commits: int) -> int:
    return min(step * every - tree * offset, commits - 1)


@pytest.mark.parametrize(
    ("trees", "every", "offset", "first_parent"),
    [(1, 1, 0, True), (3, 2, 1, True), (2, 3, 4, True), (2, 1, 0, False)],
)
def test_every_step_leaves_what_git_checkout_leaves(
    repo: tuple[Path, list[str]], tmp_path: Path, trees: int, every: int, offset: int,
    first_parent: bool,
) -> None:  # fmt: skip
    path, commits = repo
    if not first_parent:  # every commit, the side branch's too
        commits = git(path, "rev-list", "--topo-order", "--reverse", "HEAD").split()
        assert len(commits) == len(repo[1]) + 1
    header, steps = git_workload(
        path, trees=trees, every=every, offset=offset, first_parent=first_parent
    )
    assert header.params["commits"] == len(commits)
    target = tmp_path / "target"
    target.mkdir()
    oracle = GitTrees(path, tmp_path / "git")
    try:
        with PosixExecutor(target) as ex:
            for s, ops in enumerate(steps):
                for op in ops:
                    ex.apply(op)
                for i in range(trees):
                    pos = expected_position(s, i, every, offset, len(commits))
                    if pos < 0:
                        assert not (target / f"tree{i}").exists()
                        continue
                    want = listing(oracle.at(i, commits[pos]))
                    assert listing(target / f"tree{i}") == want, (s, i, pos)
        # the last step brings every tree to the last commit
        assert all(
            expected_position(len(steps) - 1, i, every, offset, len(commits)) == len(commits) - 1
            for i in range(trees)
        )
    finally:
        git(path, "worktree", "prune")


def test_changed_files_are_unlinked_and_created_in_path_order(
    repo: tuple[Path, list[str]],
) -> None:
    path, _commits = repo
    _header, steps = git_workload(path, steps=3)
    kinds = [(op.op, op.path) for op in steps[1]]
    # src/a.py changed: a new inode, not an overwrite
    i = kinds.index(("delete", "tree0/src/a.py"))
    assert kinds[i + 1] == ("create", "tree0/src/a.py")
    creates = [p for k, p in kinds if k in ("create", "symlink")]
    assert creates == sorted(creates, key=lambda p: p.encode())
    assert not {k for k, _ in kinds} & {"overwrite", "append", "rename", "truncate"}
    # step 2 empties lib/sub and then lib: both removed, deepest first, before any write
    kinds2 = [(op.op, op.path) for op in steps[2]]
    assert kinds2.index(("delete", "tree0/lib/sub")) < kinds2.index(("delete", "tree0/lib"))
    first_write = min(i for i, (k, _) in enumerate(kinds2) if k == "create")
    assert kinds2.index(("delete", "tree0/lib")) < first_write


def test_sizes_and_modes_are_gits(repo: tuple[Path, list[str]]) -> None:
    path, commits = repo
    _header, steps = git_workload(path, steps=2)
    made = {op.path: op for s in steps for op in s if op.op in ("create", "symlink")}
    setattrs = {op.path: op.mode for s in steps for op in s if op.op == "setattr"}
    for line in git(path, "ls-tree", "-r", "-l", commits[1]).splitlines():
        meta, name = line.split("\t")
        mode, _kind, oid, size = meta.split()
        op = made[f"tree0/{name}"]
        assert op.size == int(size), name
        if mode == "120000":
            assert op.op == "symlink" and op.dest == git(path, "cat-file", "blob", oid), name
        assert setattrs.get(f"tree0/{name}") == (0o755 if mode == "100755" else None), name


def test_stream_is_deterministic_with_a_snapshot_after_every_step(
    repo: tuple[Path, list[str]], tmp_path: Path
) -> None:
    path, commits = repo
    r = CliRunner()
    outs = []
    for name in ("a.jsonl.gz", "b.jsonl.gz"):
        res = r.invoke(
            main, ["workload", "git", str(path), "--trees", "2", "--every", "2", "-o",
                   str(tmp_path / name)],
        )  # fmt: skip
        assert res.exit_code == 0, res.output
        outs.append((tmp_path / name).read_bytes())
    assert outs[0] == outs[1]
    header, ops = read_workload(tmp_path / "a.jsonl.gz")
    marks = [op for op in ops if op.op == "snapshot"]
    _h, steps = git_workload(path, trees=2, every=2)
    assert len(marks) == len(steps) == -(-(len(commits) - 1) // 2) + 1
    assert header.generator == "git" and header.params["head"] == commits[-1]
    _h2, stream = git_stream(path, trees=2, every=2)
    assert [op for op in stream if op.op != "snapshot"] == [op for s in steps for op in s]


def test_age_cli_runs_the_stream_on_a_directory(
    repo: tuple[Path, list[str]], tmp_path: Path
) -> None:
    path, commits = repo
    r = CliRunner()
    ops = tmp_path / "ops.jsonl"
    res = r.invoke(main, ["workload", "git", str(path), "--trees", "2", "-o", str(ops)])
    assert res.exit_code == 0, res.output
    target = tmp_path / "t"
    target.mkdir()
    res = r.invoke(main, ["age", str(target), "--ops", str(ops)])
    assert res.exit_code == 0, res.output
    try:
        want = listing(GitTrees(path, tmp_path / "git").at(0, commits[-1]))
    finally:
        git(path, "worktree", "prune")
    assert listing(target / "tree0") == want
    assert listing(target / "tree1") == want


def _one_line_error(args: list[str], output: Path) -> str:
    res = CliRunner().invoke(main, args)
    assert res.exit_code != 0
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.output, res.output
    assert not output.exists()
    return lines[0]


def test_bad_input_is_refused_in_one_line(repo: tuple[Path, list[str]], tmp_path: Path) -> None:
    path, _commits = repo
    out = tmp_path / "o.jsonl"
    plain = tmp_path / "plain"
    plain.mkdir()
    assert "not a git repository" in _one_line_error(
        ["workload", "git", str(plain), "-o", str(out)], out
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    git(empty, "init", "-q")
    assert "no commits" in _one_line_error(["workload", "git", str(empty), "-o", str(out)], out)
    shallow = tmp_path / "shallow"
    git(tmp_path, "clone", "-q", "--depth", "1", f"file://{path}", str(shallow))
    assert "shallow" in _one_line_error(["workload", "git", str(shallow), "-o", str(out)], out)
    for opt, value in (("--every", "0"), ("--trees", "0"), ("--steps", "0")):
        line = _one_line_error(["workload", "git", str(path), opt, value, "-o", str(out)], out)
        assert opt in line
    line = _one_line_error(["workload", "git", str(path), "--rev", "nope", "-o", str(out)], out)
    assert "not a commit" in line
    with pytest.raises(GitHistoryError):
        git_workload(tmp_path / "missing")
