"""The Workload model: an op stream with a header, shared by the ager and replay.

A workload is JSON Lines: the first line is the header (who made it, parameters, seed, fsage
version), every further line one op. Generators make op streams; executors run them on a
target (a mounted tree, an ext image offline, an LFS image), so every workload runs on every
target.

Paths in ops are relative to the target's root, '/'-separated, and never contain '..' or start
with '/': ``check_relpath`` enforces that for anything read from a file.
"""

from __future__ import annotations

import gzip
import io
import json
import stat
import sys
import zlib
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from json.encoder import encode_basestring_ascii as _quote
from pathlib import Path
from typing import IO, Any, cast

from fsage import __version__
from fsage.errors import WorkloadError
from fsage.private import output_target, private_opener

FORMAT_VERSION = 1

OP_KINDS = (
    "mkdir",  # path
    "create",  # path, size: a new regular file of ``size`` bytes
    "append",  # path, size: bytes added at the end
    "overwrite",  # path, offset, size: rewrite bytes in place
    "truncate",  # path, size: new length
    "delete",  # path: unlink a file, or remove an empty directory
    "rename",  # path -> dest
    "link",  # path -> dest: a new name for the existing file at path
    "fsync",  # path
    "symlink",  # path, size: a symlink whose target is ``size`` bytes long (dest: the target)
    "mknod",  # path, label: a special file (fifo, socket, char, block; device number 0)
    "sync",  # whole file system
    "snapshot",  # marker: a snapshot is wanted here (label)
    "punch",  # path, offset, size: free the blocks of the range; the file keeps its size
    "fallocate",  # path, offset, size: allocate blocks for the range, growing the size to its end
    "allocate-near",  # fallocate's fields; label: the block its blocks are searched from (the
    # offline writer places them there; the kernel takes no such hint: a plain fallocate)
    "setattr",  # path, mode and/or mtime_ns: permission bits, modification time (as tar sets)
)

#: The permission bits a ``setattr`` op may set (chmod's: rwx for all, setuid, setgid, sticky).
MODE_BITS = 0o7777
#: The permission bits every executor gives a file a ``create`` op makes (before the umask).
CREATE_MODE = 0o644


#: Kinds of special file a ``mknod`` op makes, and their file-type bits.
SPECIAL_MODES = {
    "fifo": stat.S_IFIFO,
    "socket": stat.S_IFSOCK,
    "char": stat.S_IFCHR,
    "block": stat.S_IFBLK,
}
SPECIAL_KINDS = tuple(SPECIAL_MODES)
#: The longest symlink target (PATH_MAX - 1).
SYMLINK_MAX = 4095


