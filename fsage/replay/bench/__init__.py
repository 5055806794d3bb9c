"""The seed benchmarks, run cold on an image or a mounted directory, with the layout scores of
the benchmark's own files and of the files already there (seed 002), stored next to the layout;
and the prediction of relative performance from layout score (:mod:`.predict`).

``fsage bench TARGET --suite NAME`` — suites: ``seq``, ``seq-fsync``, ``create-read``,
``postmark``, ``tpcb``, ``hfs-aging`` (see :mod:`.suites`).
"""

from fsage.replay.bench.run import BenchRun, run_bench, store_run, stored_results
from fsage.replay.bench.suites import SUITES, BenchOptions, Result, parse_size

__all__ = [
    "SUITES",
    "BenchOptions",
    "BenchRun",
    "Result",
    "parse_size",
    "run_bench",
    "store_run",
    "stored_results",
]
