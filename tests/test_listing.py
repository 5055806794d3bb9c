"""`fsage show` against a listing made the plain way, byte for byte: every path from
``derive_paths``, one Python sort of whole entries, and the generic table / CSV / JSON writers
of the CLI (``echo_table``, ``echo_csv``, ``json.dumps``) over one row per file.

Trees hold what breaks a shortcut: names that sort differently as paths than as names
(``a`` / ``a-x`` / ``a/b``), non-ASCII and non-UTF-8 names, control characters, hard links in
several directories, a file with more extents than the column-wise join handles, empty files,
an inode no directory names, and a second snapshot whose changes end versions of the first.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import random
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from fsage.cli import main
from fsage.cli.common import echo_csv
from fsage.db.store import Store
from fsage.errors import StoreError
from fsage.layout import Layout
from fsage.listing import file_listing, listing, show_files
from fsage.text import shown
from tests.analyzer.layouts import layout as hand_layout
from tests.analyzer.layouts import table
from tests.conftest import require_tools

NAMES = ["a", "a-x", "a.b", "Z", "z", "é", "ü-ñ", "sp ace ", "tab\there", "new\nline", "ab"]


def make_tree(root: Path, seed: int, files: int = 60) -> None:
    """Directories and files whose path order differs from a walk by name, odd names, hard
    links, empty and sparse files; one file of 40 extents (holes between its chunks)."""
    rnd = random.Random(seed)
    dirs = [root]
    for name in NAMES:
        d = root / name
        d.mkdir()
        dirs.append(d)
        for sub in ("b", "a-x", "a"):
            (d / sub).mkdir()
            dirs.append(d / sub)
    deep = root / "a"
    for k in range(12):
        deep = deep / f"lvl{k}"
        deep.mkdir()
    dirs.append(deep)
    raw = os.fsencode(root) + b"/bad-\xff\xfe-name"
    with open(raw, "wb") as fh:  # not UTF-8: shown as \xNN, written back as the same bytes
        fh.write(b"x" * 5000)
    for i in range(files):
        d = dirs[rnd.randrange(len(dirs))]
        name = rnd.choice(NAMES) + f"{i}" if i % 3 else f"f{i:03d}"
        (d / name).write_bytes(rnd.randbytes(rnd.choice([0, 100, 5000, 40_000])))
    linked = root / "a" / "target"
    linked.write_bytes(rnd.randbytes(9000))
    os.link(linked, root / "z" / "b" / "hard")
    os.link(linked, root / "Z" / "hard")
    with open(root / "a-x" / "sparse", "wb") as fh:
        for k in range(40):
            fh.seek(k * 65536)
            fh.write(rnd.randbytes(4096))


def reference_entries(layout: Layout, prefix: str | None) -> list[dict[str, Any]]:
    """What ``fsage show`` lists, from every path of every inode."""
    paths = layout.paths()
    files = layout.files
    want = None
    if prefix is not None:
        parts = [c for c in prefix.strip("/").split("/") if c]
        want = "/" + "/".join(parts)
    out = []
    for i, ino in enumerate(files.ino.tolist()):
        names = paths.get(ino, [])
        if want is not None:
            if want != "/":
                names = [p for p in names if p == want or p.startswith(want + "/")]
            if not names:
                continue
        a, b = int(files.ext_off[i]), int(files.ext_off[i + 1])
        ext = [
            [int(files.ext_logical[k]), int(files.ext_physical[k]), int(files.ext_length[k])]
            for k in range(a, b)
        ]
        out.append(
            {
                "path": names[0] if names else None,
                "paths": names,
                "ino": ino,
                "mode": f"{int(files.mode[i]):o}",
                "size": int(files.size[i]),
                "blocks": sum(e[2] for e in ext),
                "extents": ext,
                "damaged": int(files.damaged[i]),
            }
        )
    out.sort(key=lambda e: (e["path"] is None, e["path"] or "", e["ino"]))
    return out


def reference_output(entries: list[dict[str, Any]], fmt: str) -> str:
    def ext(e: dict[str, Any]) -> str:
        return " ".join(f"{lo}:{ph}+{n}" for lo, ph, n in e["extents"])

    if fmt == "json":
        return json.dumps(entries, indent=2) + "\n"
    out = io.StringIO()  # text as written, before any encoding of stdout
    with contextlib.redirect_stdout(out):
        if fmt == "csv":
            echo_csv(
                ["path", "ino", "mode", "size", "blocks", "extents"],
                [[e["path"], e["ino"], e["mode"], e["size"], e["blocks"], ext(e)] for e in entries],
            )
        else:
            return plain_table(entries)
    return out.getvalue()


def plain_table(entries: list[dict[str, Any]]) -> str:
    """The text table: numbers right-aligned, the extents last and unpadded (their rule as
    long as their heading), the path column as wide as nine paths in ten (at least 40, at
    most the longest): a longer path pushes its row over."""
    heads = ["path", "ino", "size", "blocks", "extents (logical:physical+length)"]
    paths = [shown(e["path"]) if e["path"] is not None else "-" for e in entries]
    lengths = sorted(len(p) for p in paths)
    ninth = lengths[math.ceil(len(lengths) * 0.9) - 1]
    widths = [
        max(4, min(lengths[-1], max(ninth, 40))),
        *(max(len(h), *(len(str(e[k])) for e in entries)) for h, k in
          zip(heads[1:4], ["ino", "size", "blocks"], strict=True)),
        len(heads[4]),
    ]  # fmt: skip
    path_right = all(e["path"] is None for e in entries)
    lines = [
        "  ".join(
            [heads[0].rjust(widths[0]) if path_right else heads[0].ljust(widths[0])]
            + [h.rjust(w) for h, w in zip(heads[1:4], widths[1:4], strict=True)]
            + [heads[4]]
        ),
        "  ".join("-" * w for w in widths),
    ]
    for p, e in zip(paths, entries, strict=True):
        cells = [p.rjust(widths[0]) if path_right else p.ljust(widths[0])]
        cells += [
            str(e[k]).rjust(w) for k, w in zip(["ino", "size", "blocks"], widths[1:4], strict=True)
        ]
        lines.append(
            "  ".join([*cells, " ".join(f"{lo}:{ph}+{n}" for lo, ph, n in e["extents"]) or "-"])
        )
    return "".join(line + "\n" for line in lines)


def shown_by_fsage(store: Store, snap: int, prefix: str | None, fmt: str) -> str:
    out: list[str] = []
    show_files(store, snap, prefix, fmt, out.append)
    return "".join(out)


def check_snapshot(db: Path, snap: int, prefixes: list[str | None]) -> None:
    with Store.open(db, readonly=True) as store:
        layout = store.load_layout(snap)
        for prefix in prefixes:
            entries = reference_entries(layout, prefix)
            if not entries:  # gone in this snapshot
                with pytest.raises(StoreError, match="no file at or below"):
                    shown_by_fsage(store, snap, prefix, "text")
                continue
            for fmt in ("text", "csv", "json"):
                want = reference_output(entries, fmt)
                assert shown_by_fsage(store, snap, prefix, fmt) == want, (prefix, fmt)


def subtrees(db: Path, snap: int, base: str) -> list[str | None]:
    """The whole listing, "/", and a few directories and files of the snapshot (of the tree
    at ``base`` in it)."""
    with Store.open(db, readonly=True) as store:
        paths = sorted(p for ps in store.load_layout(snap).paths().values() for p in ps)
    depth = base.count("/")
    picks = [p for p in paths if p.startswith(base) and p.count("/") - depth in (1, 2, 4)]
    random.Random(snap).shuffle(picks)
    extra = [f"{base}/a/", f"{base.lstrip('/')}/a//lvl0", f"{base}/a/target", f"{base}/z/b/hard"]
    return [None, "/", *picks[:8], *extra]


def test_show_matches_the_plain_listing_on_a_mounted_tree(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    make_tree(tree, seed=3)
    db = tmp_path / "s.db"
    r = CliRunner().invoke(main, ["snapshot", str(tree), "--db", str(db)])
    assert r.exit_code == 0, r.output
    check_snapshot(db, 1, subtrees(db, 1, str(tree)))


def test_show_matches_the_plain_listing_on_an_ext4_history(tmp_path: Path) -> None:
    require_tools("mke2fs", "debugfs")
    tree = tmp_path / "tree"
    tree.mkdir()
    make_tree(tree, seed=7, files=120)
    img = tmp_path / "fs.img"
    subprocess.run(
        ["mke2fs", "-q", "-F", "-t", "ext4", "-b", "1024", "-d", str(tree), str(img), "32M"],
        check=True,
        capture_output=True,
    )
    db = tmp_path / "s.db"
    runner = CliRunner()
    assert runner.invoke(main, ["snapshot", str(img), "--db", str(db)]).exit_code == 0
    # the second snapshot ends versions of the first: files removed, renamed, written anew,
    # a directory made, a name dropped from an inode that stays in use (no path at all)
    blob = tmp_path / "blob"
    blob.write_bytes(random.Random(1).randbytes(30_000))
    cmds = [
        "rm /a/target",
        "mkdir /a/new",
        f"write {blob} /a/new/file",
        f"write {blob} /a-x/a/late",
        "unlink /z/b/hard",
        "link /Z/hard /a/new/again",
        "unlink /a.b/b",
    ]
    script = tmp_path / "cmds"
    script.write_text("\n".join(cmds) + "\n")
    subprocess.run(["debugfs", "-w", "-f", str(script), str(img)], check=True, capture_output=True)
    assert runner.invoke(main, ["snapshot", str(img), "--db", str(db)]).exit_code == 0
    with Store.open(db, readonly=True) as store:
        second = store.load_layout(2)
    assert listing(second).path[-1] is None  # /a.b/b lost its only name: listed last
    for snap in (1, 2):
        check_snapshot(db, snap, subtrees(db, snap, ""))


def test_a_directory_with_two_names_lists_as_the_walk_finds_it() -> None:
    # directory 12 is named twice (a damaged tree): the walk from the root decides its path
    files = table(
        [[], [], [(0, 100, 2)], [(0, 200, 1)], [(0, 300, 40)]],
        inos=[2, 12, 13, 14, 15],
        modes=[0o40755, 0o40755, 0o100644, 0o100644, 0o100644],
    )
    links = [(2, 12, b"d"), (2, 14, b"d-1"), (12, 13, b"f"), (2, 12, b"c"), (12, 15, b"g")]
    lay = hand_layout(files, links=links)
    got = [e.to_json() for e in file_listing(lay)]
    entries = reference_entries(lay, None)
    assert got == entries
    assert [e["path"] for e in got] == ["/", "/c", "/d-1", "/d/f", "/d/g"]
    for prefix in ("/d", "/d-1"):
        got = [e.to_json() for e in file_listing(lay, prefix)]
        assert got == reference_entries(lay, prefix)
    out: list[str] = []
    from fsage.listing import write_text

    write_text(listing(lay), out.append)
    assert "".join(out) == reference_output(entries, "text")


def test_show_of_a_missing_path_says_so(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "d").mkdir(parents=True)
    (tree / "d" / "f").write_bytes(b"x" * 10)
    db = tmp_path / "s.db"
    runner = CliRunner()
    assert runner.invoke(main, ["snapshot", str(tree), "--db", str(db)]).exit_code == 0
    for prefix in ("/nope", f"{tree}/d/f/g", f"{tree}/d/nope"):
        r = runner.invoke(main, ["show", "1", "--db", str(db), "--path", prefix])
        assert r.exit_code == 1
        assert r.output == f"fsage: error: no file at or below {prefix} in snapshot 1\n"
    f = str(tree / "d" / "f")
    r = runner.invoke(main, ["show", "1", "--db", str(db), "--path", f[1:], "--format", "csv"])
    assert r.exit_code == 0 and r.output.splitlines()[1].startswith(f + ",")
    r = runner.invoke(main, ["show", "7", "--db", str(db), "--path", "/d"])
    assert r.exit_code == 1 and "no snapshot 7" in r.output


def test_listing_is_by_path_not_by_walk() -> None:
    # "/a-x" sorts between "/a" and "/a/b" as a path, after both in a walk by name
    files = table(
        [[], [], [], [(0, 10, 1)]], inos=[2, 12, 13, 14], modes=[0o40755] * 3 + [0o100644]
    )
    lay = hand_layout(files, links=[(2, 12, b"a"), (2, 13, b"a-x"), (12, 14, b"b")])
    lst = listing(lay)
    assert lst.path == ["/", "/a", "/a-x", "/a/b"]
    assert np.array_equal(lay.files.ino[lst.rows], [2, 12, 13, 14])