def symlink_target(op: Op) -> str:
    """The target a ``symlink`` op gives: ``dest`` when set, else a placeholder of ``size``
    bytes (snapshots record a target's length, which decides where it is stored, not its
    text). The link is never followed by fsage."""
    if op.dest:
        return op.dest
    n = max(op.size, 1)
    return ("fsage-symlink-" * (n // 14 + 1))[:n]


@dataclass(frozen=True, init=False)
class Op:
    op: str
    path: str = ""
    size: int = 0
    offset: int = 0
    dest: str = ""
    label: str = ""
    #: setattr only: permission bits (``MODE_BITS``), and the modification time in ns since
    #: the epoch; None leaves it as it is.
    mode: int | None = None
    mtime_ns: int | None = None
    #: Not seen in any snapshot: churn a closed-loop replay inferred to reach one.
    inferred: bool = False

    def __init__(
        self,
        op: str,
        path: str = "",
        size: int = 0,
        offset: int = 0,
        dest: str = "",
        label: str = "",
        mode: int | None = None,
        mtime_ns: int | None = None,
        inferred: bool = False,
    ) -> None:
        # The instance's fields set in one assignment: the __init__ a frozen dataclass makes
        # sets each through object.__setattr__, 1.4 us an op against 0.8 (streams hold
        # hundreds of thousands of ops).
        object.__setattr__(
            self,
            "__dict__",
            {
                "op": op,
                "path": path,
                "size": size,
                "offset": offset,
                "dest": dest,
                "label": label,
                "mode": mode,
                "mtime_ns": mtime_ns,
                "inferred": inferred,
            },
        )

    def to_json(self) -> str:
        # Only non-default fields, so streams stay small and diffs readable. Formatted by
        # hand: the bytes json.dumps(..., separators=(",", ":")) gives (strings quoted by the
        # encoder it uses), about 7x faster; streams and journals hold one line per op.
        out = '{"op":' + _quote(self.op)
        if self.path:
            out += ',"path":' + _quote(self.path)
        if self.size:
            out += ',"size":' + str(self.size)
        if self.offset:
            out += ',"offset":' + str(self.offset)
        if self.dest:
            out += ',"dest":' + _quote(self.dest)
        if self.label:
            out += ',"label":' + _quote(self.label)
        if self.mode is not None:
            out += ',"mode":' + str(self.mode)
        if self.mtime_ns is not None:
            out += ',"mtime_ns":' + str(self.mtime_ns)
        if self.inferred:
            out += ',"inferred":true'
        return out + "}"

    @classmethod
    def from_json(cls, data: dict[str, Any], where: str = "") -> Op:
        """An op read from a stream: every field of its type (a size is an integer, not
        ``"10"`` or ``1.5``)."""
        try:
            op = cls(
                op=_text(data, "op", None),
                path=_text(data, "path", ""),
                size=_count(data, "size"),
                offset=_count(data, "offset"),
                dest=_text(data, "dest", ""),
                label=_text(data, "label", ""),
                mode=_optional_int(data.get("mode")),
                mtime_ns=_optional_int(data.get("mtime_ns")),
                inferred=data.get("inferred", False) is True,
            )
        except ValueError as exc:
            raise WorkloadError(f"{where}bad op: {exc}") from None
        op.check(where)
        return op

    def check(self, where: str = "") -> None:
        if self.op not in OP_KINDS:
            raise WorkloadError(f"{where}unknown op {self.op!r}")
        if self.size < 0 or self.offset < 0:
            raise WorkloadError(f"{where}negative size or offset in {self.op}")
        if self.op not in ("sync", "snapshot"):
            check_relpath(self.path, where)
        if self.op in ("rename", "link"):
            check_relpath(self.dest, where)
        if self.op == "allocate-near" and not self.label.isdigit():
            raise WorkloadError(f"{where}allocate-near needs a block number, not {self.label!r}")
        if self.op == "mknod" and self.label not in SPECIAL_KINDS:
            raise WorkloadError(f"{where}mknod of unknown kind {self.label!r}")
        if self.op == "symlink" and (self.size > SYMLINK_MAX or "\0" in self.dest):
            raise WorkloadError(f"{where}bad symlink target for {self.path!r}")
        if self.op == "setattr":
            if self.mode is None and self.mtime_ns is None:
                raise WorkloadError(f"{where}setattr of {self.path!r} sets neither mode nor mtime")
            if self.mode is not None and not 0 <= self.mode <= MODE_BITS:
                raise WorkloadError(f"{where}setattr mode {self.mode:#o} is not permission bits")
            if self.mtime_ns is not None and not -(2**63) <= self.mtime_ns < 2**63:
                raise WorkloadError(f"{where}setattr mtime_ns {self.mtime_ns} out of range")
        elif self.mode is not None or self.mtime_ns is not None:
            raise WorkloadError(f"{where}mode and mtime_ns belong to setattr, not {self.op}")


#: The largest size or offset an op may give (a file's size is a signed 64-bit number).
SIZE_MAX = 2**63 - 1


def _text(data: dict[str, Any], key: str, default: str | None) -> str:
    value = data.get(key, default)
    if value is None:
        raise ValueError(f"no {key!r}")
    if not isinstance(value, str):
        raise ValueError(f"{key} {_short(value)} is not a string")
    return value


def _count(data: dict[str, Any], key: str) -> int:
    value = data.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{key} {_short(value)} is not an integer")
    if not 0 <= value <= SIZE_MAX:
        raise ValueError(f"{key} {value} is out of range (0 to 2**63 - 1)")
    return value


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _optional_int(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{_short(value)} is not an integer")
    return value


def check_relpath(path: str, where: str = "") -> str:
    """Refuse any path that could leave the target: absolute, '..', empty parts, NUL."""
    if not path or path.startswith("/") or "\0" in path:
        raise WorkloadError(f"{where}unsafe path {path!r}")
    parts = path.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise WorkloadError(f"{where}unsafe path {path!r}")
    return path


@dataclass
class WorkloadHeader:
    generator: str
    params: dict[str, Any] = field(default_factory=dict)
    seed: int | None = None
    fsage_version: str = __version__
    format: int = FORMAT_VERSION

    def to_json(self) -> str:
        return json.dumps({"fsage_workload": asdict(self)}, sort_keys=True, separators=(",", ":"))


def write_workload(path: Path, header: WorkloadHeader, ops: Iterable[Op]) -> int:
    """Write header and ops (gzip when the name ends in .gz; ``-``: standard output); returns
    the op count.

    Gzip output has a fixed mtime so the same stream gives the same bytes.
    """
    count = 0
    if str(path) == "-":  # standard output, plain text
        out_text = sys.stdout
        out_text.write(header.to_json() + "\n")
        for op in ops:
            out_text.write(op.to_json() + "\n")
            count += 1
        out_text.flush()
        return count
    gz = path.suffix == ".gz"
    real, into = output_target(path)
    if into:  # a device or FIFO: written into
        with open(real, "wb") as fh:
            return _write_ops(fh, gz, header, ops)
    tmp = real.with_name(real.name + ".part")
    try:
        with open(tmp, "wb", opener=private_opener) as fh:  # an export names files: private
            count = _write_ops(fh, gz, header, ops)
    except BaseException:  # the ops failed (a damaged database...): no part left behind
        tmp.unlink(missing_ok=True)
        raise
    tmp.replace(real)
    return count


def _write_ops(fh: IO[bytes], gz: bool, header: WorkloadHeader, ops: Iterable[Op]) -> int:
    raw = cast(IO[bytes], gzip.GzipFile(filename="", fileobj=fh, mode="wb", mtime=0)) if gz else fh
    count = 0
    with io.TextIOWrapper(raw, encoding="utf-8", newline="\n") as out:
        out.write(header.to_json() + "\n")
        for op in ops:
            out.write(op.to_json() + "\n")
            count += 1
    return count


#: The longest line a stream may hold (an op is a few hundred bytes): a binary file with no
#: newline is refused without reading it whole.
LINE_MAX = 1 << 20
#: Ops that write ``size`` bytes of data (at ``offset``): refused beyond the target's capacity.
_WRITING = {"create": False, "append": False, "overwrite": True, "fallocate": True}


class _NotText(WorkloadError):
    """A line of the stream is not UTF-8."""


def _open_bytes(path: Path) -> IO[bytes]:
    """The stream's bytes, gunzipped when it is gzip."""
    if str(path) == "-":  # standard input, plain or gzip
        stdin = sys.stdin.buffer
        if isinstance(stdin, io.BufferedReader) and stdin.peek(2)[:2] == b"\x1f\x8b":
            return cast(IO[bytes], gzip.GzipFile(fileobj=stdin))
        return stdin
    try:
        fh = open(path, "rb")  # noqa: SIM115 - returned open
        try:
            magic = fh.read(2)
            fh.seek(0)
        except OSError:
            fh.close()
            raise
        if magic == b"\x1f\x8b":
            return cast(IO[bytes], gzip.GzipFile(fileobj=fh, mode="rb"))
        return fh
    except OSError as exc:
        raise WorkloadError(f"cannot read workload {path}: {exc.strerror}") from None


def _lines(path: Path, fh: IO[bytes]) -> Iterator[tuple[int, str]]:
    """(line number, text) of each line; a line that is not UTF-8, too long, or a stream cut
    short or damaged is one error naming the file and the line."""
    lineno = 0
    while True:
        lineno += 1
        try:
            raw = fh.readline(LINE_MAX + 1)
        except EOFError:  # gzip: the stream ends before its end marker
            raise WorkloadError(f"{path}:{lineno}: the gzip stream is cut short") from None
        except (OSError, zlib.error) as exc:  # gzip.BadGzipFile is an OSError
            raise WorkloadError(f"{path}:{lineno}: cannot read the stream ({exc})") from None
        if not raw:
            return
        if len(raw) > LINE_MAX:
            raise WorkloadError(f"{path}:{lineno}: a line longer than {LINE_MAX} bytes")
        try:
            yield lineno, raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _NotText(
                f"{path}:{lineno}: not UTF-8 text (byte {raw[exc.start]:#04x} at column"
                f" {exc.start + 1})"
            ) from None


def _json(line: str, where: str) -> Any:
    try:
        return json.loads(line)
    except RecursionError:
        raise WorkloadError(f"{where}JSON nested too deeply") from None
    except ValueError:
        raise WorkloadError(f"{where}not JSON") from None


def read_header(path: Path) -> WorkloadHeader:
    with _open_bytes(path) as fh:
        return _parse_header(_lines(path, fh), path)


def _parse_header(lines: Iterator[tuple[int, str]], path: Path) -> WorkloadHeader:
    try:
        first = next(lines, None)
    except _NotText:
        raise WorkloadError(f"{path}: not an fsage workload (not text)") from None
    if first is None:
        raise WorkloadError(f"{path}: not an fsage workload (empty)")
    try:
        data = json.loads(first[1])["fsage_workload"]
        header = WorkloadHeader(**data)
    except (ValueError, KeyError, TypeError, RecursionError):
        raise WorkloadError(f"{path}: not an fsage workload (no header line)") from None
    if not isinstance(header.generator, str) or not isinstance(header.params, dict):
        raise WorkloadError(f"{path}: not an fsage workload (a malformed header line)")
    return header


def read_workload(path: Path, capacity: int | None = None) -> tuple[WorkloadHeader, Iterator[Op]]:
    """The header now, and the ops lazily (a workload can be larger than memory).

    ``capacity``: the target's size in bytes; an op that would write more data than that (or
    past it) is refused before it runs, instead of writing until the disk is full."""
    fh = _open_bytes(path)
    lines = _lines(path, fh)
    try:
        header = _parse_header(lines, path)
    except BaseException:
        fh.close()
        raise

    def ops() -> Iterator[Op]:
        with fh:
            for lineno, line in lines:
                if not line.strip():
                    continue
                where = f"{path}:{lineno}: "
                data = _json(line, where)
                if not isinstance(data, dict):
                    raise WorkloadError(f"{where}not an op object")
                op = Op.from_json(data, where)
                if capacity is not None and op.op in _WRITING:
                    end = op.size + (op.offset if _WRITING[op.op] else 0)
                    if end > capacity:
                        raise WorkloadError(
                            f"{where}{op.op} of {op.size} bytes"
                            f"{f' at {op.offset}' if _WRITING[op.op] else ''} is more than"
                            f" the target holds ({capacity} bytes); nothing of it was written"
                        )
                yield op

    return header, ops()


class NoSpaceError(WorkloadError):
    """An op failed for lack of space; the executor undid what it had done of it, so the
    target is as before the op. The ager turns to deletes; a replay skips the op."""


class OpFailedError(WorkloadError):
    """An op could not run on the target (a missing path, a name already taken...)."""


class Executor(ABC):
    """Runs ops on one target. Every target (mounted tree, offline ext image, LFS image)
    implements this, so any workload runs anywhere."""

    #: One line shown to the user about how ops reach the disk.
    description: str = ""

    @abstractmethod
    def apply(self, op: Op) -> int:
        """Run one op; returns the bytes of file data it wrote."""

    @abstractmethod
    def capacity_blocks(self) -> tuple[int, int, int]:
        """(block size, total blocks, used blocks) as statvfs reports them."""

    def fullness(self) -> float:
        _, total, used = self.capacity_blocks()
        return used / total if total else 0.0

    def close(self) -> None:  # noqa: B027 - optional hook
        """Flush and release the target."""

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
