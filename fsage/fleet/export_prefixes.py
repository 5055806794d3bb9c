"""The path under which each reachable directory's entries are named, for the first paths of
an export: every directory's path in one bytes buffer, found by inode in a sorted array.

A dict of path strings costs some 150 bytes a directory beside the strings themselves (at one
directory per 20 files, tens of MB for a few million files, held over every part of a
snapshot); here a directory takes its path's bytes and 24 more.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

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
