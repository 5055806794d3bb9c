"""The directory tree of a path walk in a SQLite scratch file: each directory's depth below the
root, subtree size and walk position found by queries there, so that the walk keeps no array
a directory in memory (the arrays it kept cost some 75 bytes a directory: 200 MB passed at
about 14 million files, 20 a directory).

A directory is one of the files that name entries, numbered in inode order (``idx``). Its
``size`` is itself and every entry below it, ``pos`` its place in a depth-first walk by name
(the root's is 0), ``off`` the entries its parent's walk takes before it. An ``edge`` is an
entry naming a directory, numbered by its place in the walk (``seq``), with its index ``j``
among its parent's entries. Depths and positions follow each directory's one parent from the
root (a recursive query: a tree, so no loop); sizes are summed level by level from the
deepest, as ``dynamic.preorder_sizes`` sums them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from fsage.analyzer.spill import scratch_db

I64 = npt.NDArray[np.int64]

# SQLite's page cache for the tree, in KiB: sorts and temporary tables spill past it to disk.
CACHE_KIB = 8192


def _pairs(con: Any, sql: str, lo: int, hi: int) -> tuple[I64, I64]:
    """The two integer columns of ``sql``'s rows for the range ``lo``, ``hi``."""
    rows = con.execute(sql, (lo, hi)).fetchall()
    both = np.array(rows, np.int64).reshape(len(rows), 2)
    return both[:, 0].copy(), both[:, 1].copy()


class DirTree:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.con = scratch_db(path, CACHE_KIB)
        self.con.executescript(
            """CREATE TABLE dir (idx INTEGER PRIMARY KEY, ino INTEGER, pino INTEGER,
                par INTEGER DEFAULT -1, cnt INTEGER DEFAULT 0, dep INTEGER DEFAULT -1,
                size INTEGER DEFAULT 0, off INTEGER DEFAULT 0, pos INTEGER DEFAULT -1);
            CREATE TABLE cand (seq INTEGER PRIMARY KEY, ino INTEGER, j INTEGER);"""
        )
        self.n = 0

    def add_dirs(self, ino: I64, parent_ino: I64, entries: I64) -> None:
        """The next directories in inode order, with their parents' inodes (-1: none) and
        the entries the walk takes of each."""
        idx = range(self.n, self.n + ino.size)
        self.con.executemany(
            "INSERT INTO dir (idx, ino, pino, cnt) VALUES (?, ?, ?, ?)",
            zip(idx, ino.tolist(), parent_ino.tolist(), entries.tolist(), strict=True),
        )
        self.n += int(ino.size)

    def link_parents(self) -> None:
        """Each directory's parent as an index (-1: its parent is not a directory here)."""
        self.con.executescript(
            """CREATE INDEX dir_ino ON dir (ino);
            UPDATE dir SET par = coalesce(
                (SELECT min(p.idx) FROM dir AS p WHERE p.ino = dir.pino), -1
            ) WHERE pino >= 0;"""
        )

    def add_candidates(self, seq: I64, ino: I64, j: I64) -> None:
        """Entries that may name a directory: their place in the walk, inode and index among
        their parent's entries (those whose inode is no directory here are dropped)."""
        self.con.executemany(
            "INSERT INTO cand VALUES (?, ?, ?)",
            zip(seq.tolist(), ino.tolist(), j.tolist(), strict=True),
        )

    def place(self, root_ino: int) -> None:
        """Depths, subtree sizes, offsets and walk positions from the directory ``root_ino``
        (none reached when it is not one)."""
        con = self.con
        con.executescript(
            """CREATE TABLE edge (seq INTEGER PRIMARY KEY, q INTEGER, j INTEGER);
            INSERT INTO edge SELECT seq, q, j FROM (
                SELECT c.seq, (SELECT min(d.idx) FROM dir AS d WHERE d.ino = c.ino) AS q, c.j
                FROM cand AS c) WHERE q IS NOT NULL ORDER BY seq;
            DROP TABLE cand;
            CREATE INDEX edge_q ON edge (q);
            CREATE INDEX dir_par ON dir (par);"""
        )
        root = con.execute("SELECT min(idx) FROM dir WHERE ino = ?", (root_ino,)).fetchone()
        if root[0] is None:
            return
        # the root's parent cut, so that no path returns to it (the queries below follow the
        # one parent of each directory from it: a tree, so no loop)
        con.execute("UPDATE dir SET par = -1 WHERE idx = ?", (root[0],))
        con.execute(
            """WITH RECURSIVE r(idx, dep) AS (
                SELECT ?, 0 UNION ALL SELECT c.idx, r.dep + 1 FROM r JOIN dir AS c ON c.par = r.idx
            ) UPDATE dir SET dep = r.dep, size = 1 + cnt FROM r WHERE dir.idx = r.idx""",
            (root[0],),
        )
        con.execute("CREATE INDEX dir_dep ON dir (dep)")
        deepest = int(con.execute("SELECT max(dep) FROM dir").fetchone()[0])
        for d in range(deepest, 0, -1):
            # each entry naming a directory of depth d adds its subtree to the directory's
            # parent (twice for a directory named twice, as the walk in memory adds it)
            con.execute(
                """UPDATE dir SET size = dir.size + t.s FROM (
                    SELECT c.par AS p, sum(c.size - 1) AS s
                    FROM dir AS c JOIN edge AS e ON e.q = c.idx WHERE c.dep = ? GROUP BY c.par
                ) AS t WHERE dir.idx = t.p""",
                (d,),
            )
        # the subtrees a parent's walk takes before each entry, and the entries before it;
        # a directory named twice keeps its last name's, in (parent, index, walk) order
        con.executescript(
            """CREATE TABLE offs (q INTEGER PRIMARY KEY, off INTEGER);
            INSERT OR REPLACE INTO offs
                SELECT e.q, coalesce(sum(c.size - 1) OVER w, 0) + e.j
                FROM edge AS e JOIN dir AS c ON c.idx = e.q
                WINDOW w AS (PARTITION BY c.par ORDER BY e.j, e.seq
                             ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
                ORDER BY c.par, e.j, e.seq;
            UPDATE dir SET off = offs.off FROM offs WHERE dir.idx = offs.q;
            DROP TABLE offs;"""
        )
        con.execute(
            """WITH RECURSIVE r(idx, pos) AS (
                SELECT ?, 0 UNION ALL
                SELECT c.idx, r.pos + 1 + c.off FROM r JOIN dir AS c ON c.par = r.idx
            ) UPDATE dir SET pos = r.pos FROM r WHERE dir.idx = r.idx""",
            (root[0],),
        )

    def placed(self, lo: int, hi: int) -> tuple[npt.NDArray[np.bool_], I64]:
        """Whether the walk reaches directories ``lo``..``hi`` (inclusive), and their
        positions."""
        dep, pos = _pairs(
            self.con, "SELECT dep, pos FROM dir WHERE idx BETWEEN ? AND ? ORDER BY idx", lo, hi
        )
        return dep >= 0, pos

    def edge_sizes(self, lo: int, hi: int) -> tuple[I64, I64]:
        """The entries of walk places ``lo``..``hi``-1 that name a directory: their places
        and the directories' subtree sizes."""
        return _pairs(
            self.con,
            "SELECT e.seq, d.size FROM edge AS e JOIN dir AS d ON d.idx = e.q"
            " WHERE e.seq >= ? AND e.seq < ? ORDER BY e.seq",
            lo,
            hi,
        )

    def close(self) -> None:
        self.con.close()
        self.path.unlink(missing_ok=True)
