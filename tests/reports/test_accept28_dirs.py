"""A tree of many top-level directories (as /usr/share/doc has hundreds) keeps the report
readable: its directory tables list the root and the subtrees holding the most data, chosen
from the sizes of the files written into the image, and say what they leave out."""

from __future__ import annotations

import html as htmllib
import re
from pathlib import Path

from click.testing import CliRunner
from conftest import require_tools
from images import make_ext_image

from fsage.cli import main

BS = 4096
MAX_DIR_ROWS = 40  # the subtrees a directory table lists
DIRS = MAX_DIR_ROWS + 20


def test_directory_tables_keep_the_largest_subtrees(tmp_path: Path) -> None:
    require_tools("mke2fs")
    tree = tmp_path / "tree"
    blocks = {}
    for i in range(DIRS):
        d = tree / f"d{(i * 37) % DIRS:02d}"  # sizes not in name order
        d.mkdir(parents=True)
        n = i + 2
        (d / "f").write_bytes(bytes([i]) * (n * BS))
        blocks[d.name] = n
    img = make_ext_image(tmp_path, "ext4", block_size=BS, tree=tree, size="32M")
    db, page = tmp_path / "d.db", tmp_path / "r.html"
    r = CliRunner()
    for args in (
        ["snapshot", str(img), "--db", str(db)],
        ["report", "--db", str(db), "-o", str(page)],
    ):
        out = r.invoke(main, args)
        assert out.exit_code == 0, out.output
    largest = set(sorted(blocks, key=lambda k: -blocks[k])[:MAX_DIR_ROWS])
    text = page.read_text(encoding="utf-8")
    found = 0
    for table in re.findall(r"<table.*?</table>", text, re.S):
        cap = re.search(r"<caption>(.*?)</caption>", table, re.S)
        if not cap or "director" not in cap.group(1):
            continue
        found += 1
        caption = htmllib.unescape(cap.group(1))
        assert f"the {MAX_DIR_ROWS} of {DIRS + 1} subtrees" in caption  # and lost+found
        paths = [htmllib.unescape(p) for p in re.findall(r"<tr><td>(.*?)</td>", table)]
        assert paths[0] == "/"
        assert {p.lstrip("/") for p in paths[1:]} == largest
    assert found == 2  # the layout score and the locality of each subtree
