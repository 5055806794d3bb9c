"""The path under which each reachable directory's entries are named, for the first paths of
an export.

``Prefixes``: every directory's path in one bytes buffer, found by inode in a sorted array (a
directory takes its path's bytes and 24 more; a dict of path strings would cost some 150
more). ``DiskPrefixes``: the same paths in a SQLite scratch file, derived there by one
recursive query, so that a snapshot export's memory does not grow with its directories (at
one directory per 20 files and real paths, over 50 MB for ten million files, with the walk
that builds them twice that).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import numpy.typing as npt

from fsage.analyzer.spill import scratch_db

I64 = npt.NDArray[np.int64]


def _decode(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


class Prefixes:
    """``ino`` (sorted) -> its path, ``buf[start:end]`` (UTF-8, undecodable bytes kept as
    they are: decoded with surrogateescape, as the names are)."""

    def __init__(self, ino: I64, start: I64, end: I64, buf: bytes) -> None:
        self.ino, self.start, self.end, self.buf = ino, start, end, buf

    @classmethod
    def walk(
        cls, parent: I64, ino: I64, name_lo: I64, name_hi: I64, names: bytes, root_ino: int
    ) -> Prefixes:
        """The prefixes of the names (``parent``, ``ino``, ``names[name_lo:name_hi]``) whose
        inode names entries, given in link order, walked depth first from ``root_ino``
        (``""``) as ``derive_paths`` walks a tree: a directory's names are pushed in link
        order and the last one pushed is taken first; a directory reached by two names takes
        the one pushed first."""
        parent = parent.astype(np.int64, copy=False)
        ino = ino.astype(np.int64, copy=False)
        order = np.argsort(parent, kind="stable")  # each directory's names, in link order
        by_parent = parent[order]
        # the walk's nodes: every inode named, and the root
        nodes = np.unique(np.concatenate([ino, np.array([root_ino], np.int64)]))
        # indices of nodes and names: 4 bytes each where they fit, held over the whole walk
        t = np.int32 if ino.size < 2**31 else np.int64
        child = np.searchsorted(nodes, ino[order]).astype(t)  # node of each name, by parent
        lo = np.searchsorted(by_parent, nodes, side="left").astype(t)
        hi = np.searchsorted(by_parent, nodes, side="right").astype(t)
        name_lo = name_lo[order].astype(np.int64)
        name_hi = name_hi[order].astype(np.int64)
        del order, by_parent
        start = np.full(nodes.size, -1, np.int64)
        end = np.full(nodes.size, -1, np.int64)
        buf = bytearray()
        root = int(np.searchsorted(nodes, root_ino))
        start[root] = end[root] = 0
        stack = [root]
        while stack:
            d = stack.pop()
            head = bytes(buf[int(start[d]) : int(end[d])]) + b"/"
            for j in range(int(lo[d]), int(hi[d])):
                c = int(child[j])
                if start[c] >= 0:  # visited
                    continue
                start[c] = len(buf)
                buf += head
                buf += names[int(name_lo[j]) : int(name_hi[j])]
                end[c] = len(buf)
                stack.append(c)
        keep = start >= 0
        return cls(nodes[keep], start[keep], end[keep], bytes(buf))

    def __len__(self) -> int:
        return int(self.ino.size)

    def get(self, ino: int) -> str | None:
        k = int(np.searchsorted(self.ino, ino))
        if k >= self.ino.size or int(self.ino[k]) != ino:
            return None
        return _decode(self.buf[int(self.start[k]) : int(self.end[k])])

    def heads(self, parents: I64) -> list[str | None]:
        """The prefix of each of ``parents`` (None: not a reachable directory), each
        directory's decoded once."""
        if self.ino.size == 0:
            return [None] * int(parents.size)
        k = np.minimum(np.searchsorted(self.ino, parents), self.ino.size - 1)
        hit = self.ino[k] == parents
        seen: dict[int, str] = {}
        out: list[str | None] = []
        start, end, buf = self.start, self.end, self.buf
        for kk, h in zip(k.tolist(), hit.tolist(), strict=True):
            if not h:
                out.append(None)
                continue
            s = seen.get(kk)
            if s is None:
                s = seen[kk] = _decode(buf[int(start[kk]) : int(end[kk])])
            out.append(s)
        return out


# SQLite's page cache for the prefixes, in KiB: what the table holds beyond it stays on disk.
CACHE_KIB = 4096


