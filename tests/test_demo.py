"""`fsage demo`: the embedded example ages its image visibly, and says what aged it."""

from __future__ import annotations

from pathlib import Path

import pytest

from fsage.analyzer.analysis import analyze_layout
from fsage.demo import AGING_PRESET, run_demo
from fsage.snapshotter import read_source

pytest.importorskip("fsage._ext2fs")


def test_demo_ages_its_image_and_says_with_what(tmp_path: Path) -> None:
    lines: list[str] = []
    before: dict[str, float] = {}

    def echo(line: str) -> None:
        lines.append(line)
        if line.startswith("snapshot 1 "):  # the image as made, before the aging
            image = tmp_path / "demo" / "demo.img"
            before["score"] = analyze_layout(read_source(image), parts=("size",))["layout_score"]

    res = run_demo(tmp_path / "demo", files=300, seed=7, echo=echo)  # the default churn
    text = "\n".join(lines)
    assert f"with the {AGING_PRESET} preset" in text
    aged_line = next(line for line in lines if line.startswith("aged: "))
    assert "append" in aged_line and "sync" in aged_line  # the ops that aged it, by kind

    after = analyze_layout(read_source(res.image), parts=("size",))
    assert before["score"] > 0.99  # mke2fs -d lays the seeded tree out contiguously
    # hfs-surge (whole-file creates and deletes) left the demo at 0.999-1.000.
    assert after["layout_score"] < 0.95
    small = [b for b in after["by_size"] if b["layout_score"] is not None and b["files"] >= 20]
    assert small and all(b["layout_score"] < 0.95 for b in small[:4])
    # The aging took the seeded files in and deleted many (an aging that does not adopt them
    # leaves all 300).
    paths = {p for ps in read_source(res.image).paths().values() for p in ps}
    seeded_left = sum(1 for p in paths if p.rsplit("/", 1)[-1].startswith("f0"))
    assert seeded_left < 250
    assert res.report.exists() and len(res.aging.snapshots) >= 3
