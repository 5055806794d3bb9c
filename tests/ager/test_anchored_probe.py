"""A generator that steers a mounted ext4 by its model (``probe_every=None``) reads the
target's used blocks once, at the start: a kernel whose count after the same ops is a few
blocks off from run to run cannot change its stream. Steered by every probe, the same noise
does."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable

from fsage.ager.generator import PROBE_EVERY, Generator
from fsage.ager.profile import get_preset

MIB = 1 << 20
BS = 1024


def _stream(noise_seed: int, probe_every: int | None) -> tuple[list[object], int]:
    """The first ops of a run whose probe reads the model's used blocks, off by up to 30
    blocks (what a mounted ext4's statvfs does), and how many probes it made."""
    prof = get_preset("database").with_overrides(fill=0.5, churn=2.0)
    noise = random.Random(noise_seed)
    calls = [0]
    gen: Generator

    def probe() -> tuple[int, int, int]:
        calls[0] += 1
        jitter = noise.randrange(31) if calls[0] > 1 else 0
        return BS, gen.total_blocks, 500 + gen.used_blocks + jitter

    probe_fn: Callable[[], tuple[int, int, int]] = probe
    gen = Generator(
        prof,
        11,
        96 * MIB,
        probe=probe_fn,
        block_size=BS,
        probe_every=probe_every,
        ext_meta=probe_every is None,
    )
    ops = list(itertools.islice(gen.ops(), 20_000))
    return ops, calls[0]


def test_a_model_steered_stream_does_not_hear_the_kernels_noise() -> None:
    first, probes = _stream(1, None)
    second, _ = _stream(2, None)
    assert probes == 1
    assert len(first) == 20_000
    assert first == second


def test_a_probe_steered_stream_does() -> None:
    first, probes = _stream(1, PROBE_EVERY)
    second, _ = _stream(2, PROBE_EVERY)
    assert probes > 100
    assert first != second
