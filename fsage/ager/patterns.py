"""Write patterns of real use, as bursts of ops the generator mixes in, and what the presets
built from them (``fsage.ager.profile.PRESETS``) model.

Whole-file creates are laid out contiguously by delayed allocation, so create/delete churn alone
ages a modern file system little. Real file systems age through how data arrives: several files
growing at once, logs growing by small appends with fsyncs, databases rewriting pages in place
and punching holes, editors and version control writing a new copy and renaming it over the
old, whole trees unpacked and removed, news spools of small files replaced all day. Each
pattern here is a mix kind (a profile's ``mix`` weights it like ``create``); when the churn
picks it, it yields a burst of ordinary ops (create, append, overwrite, punch, fallocate,
rename, delete, fsync, sync), keeping the generator's model in step op by op, so the stream
runs on every executor that runs those ops.

Pattern files are recognised by their names (``.log``, ``.db``, ``.art``), so a resumed run
takes them back from the tree it adopts.
"""

from __future__ import annotations

import math
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fsage.ager.distributions import KIB, MIB, HybridSize
from fsage.workload import Op

if TYPE_CHECKING:
    from fsage.ager.generator import Generator

#: The mix kinds this module adds, with what each models.
PATTERNS: dict[str, str] = {
    "streams": "four files (256 KiB-8 MiB) growing at once by interleaved 64 KiB appends, a sync "
    "per round (downloads, recorders, parallel log writers: allocation happens between the "
    "appends)",
    "log": "a log growing by small appends (256 B-8 KiB) with an fsync every fourth, rotated "
    "(renamed to .1 over the previous one) past 4 MiB",
    "dbwrite": "a database file: grown by 256 KiB-1 MiB extensions, 16 random in-place page "
    "writes (4-16 KiB), now and then a punched hole (64 KiB-1 MiB), then an fsync",
    "replace": "write a new copy beside a file, fsync it, rename it over the old one (editors, "
    "package managers, version control)",
    "tree": "unpack a tree: a new directory of 2-3 levels holding 20-200 small files",
    "rmtree": "remove a whole directory tree (files, then directories, deepest first)",
    "spool": "a news spool: 16 small articles into a few group directories, the oldest expired "
    "first once the spool is at the fill target",
    "prealloc": "fallocate a file (256 KiB-16 MiB) whole, then write it by 64 KiB chunks in random "
    "order (torrents, VM images)",
    "trickle": "128 files (the profile's sizes, up to 1 MiB) arriving in one directory by 1-8 "
    "KiB pieces, 32 at a time (a finished one is followed by the next; the last eight finish in "
    "one write each), a sync per round (mail deliveries, caches, slow downloads: each writeback "
    "allocates the pieces that came since the last, side by side)",
}
PATTERN_KINDS = tuple(PATTERNS)

_LOG_MAX = 4 * MIB
_MAX_LOGS = 8
_MAX_DBS = 4
_SPOOL_GROUPS = 8
_TRICKLE_WRITERS = 32
_TRICKLE_FILES = 128
_TRICKLE_MAX = 1 * MIB
_TRICKLE_PIECES = (1 * KIB, 2 * KIB, 4 * KIB, 8 * KIB)
#: Small articles (seed 000's news partition: files of a few KiB).
NEWS_SIZES = HybridSize(mu=7.8, sigma=0.9, weight=0.995, xm=64 * KIB, alpha=1.5, cap=1 * MIB)


@dataclass
class _State:
    logs: list[str] = field(default_factory=list)
    dbs: list[str] = field(default_factory=list)
    db_target: int = 0
    spool_dirs: list[str] = field(default_factory=list)
    articles: deque[str] = field(default_factory=deque)


_STATES: weakref.WeakKeyDictionary[Generator, _State] = weakref.WeakKeyDictionary()


