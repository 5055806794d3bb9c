"""Text read from a file system, and text shown to a person: one rule for each.

Bytes read from a file system (names, symlink targets, volume labels, uuids) need not be UTF-8.
They become ``str`` through :func:`from_disk` (UTF-8 with ``surrogateescape``: every byte
survives and :func:`to_disk` gives the same bytes back); JSON written by fsage carries such a
string with ``\\udcXX`` escapes, which ``json.loads`` reads back to the same string.

Anything shown on a terminal, in a text table or line, in a log line, in an HTML page or
stored as SQLite text goes through :func:`shown` first: bytes that are not UTF-8 appear as
``\\xNN`` and control characters (a newline, an escape sequence) as their escapes, so no name
can break a line, forge a row or drive the terminal.
"""

from __future__ import annotations

__all__ = ["decimal", "disk_text", "from_disk", "human_bytes", "shown", "size_range", "to_disk"]


def from_disk(raw: bytes) -> str:
    """Bytes from a file system as a str that keeps every byte (see the module docstring)."""
    return raw.decode("utf-8", "surrogateescape")


def disk_text(value: str | bytes) -> str:
    """A text field of an on-disk record as decoded by a library: protobuf, for one, hands
    back bytes where the field is not valid UTF-8. Either way, a str by the rule above."""
    return from_disk(value) if isinstance(value, bytes) else value


def to_disk(text: str) -> bytes:
    """The bytes that :func:`from_disk` made ``text`` from."""
    return text.encode("utf-8", "surrogateescape")


def shown(text: str) -> str:
    """``text`` safe to print or store as text: undecodable bytes as ``\\xNN``, control and
    other unprintable characters as Python-style escapes, everything else unchanged."""
    if text.isprintable():
        return text
    text = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def table_cell(v: object) -> str:
    """A value as a text table shows it: "-" for none, floats to three places, text
    :func:`shown` (a name with a newline must not forge a row)."""
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3f}"
    return shown(str(v))


def counted(n: int, noun: str) -> str:
    """``n`` with its noun, singular for one: "1 file", "2,000 files"."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def human_bytes(n: float | int | None) -> str:
    """Bytes in binary units (KiB, MiB, GiB, TiB), as a person reads them."""
    if n is None:
        return "-"
    v = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(v) < 1024 or unit == "TiB":
            if unit == "B" or v == int(v):
                return f"{v:.0f} {unit}"
            return f"{v:.1f} {unit}"
        v /= 1024
    return f"{v:.1f} TiB"


def decimal(v: float, digits: int, signed: bool = False) -> str:
    """``v`` to ``digits`` decimals (with its sign, ``signed``), never as a negative zero: a
    change of -0.00001 reads "+0.0000", not "-0.0000"."""
    text = f"{v:+.{digits}f}" if signed else f"{v:.{digits}f}"
    if float(text) == 0:
        text = ("+" if signed else "") + text.lstrip("+-")
    return text


def size_range(min_blocks: int, max_blocks: int, block_size: int) -> str:
    """The label of a file-size bucket, in bytes: files of ``min_blocks`` to ``max_blocks``
    blocks of data hold more than the first and at most the second number of bytes
    ("4 KiB-8 KiB": over 4 KiB, up to 8 KiB). Every command and the report label file-size
    buckets with this."""
    return f"{human_bytes((min_blocks - 1) * block_size)}-{human_bytes(max_blocks * block_size)}"
