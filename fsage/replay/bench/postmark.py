"""Debian's ``postmark`` (PostMark v1.5x): a generated configuration and a parser of its report.

Variants (``--variant``):

* ``standard`` (the default) — seed 003's settings (sizes 500 B–9.77 KB, 100 subdirectories,
  seed 42) scaled up to run for seconds: :data:`STANDARD_FILES` files and
  :data:`STANDARD_TRANSACTIONS` transactions. Seed 003's own 500 files and 500 transactions
  finish in about 0.06 s on a current ext4, too short for PostMark's whole-second clock; these
  took 8-10 s (2.4 s of CPU) on a loaded 2-core test machine's loop-mounted ext4. More
  transactions need more files: with 500, PostMark stops "out of files" above about 120,000.
* ``seed003`` — seed 003's run: 500 files, 500 transactions, sizes 500 B–9.77 KB (10,000 bytes),
  100 subdirectories, seed 42.
* ``50k``, ``100k``, ``150k`` — seed 004 §6.2: PostMark's defaults (500 transactions, sizes
  500 B–9.77 KB, 512-byte reads and writes, biases 5/5, one directory) with that many files.

Every size is absolute: the same files and transactions on every file system (never scaled to
the target's speed or free space), so results compare across file systems and with the
empty-file-system baseline. PostMark times in whole seconds and divides by the transaction
phase's duration: a run whose transactions finish within one second dies of SIGFPE, which the
suite reports as one error asking for more transactions (it does not pick another size itself).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from fsage.errors import FsageError

POSTMARK = "postmark"
#: The default variant's size: enough to run for seconds, not a fraction of one.
STANDARD_FILES = 5_000
STANDARD_TRANSACTIONS = 100_000


@dataclass(frozen=True)
class PostmarkConfig:
    files: int = 500
    transactions: int = 500
    size_low: int = 500
    size_high: int = 10_000  # 9.77 KB
    subdirectories: int = 0
    seed: int = 42
    read_block: int = 512
    write_block: int = 512

    def script(self, location: str) -> str:
        """The commands postmark reads (from a file named on its command line or stdin)."""
        lines = [
            f"set location {location}",
            f"set number {self.files}",
            f"set transactions {self.transactions}",
            f"set size {self.size_low} {self.size_high}",
            f"set subdirectories {self.subdirectories}",
            f"set seed {self.seed}",
            f"set read {self.read_block}",
            f"set write {self.write_block}",
            "set report verbose",
            "show",
            "run",
            "quit",
        ]
        return "\n".join(lines) + "\n"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


VARIANTS: dict[str, PostmarkConfig] = {
    "standard": PostmarkConfig(
        files=STANDARD_FILES, transactions=STANDARD_TRANSACTIONS, subdirectories=100, seed=42
    ),
    "seed003": PostmarkConfig(files=500, transactions=500, subdirectories=100, seed=42),
    "50k": PostmarkConfig(files=50_000),
    "100k": PostmarkConfig(files=100_000),
    "150k": PostmarkConfig(files=150_000),
}
DEFAULT_VARIANT = "standard"


@dataclass
class PostmarkReport:
    seconds_total: int
    seconds_transactions: int
    transactions_per_second: float
    created: int
    created_per_second: float
    created_alone: int
    created_alone_per_second: float
    read: int
    read_per_second: float
    appended: int
    appended_per_second: float
    deleted: int
    deleted_per_second: float
    deleted_alone: int
    deleted_alone_per_second: float
    read_kb: float
    read_kb_per_second: float
    write_kb: float
    write_kb_per_second: float


_UNITS = {"bytes": 1 / 1024, "kilobytes": 1.0, "megabytes": 1024.0, "gigabytes": 1024.0**2}
_NUM = r"(\d+(?:\.\d+)?)"


def _one(pattern: str, text: str, what: str) -> re.Match[str]:
    m = re.search(pattern, text)
    if m is None:
        raise FsageError(f"postmark output: no {what} line (not a PostMark v1.5 report?)")
    return m


def _data(text: str, verb: str) -> tuple[float, float]:
    m = _one(
        rf"{_NUM} (bytes|kilobytes|megabytes|gigabytes) {verb} \({_NUM} "
        r"(bytes|kilobytes|megabytes|gigabytes) per second\)",
        text,
        f"data {verb}",
    )
    return float(m[1]) * _UNITS[m[2]], float(m[3]) * _UNITS[m[4]]


def parse_report(text: str) -> PostmarkReport:
    """The numbers of PostMark's verbose report (Time / Files / Data sections), in KB for data."""
    tot = _one(r"(\d+) seconds total", text, "'seconds total'")
    tx = _one(r"(\d+) seconds of transactions \((\d+) per second\)", text, "transactions")
    files = text[text.find("Files:") :]
    created = _one(r"(\d+) created \((\d+) per second\)", files, "'created'")
    c_alone = _one(r"Creation alone: (\d+) files \((\d+) per second\)", files, "'Creation alone'")
    read = _one(r"(\d+) read \((\d+) per second\)", files, "'read'")
    app = _one(r"(\d+) appended \((\d+) per second\)", files, "'appended'")
    deleted = _one(r"(\d+) deleted \((\d+) per second\)", files, "'deleted'")
    d_alone = _one(r"Deletion alone: (\d+) files \((\d+) per second\)", files, "'Deletion alone'")
    rkb, rrate = _data(text, "read")
    wkb, wrate = _data(text, "written")
    return PostmarkReport(
        seconds_total=int(tot[1]),
        seconds_transactions=int(tx[1]),
        transactions_per_second=float(tx[2]),
        created=int(created[1]),
        created_per_second=float(created[2]),
        created_alone=int(c_alone[1]),
        created_alone_per_second=float(c_alone[2]),
        read=int(read[1]),
        read_per_second=float(read[2]),
        appended=int(app[1]),
        appended_per_second=float(app[2]),
        deleted=int(deleted[1]),
        deleted_per_second=float(deleted[2]),
        deleted_alone=int(d_alone[1]),
        deleted_alone_per_second=float(d_alone[2]),
        read_kb=rkb,
        read_kb_per_second=rrate,
        write_kb=wkb,
        write_kb_per_second=wrate,
    )
