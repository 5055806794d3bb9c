"""Bytes read from a file system survive whatever they are, and no name can forge a line.

Labels, uuids and names that are not UTF-8 go through the store, JSON, text and the HTML
report (one rule: fsage.text); control characters in names, in --name and in --label are
shown escaped in every text table and line.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from fsage.db.store import Store
from fsage.text import from_disk, shown, to_disk

pytestmark = pytest.mark.usefixtures("e2fsprogs")

LABEL = b"caf\xe9"
ODD_NAMES = [b"fake\nFORGED-LINE 1 2 3", b"bell\x07\x1b[31mred", b"latin-\xe9t\xe9", b"tab\there"]


def fsage(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("FSAGE_DB", None)
    proc = subprocess.run(
        [sys.executable, "-m", "fsage", *args],
        capture_output=True,
        text=True,
        errors="surrogateescape",
        env=env,
        timeout=300,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


@pytest.fixture(scope="module")
def odd_image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An ext4 image labelled b'caf\\xe9' holding files with control characters and bytes
    that are not UTF-8 in their names, and a symlink whose target is not UTF-8."""
    tmp = tmp_path_factory.mktemp("odd")
    tree = tmp / "tree"
    tree.mkdir()
    for i, name in enumerate(ODD_NAMES):
        with open(os.path.join(os.fsencode(tree), name), "wb") as f:
            f.write(bytes([i]) * (5000 + i))
    os.symlink(b"target-\xff", os.path.join(os.fsencode(tree), b"link"))
    image = tmp / "lab.img"
    cmd = [b"mke2fs", b"-q", b"-F", b"-t", b"ext4", b"-b", b"1024", b"-L", LABEL]
    subprocess.run(
        [*cmd, b"-d", os.fsencode(tree), os.fsencode(image), b"16M"],
        check=True,
        capture_output=True,
    )
    subprocess.run(["e2fsck", "-fn", str(image)], check=True, capture_output=True)
    return image


def _lines(text: str) -> list[str]:
    return text.splitlines()


def test_label_not_utf8_end_to_end(odd_image: Path, tmp_path: Path) -> None:
    db = tmp_path / "a.db"
    line = fsage("snapshot", str(odd_image), "--db", str(db)).stdout
    assert line.startswith("snapshot 1 of caf\\xe9:"), line
    with Store.open(db) as store:
        layout = store.load_layout(1)
        fs = store.filesystems()
    assert layout.facts.label == from_disk(LABEL)  # the bytes themselves, kept
    assert to_disk(layout.facts.label) == LABEL
    assert fs[0]["name"] == "caf\\xe9"
    rows = json.loads(fsage("snapshots", "--db", str(db), "--format", "json").stdout)
    assert rows[0]["fs"] == "caf\\xe9"
    assert "caf\\xe9" in fsage("snapshots", "--db", str(db)).stdout
    assert "caf\\xe9" in fsage("analyze", "--db", str(db)).stdout
    json.loads(fsage("analyze", "--db", str(db), "--format", "json").stdout)
    report = tmp_path / "r.html"
    fsage("report", "--db", str(db), "-o", str(report))
    report.read_bytes().decode("utf-8")  # valid UTF-8 throughout
    assert "caf\\xe9" in report.read_text(encoding="utf-8")


def test_names_not_utf8_and_with_control_characters(odd_image: Path, tmp_path: Path) -> None:
    db = tmp_path / "a.db"
    fsage("snapshot", str(odd_image), "--db", str(db))
    text = fsage("show", "1", "--db", str(db)).stdout
    lines = _lines(text)
    assert not any(line.startswith("FORGED") for line in lines), text
    assert "\x1b" not in text and "\x07" not in text and "\t" not in text
    assert "/fake\\nFORGED-LINE 1 2 3" in text
    assert "/latin-\\xe9t\\xe9" in text
    # 2 header lines, the root, lost+found, the link and the files: one line each
    assert len(lines) == 2 + 3 + len(ODD_NAMES)
    listed = json.loads(fsage("show", "1", "--db", str(db), "--format", "json").stdout)
    paths = {to_disk(e["path"]) for e in listed}
    assert {b"/" + n for n in ODD_NAMES} <= paths


def test_name_and_label_options_cannot_forge_rows(odd_image: Path, tmp_path: Path) -> None:
    db = tmp_path / "a.db"
    forged = "home\nFORGED 9 9 9"
    out = fsage("snapshot", str(odd_image), "--db", str(db), "--name", forged).stdout
    assert len(_lines(out)) == 1 and out.startswith("snapshot 1 of home\\nFORGED")
    table = fsage("snapshots", "--db", str(db)).stdout
    # header, rule, one row (and the table's own footnote, which starts with "(")
    assert len([ln for ln in _lines(table) if not ln.startswith("(")]) == 3, table
    assert not any(line.startswith("FORGED") for line in _lines(table))
    rows = json.loads(fsage("snapshots", "--db", str(db), "--format", "json").stdout)
    assert rows[0]["fs"] == forged  # stored as given; only its display is escaped
    status = fsage("analyze", "--db", str(db), "--fs", forged).stdout
    assert not any(line.startswith("FORGED") for line in _lines(status))


def test_lfs_uuid_not_utf8(tmp_path: Path) -> None:
    image = tmp_path / "l.img"
    fsage("lfs", "mkfs", str(image), "--size", "16M")
    data = bytearray(image.read_bytes())
    found = [
        m.start()
        for m in re.finditer(rb"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", data)
    ]
    assert found, "no uuid in the LFS superblock"
    for at in found:
        data[at] = 0xE9
    image.write_bytes(bytes(data))
    db = tmp_path / "a.db"
    fsage("snapshot", str(image), "--db", str(db))
    rows = json.loads(fsage("snapshots", "--db", str(db), "--format", "json").stdout)
    assert rows[0]["uuid"].startswith("\\xe9")
    with Store.open(db) as store:
        assert to_disk(store.load_layout(1).facts.uuid)[:1] == b"\xe9"


def test_shown_escapes_every_control_character() -> None:
    for c in [chr(i) for i in range(32)] + ["\x7f", "\x85", "\u2028", "\u2029"]:
        s = shown(f"a{c}b")
        assert s.isprintable() and len(s.splitlines()) == 1, repr(s)
    assert shown("plain name é") == "plain name é"
    assert shown(from_disk(b"\xff\xfe")) == "\\xff\\xfe"