def _state(gen: Generator) -> _State:
    st = _STATES.get(gen)
    if st is None:
        st = _State()
        # A resumed run: take the pattern files back from the adopted tree.
        for path in sorted(gen.files):
            if path.endswith(".log"):
                st.logs.append(path)
            elif path.endswith(".db"):
                st.dbs.append(path)
            elif path.endswith(".art"):
                st.articles.append(path)
        st.spool_dirs = sorted(d for d in gen.dir_depth if d.rsplit("/", 1)[-1].startswith("grp"))
        st.db_target = max(MIB, gen.capacity // 50)
        _STATES[gen] = st
    return st


def run_pattern(gen: Generator, kind: str) -> Iterator[Op]:
    """The burst of ops of pattern ``kind`` (one of ``PATTERN_KINDS``)."""
    yield from _RUNNERS[kind](gen, _state(gen))


# ---------------------------------------------------------------------- model helpers


def _new_file(gen: Generator, parent: str, size: int, suffix: str = "") -> tuple[str, Op]:
    name = gen._new_name(parent) + suffix
    path = gen._add_file(parent, name, size)
    gen._undo = gen._dropper(path)
    return path, Op("create", path, size=size)


def _append(gen: Generator, path: str, size: int) -> Op:
    old = gen.files[path].size
    gen._resize(path, old + size)
    gen._undo = lambda: gen._resize(path, old)
    return Op("append", path, size=size)


def _remove(gen: Generator, path: str) -> Op:
    rec = gen._drop_file(path)

    def undo() -> None:
        gen._add_file(rec.parent, path.rsplit("/", 1)[-1], rec.size)
        gen.files[path].born = rec.born

    gen._undo = undo
    return Op("delete", path)


def _rename_over(gen: Generator, src: str, dest: str) -> Op:
    """Rename file ``src`` to ``dest``, replacing the file there if any."""
    rec = gen._drop_file(src)
    if dest in gen.files:
        gen._drop_file(dest)
    parent, _, name = dest.rpartition("/")
    gen._add_file(parent, name, rec.size)
    gen.files[dest].born = rec.born
    gen._undo = None
    return Op("rename", src, dest=dest)


def _sync_op(gen: Generator, path: str = "") -> Op:
    gen._undo = None
    return Op("fsync", path) if path else Op("sync")


def _room(gen: Generator) -> int:
    return gen._free_bytes()


def _large(gen: Generator, lo: int, hi: int) -> int:
    """A size log-uniform in [lo, hi] bytes (downloads, images: the big files of a desktop),
    capped by a quarter of the room left."""
    size = int(math.exp(gen.rng.uniform(math.log(lo), math.log(hi))))
    return min(size, _room(gen) // 4)


def _plain_files(gen: Generator) -> str | None:
    """A random file that no pattern owns (None when there is none)."""
    for _ in range(8):
        if not gen.file_bag:
            return None
        p = gen.file_bag.pick(gen.rng)
        if not p.endswith((".log", ".db", ".art")):
            return p
    return None


# ---------------------------------------------------------------------- patterns


def _streams(gen: Generator, st: _State) -> Iterator[Op]:
    chunk = 64 * KIB
    files: list[tuple[str, int]] = []
    for _ in range(4):
        want = _large(gen, 256 * KIB, 8 * MIB)
        if want < chunk:
            continue
        path, op = _new_file(gen, gen._pick_parent(), 0)
        yield op
        if path not in gen.files:
            return
        files.append((path, want))
    grown = dict.fromkeys((p for p, _w in files), 0)
    for _round in range(256):
        active = [(p, w) for p, w in files if grown[p] < w]
        if not active:
            return
        for path, want in active:
            n = min(chunk, want - grown[path], _room(gen))
            if n <= 0 or path not in gen.files:
                return
            yield _append(gen, path, n)
            if gen.files[path].size == grown[path]:  # ran out of space
                return
            grown[path] += n
        yield _sync_op(gen)


def _log(gen: Generator, st: _State) -> Iterator[Op]:
    rng = gen.rng
    st.logs = [p for p in st.logs if p in gen.files]
    if len(st.logs) < _MAX_LOGS and (not st.logs or rng.random() < 0.1):
        path, op = _new_file(gen, gen._pick_parent(), 0, ".log")
        yield op
        if path not in gen.files:
            return
        st.logs.append(path)
    path = st.logs[rng.randrange(len(st.logs))]
    for i in range(16):
        n = min(rng.choice((256, 512, 1024, 2048, 4096, 8192)), _room(gen))
        if n <= 0:
            return
        yield _append(gen, path, n)
        if (i + 1) % 4 == 0:
            yield _sync_op(gen, path)
    if gen.files[path].size > _LOG_MAX:
        yield _rename_over(gen, path, path + ".1")  # the rotated log replaces the older one
        st.logs.remove(path)


def _dbwrite(gen: Generator, st: _State) -> Iterator[Op]:
    rng = gen.rng
    st.dbs = [p for p in st.dbs if p in gen.files]
    if len(st.dbs) < _MAX_DBS and (not st.dbs or rng.random() < 0.05):
        path, op = _new_file(gen, gen._pick_parent(), min(MIB, _room(gen)), ".db")
        yield op
        if path not in gen.files:
            return
        st.dbs.append(path)
    path = st.dbs[rng.randrange(len(st.dbs))]
    size = gen.files[path].size
    if size < st.db_target and rng.random() < 0.5:
        n = min(rng.choice((256, 512, 1024)) * KIB, _room(gen))
        if n > 0:
            yield _append(gen, path, n)
            if gen.files[path].size == size:
                return
            size += n
    page = rng.choice((4, 8, 16)) * KIB
    pages = size // page
    if pages:
        for _ in range(16):
            gen._undo = None
            yield Op("overwrite", path, size=page, offset=rng.randrange(pages) * page)
        if rng.random() < 0.2 and pages > 16:
            n = min(pages // 4, rng.choice((16, 64, 256)))
            first = rng.randrange(pages - n)
            gen._undo = None
            # Blocks freed in the model would be refilled by later page writes; the model keeps
            # the file's size (what a punch keeps), and the real fullness steers the fill.
            yield Op("punch", path, size=n * page, offset=first * page)
    yield _sync_op(gen, path)


def _replace(gen: Generator, st: _State) -> Iterator[Op]:
    rng = gen.rng
    target = _plain_files(gen)
    if target is None:
        return
    old = gen.files[target].size
    new = min(max(1, int(old * rng.uniform(0.8, 1.25))), _room(gen))
    parent = gen.files[target].parent
    tmp, op = _new_file(gen, parent, new, ".tmp")
    yield op
    if tmp not in gen.files:
        return
    yield _sync_op(gen, tmp)
    yield _rename_over(gen, tmp, target)


def _tree(gen: Generator, st: _State) -> Iterator[Op]:
    rng = gen.rng
    parent = gen._pick_parent()
    if gen.dir_depth[parent] >= gen.profile.max_depth - 3:
        parent = ""
    top = gen._mkdir(parent)
    yield top
    if top.path not in gen.dir_depth:
        return
    dirs = [top.path]
    for _ in range(rng.randrange(1, 6)):
        d = gen._mkdir(dirs[rng.randrange(len(dirs))])
        yield d
        if d.path not in gen.dir_depth:
            return
        dirs.append(d.path)
    for _ in range(rng.randrange(20, 201)):
        size = gen.profile.sizes.sample(rng, cap=min(MIB, _room(gen)))
        path, op = _new_file(gen, dirs[rng.randrange(len(dirs))], size)
        yield op
        if path not in gen.files:
            return


def _subtree(gen: Generator, top: str) -> tuple[list[str], list[str]]:
    """(files, directories) below ``top`` (itself included), directories deepest first."""
    dirs: list[str] = []
    files: list[str] = []
    stack = [top]
    while stack:
        d = stack.pop()
        dirs.append(d)
        for name in gen.dir_names[d]:
            p = gen._join(d, name)
            if p in gen.dir_depth:
                stack.append(p)
            elif p in gen.files:
                files.append(p)
    dirs.sort(key=lambda p: (-p.count("/"), p))
    return sorted(files), dirs


def _rmdir(gen: Generator, path: str) -> Op:
    gen._drop_dir(path)
    gen._undo = None
    return Op("delete", path)


def _rmtree(gen: Generator, st: _State) -> Iterator[Op]:
    rng = gen.rng
    limit = max(50, len(gen.files) // 50)
    for _ in range(8):
        if len(gen.all_dirs) < 2:
            return
        top = gen.all_dirs[rng.randrange(1, len(gen.all_dirs))]
        if top.rsplit("/", 1)[-1].startswith("grp"):
            continue  # a spool's group directory stays
        files, dirs = _subtree(gen, top)
        if len(files) <= limit:
            break
    else:
        return
    for path in files:
        yield _remove(gen, path)
    for d in dirs:
        yield _rmdir(gen, d)


def _spool(gen: Generator, st: _State) -> Iterator[Op]:
    rng = gen.rng
    if len(st.spool_dirs) < _SPOOL_GROUPS:
        parent = ""
        name = f"grp{len(st.spool_dirs):02d}"
        if name not in gen.dir_names[parent]:
            gen._add_dir(parent, name, name)
            gen._undo = None
            yield Op("mkdir", name)
        st.spool_dirs.append(name)
        return
    sizes = NEWS_SIZES
    for _ in range(16):
        group = st.spool_dirs[rng.randrange(len(st.spool_dirs))]
        path, op = _new_file(gen, group, sizes.sample(rng, cap=min(MIB, _room(gen))), ".art")
        yield op
        if path not in gen.files:
            return
        st.articles.append(path)
    # Expiry: the oldest articles go once the spool holds the fill target.
    while st.articles and gen.fullness() > gen.profile.fill:
        for _ in range(16):
            if not st.articles:
                break
            old = st.articles.popleft()
            if old in gen.files:
                yield _remove(gen, old)


def _prealloc(gen: Generator, st: _State) -> Iterator[Op]:
    rng = gen.rng
    size = _large(gen, 256 * KIB, 16 * MIB)
    chunk = 64 * KIB
    if size < 2 * chunk:
        return
    size -= size % chunk
    path, op = _new_file(gen, gen._pick_parent(), 0)
    yield op
    if path not in gen.files:
        return
    gen._resize(path, size)
    gen._undo = lambda: gen._resize(path, 0)
    yield Op("fallocate", path, size=size)
    if gen.files[path].size != size:
        return
    order = list(range(size // chunk))
    rng.shuffle(order)
    for i in order:
        gen._undo = None
        yield Op("overwrite", path, size=chunk, offset=i * chunk)
    yield _sync_op(gen, path)


def _trickle(gen: Generator, st: _State) -> Iterator[Op]:
    rng = gen.rng
    parent = gen._pick_parent()  # one directory: its files are allocated in the same group
    waiting = _TRICKLE_FILES
    files: list[tuple[str, int]] = []  # (path, size it grows to), at most _TRICKLE_WRITERS
    while True:
        # A writer that finished is followed by the next file, so the interleaving goes on.
        while waiting and len(files) < _TRICKLE_WRITERS:
            waiting -= 1
            want = gen.profile.sizes.sample(rng, cap=min(_TRICKLE_MAX, _room(gen) // 8))
            if want <= 0:
                continue
            path, op = _new_file(gen, parent, 0)
            yield op
            if path not in gen.files:
                return
            files.append((path, want))
        if not files:
            return
        # The last few writers have too little to interleave with: the rest of each arrives
        # in one write (rather than a sync per piece of one or two files).
        alone = not waiting and len(files) <= _TRICKLE_WRITERS // 4
        for path, want in files:
            piece = want if alone else rng.choice(_TRICKLE_PIECES)
            n = min(piece, want - gen.files[path].size, _room(gen))
            if n <= 0:
                return
            size = gen.files[path].size
            yield _append(gen, path, n)
            if path not in gen.files or gen.files[path].size == size:  # ran out of space
                return
        files = [(p, w) for p, w in files if gen.files[p].size < w]
        if not alone:
            yield _sync_op(gen)


_RUNNERS: dict[str, Callable[[Generator, _State], Iterator[Op]]] = {
    "streams": _streams,
    "log": _log,
    "dbwrite": _dbwrite,
    "replace": _replace,
    "tree": _tree,
    "rmtree": _rmtree,
    "spool": _spool,
    "prealloc": _prealloc,
    "trickle": _trickle,
}


# ---------------------------------------------------------------------- presets

#: What each preset models (README and ``fsage age --help``).
PRESET_DOCS: dict[str, str] = {
    "desktop": "a workstation home directory: hFS sizes; editors and office suites saving by "
    "rename-over, application logs, downloads growing side by side and preallocated, "
    "unpacked and removed trees, plus plain creates and deletes",
    "news": "seed 000's news partition: small articles created into group directories all day "
    "and expired oldest first, with the server's logs (filled to 0.8, its articles need about "
    "one inode per 4 KiB: mkfs.ext4 -T news)",
    "vcs": "a version-control work tree: checkouts unpacking trees, edits and updates written "
    "new and renamed over the old file, whole trees removed, the tool's logs",
    "database": "a database server: table files grown by extensions and rewritten by page, "
    "holes punched, write-ahead logs appended with fsyncs, temporary files",
    "mail": "a mail server: messages and attachments (hFS sizes up to 1 MiB) arriving side by side "
    "in a directory by small pieces (each writeback allocates what came since the last), "
    "mailboxes rewritten and renamed over, its logs, old mail deleted",
}
