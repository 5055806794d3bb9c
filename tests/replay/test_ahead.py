"""The look-ahead thread of a replay: items in order, errors raised to the consumer, and a
consumer that stops early stops the producer (its cleanup runs)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from fsage.replay.recreate import _Ahead


def test_items_arrive_in_order_and_at_most_depth_ahead() -> None:
    made: list[int] = []

    def produce() -> Iterator[int]:
        for i in range(5):
            made.append(i)
            yield i

    ahead = _Ahead(produce, depth=1)
    it = iter(ahead)
    assert next(it) == 0
    time.sleep(0.3)  # time for the producer to run ahead as far as it may
    # One taken, one queued, one made and waiting to be queued: never the whole stream.
    assert len(made) <= 3
    assert list(it) == [1, 2, 3, 4]
    ahead.close()


def test_an_error_in_the_producer_reaches_the_consumer() -> None:
    def produce() -> Iterator[int]:
        yield 1
        raise ValueError("bad snapshot")

    ahead = _Ahead(produce)
    got: list[int] = []
    with pytest.raises(ValueError, match="bad snapshot"):
        for x in ahead:
            got.append(x)
    ahead.close()
    assert got == [1]


def test_closing_early_stops_the_producer_and_runs_its_cleanup() -> None:
    cleaned = threading.Event()

    def produce() -> Iterator[int]:
        try:
            i = 0
            while True:
                yield i
                i += 1
        finally:
            cleaned.set()

    ahead = _Ahead(produce)
    assert next(iter(ahead)) == 0
    ahead.close()
    assert cleaned.is_set()