class DiskPrefixes:
    """The prefixes of ``Prefixes`` kept in a SQLite file, so that an export's memory does not
    grow with the directories (some 100 bytes each in memory, more with long paths): the
    names whose inode names entries are added as a snapshot's names are read (``add``), then
    ``finish`` derives every reachable directory's path in one recursive query.

    That query takes each directory's one name; where a directory has two names (or a name
    loops back), which path it takes depends on the walk's order, and the names are walked
    in memory by ``Prefixes.walk`` instead, as before."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.con = scratch_db(path, CACHE_KIB)
        self.con.execute("CREATE TABLE name (seq INTEGER, parent INTEGER, ino INTEGER, name BLOB)")
        self.memory: Prefixes | None = None  # the walk in memory, for a tree that is not one
        self.n = 0

    def add(self, seq: I64, parent: I64, ino: I64, name_lo: I64, name_hi: I64,
            names: bytes) -> None:  # fmt: skip
        """Names ``names[name_lo[i]:name_hi[i]]`` of ``ino`` in ``parent`` (``seq``: the
        place in link order)."""
        view = memoryview(names)
        rows = zip(seq.tolist(), parent.tolist(), ino.tolist(), name_lo.tolist(),
                   name_hi.tolist(), strict=True)  # fmt: skip
        self.con.executemany(
            "INSERT INTO name VALUES (?, ?, ?, ?)",
            ((s, p, i, bytes(view[lo:hi])) for s, p, i, lo, hi in rows),
        )
        self.n += int(seq.size)

    def finish(self, root_ino: int) -> None:
        """Every reachable directory's path, from ``root_ino`` (``""``)."""
        con = self.con
        twice = con.execute(
            "SELECT 1 FROM name WHERE ino != ? AND ino != parent GROUP BY ino"
            " HAVING count(*) > 1 LIMIT 1",
            (root_ino,),
        ).fetchone()
        if twice is not None:
            self.memory = self._walked(root_ino)
            con.execute("DROP TABLE name")
            return
        # a tree: each directory but the root has one name, so no walk order to keep, and
        # no loop (one through the root is cut: the root's own names are left out)
        con.executescript(
            "CREATE INDEX name_parent ON name (parent);"
            "CREATE TABLE prefix (ino INTEGER PRIMARY KEY, path BLOB);"
        )
        con.execute(
            """INSERT INTO prefix
            WITH RECURSIVE p(ino, path) AS (
                SELECT ?, CAST(x'' AS BLOB)
                UNION ALL
                SELECT n.ino, CAST(p.path || x'2f' || n.name AS BLOB)
                FROM name AS n JOIN p ON n.parent = p.ino
                WHERE n.ino != ? AND n.ino != n.parent
            )
            SELECT ino, path FROM p""",
            (root_ino, root_ino),
        )
        con.execute("DROP TABLE name")

    def _walked(self, root_ino: int) -> Prefixes:
        rows = self.con.execute("SELECT parent, ino, name FROM name ORDER BY seq").fetchall()
        parent = np.array([r[0] for r in rows], np.int64)
        ino = np.array([r[1] for r in rows], np.int64)
        lens = np.array([len(r[2]) for r in rows], np.int64)
        off = np.zeros(len(rows) + 1, np.int64)
        np.cumsum(lens, out=off[1:])
        names = b"".join(r[2] for r in rows)
        del rows
        return Prefixes.walk(parent, ino, off[:-1], off[1:], names, root_ino)

    def __len__(self) -> int:
        if self.memory is not None:
            return len(self.memory)
        return int(self.con.execute("SELECT count(*) FROM prefix").fetchone()[0])

    def get(self, ino: int) -> str | None:
        return self.heads(np.array([ino], np.int64))[0]

    def heads(self, parents: I64) -> list[str | None]:
        """As ``Prefixes.heads``: the prefix of each of ``parents`` (None: not a reachable
        directory)."""
        if self.memory is not None:
            return self.memory.heads(parents)
        # the inodes as one JSON array: one statement whatever their number (a list of
        # parameters as long as theirs is a statement for each length, and SQLite's
        # statement cache kept up to 128 of them, 9 MiB more over a snapshot's parts)
        wanted = json.dumps(np.unique(parents).tolist())
        found = {
            ino: _decode(path)
            for ino, path in self.con.execute(
                "SELECT ino, path FROM prefix WHERE ino IN (SELECT value FROM json_each(?))",
                (wanted,),
            )
        }
        return [found.get(p) for p in parents.tolist()]

    def close(self) -> None:
        self.con.close()
        self.path.unlink(missing_ok=True)
