"""The git workload on an ext4 image, through the kernel and through libext2fs: e2fsck finds
it clean and the trees are git's."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from fsage.ager.images import loop_mount, make_image
from fsage.cli import main

from .helpers import fsck_clean
from .test_githistory import GitTrees, git, listing, make_repo

pytestmark = [
    pytest.mark.needs_root,
    pytest.mark.skipif(shutil.which("git") is None, reason="needs git"),
]


@pytest.mark.parametrize("how", ["--mount", "--offline"])
def test_git_stream_on_an_ext4_image(tmp_path: Path, how: str) -> None:
    old = os.umask(0o022)
    try:
        repo = tmp_path / "repo"
        commits = make_repo(repo, seed=11)
        ops = tmp_path / "ops.jsonl.gz"
        r = CliRunner()
        args = ["workload", "git", str(repo), "--trees", "3", "--every", "2", "--offset", "1"]
        res = r.invoke(main, [*args, "-o", str(ops)])
        assert res.exit_code == 0, res.output
        img = make_image(tmp_path / "e.img", "ext4", 64 << 20)
        res = r.invoke(main, ["age", str(img), "--ops", str(ops), how])
        assert res.exit_code == 0, res.output
        fsck_clean(img)
        want = listing(GitTrees(repo, tmp_path / "git").at(0, commits[-1]))
        with loop_mount(img) as mnt:
            for i in range(3):
                assert listing(mnt / f"tree{i}") == want, i
    finally:
        os.umask(old)
        if (tmp_path / "repo").exists():
            git(tmp_path / "repo", "worktree", "prune")
