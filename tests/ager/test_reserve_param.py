"""ext4's reserve, lifted on fsage's own mount while matching, is a parameter of the journal: a
replay with ``--ops`` on a mount of fsage's sets it the same (the kernel's sysfs knob as
oracle), and a target where it cannot says so."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fsage.ager import targets
from fsage.ager.run import AgeOptions, age
from fsage.ager.targets import RESERVE_PARAM
from fsage.workload import Op, WorkloadHeader, write_workload

MIB = 1 << 20


def _stream(path: Path, params: dict[str, object]) -> Path:
    ops = [Op("mkdir", "d"), Op("create", "d/f", 8192)]
    write_workload(path, WorkloadHeader("fsage age --match", params, 0), ops)
    return path


def _knob(root: Path) -> int:
    st = os.stat(root)
    dev = os.path.realpath(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}")
    return int((Path("/sys/fs/ext4") / os.path.basename(dev) / "reserved_clusters").read_text())


@pytest.mark.needs_root
def test_a_replay_on_fsage_s_mount_sets_the_reserve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fsage.ager.images import loop_mount, make_image

    img = make_image(tmp_path / "e.img", "ext4", 64 * MIB)
    with loop_mount(img) as mnt:
        default = _knob(mnt)
    assert default > 0  # the kernel keeps a reserve unless told otherwise
    seen: list[int] = []
    real = targets.lift_ext4_reserve

    def spy(root: Path, clusters: int = 0) -> int | None:
        got = real(root, clusters)
        seen.append(_knob(root))  # what the kernel holds now
        return got

    monkeypatch.setattr(targets, "lift_ext4_reserve", spy)
    res = age(img, AgeOptions(ops_file=_stream(tmp_path / "s.jsonl", {RESERVE_PARAM: 0}),
                              mode="mount"))  # fmt: skip
    assert res.finished and seen == [0]
    seen.clear()
    other = make_image(tmp_path / "o.img", "ext4", 64 * MIB)
    res = age(other, AgeOptions(ops_file=_stream(tmp_path / "p.jsonl", {}), mode="mount"))
    assert res.finished and seen == []


def test_a_directory_target_says_it_keeps_its_reserve(tmp_path: Path) -> None:
    root = tmp_path / "t"
    root.mkdir()
    res = age(root, AgeOptions(ops_file=_stream(tmp_path / "s.jsonl", {RESERVE_PARAM: 0})))
    assert res.finished and (root / "d" / "f").stat().st_size == 8192
    assert any("reserve" in n for n in res.notices), res.notices
    plain = tmp_path / "u"
    plain.mkdir()
    res2 = age(plain, AgeOptions(ops_file=_stream(tmp_path / "q.jsonl", {})))
    assert res2.finished and not any("reserve" in n for n in res2.notices)
