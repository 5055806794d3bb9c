"""The files a match takes over from the disk (``fsage age T --match --resume``): those of a
match resumed in its rounds (``adopt``), and those a first fill stopped in its planned files
had written whole, kept rather than written again (``resume_fill``).

A part of ``match_fill.MatchWriter``.
"""

from __future__ import annotations

from typing import Any

from fsage.ager.match_disk import AREA, Disk


class KeptFiles:
    """The files a resumed match keeps (a part of ``MatchWriter``)."""

    disk: Disk
    paths: dict[int, str]
    sizes: dict[str, int]
    serial: int
    spacer_serial: int
    dirs_made: set[str]
    _kept: dict[str, int]
    _kept_ino: dict[str, int]
    _inputs: dict[str, Any] | None

    def resume_fill(self, inputs: dict[str, Any]) -> None:
        """Go on with a first fill stopped in its planned files (``inputs``: what its plan
        was drawn from, as ``on_fill`` was told): the plan is drawn again from the same seed,
        and the files on disk that it holds whole are kept rather than written again."""
        self.adopt()
        self._kept = dict(self.sizes)
        self._kept_ino = {rel: ino for ino, rel in self.paths.items()}
        self.paths.clear()
        self.sizes.clear()
        self.serial = self.spacer_serial = 0
        # Made ahead and not written yet: written in place, keeping their inodes.
        self.disk.made_ahead([rel for rel, size in self._kept.items() if size == 0])
        self._inputs = inputs

    def _kept_whole(self, rel: str, least: int) -> bool:
        """Whether ``rel`` is a file of the resumed fill written whole (at least ``least``
        bytes) before it stopped: then it is the matcher's again, as it is."""
        size = self._kept.pop(rel, 0)
        if size < least:
            if size:
                self._kept[rel] = size  # cut short: written again, or deleted after
            return False
        self.paths[self._kept_ino[rel]] = rel
        self.sizes[rel] = size
        return True

    def _drop_unkept(self) -> None:
        """The resumed fill's files it did not keep (cut short and then left out of the
        plan) are deleted; those made ahead and never written go with ``drop_precreated``."""
        for rel, size in self._kept.items():
            if size and rel not in self.sizes:
                self.disk.unlink(rel)
        self._kept = {}
        self._inputs = None

    def adopt(self) -> None:
        """Take over the files in the matcher's area as its own (a match resumed in its
        rounds): their inodes and sizes as the disk holds them, and the next paths after the
        highest numbers taken."""
        layout = self.disk.layout()
        isdir = layout.files.is_dir()
        index = {int(ino): i for i, ino in enumerate(layout.files.ino)}
        for ino, paths in layout.paths().items():
            for p in paths:
                rel = p.lstrip("/")
                if not rel.startswith(AREA + "/"):
                    continue
                rel = rel[len(AREA) + 1 :]
                if isdir[index[int(ino)]]:
                    self.dirs_made.add(rel)
                    continue
                self.paths[int(ino)] = rel
                self.sizes[rel] = int(layout.files.size[index[int(ino)]])
                name = rel.rsplit("/", 1)[-1]
                if name[1:].isdigit() and name[0] == "f":
                    self.serial = max(self.serial, int(name[1:]) + 1)
                elif name[1:].isdigit() and name[0] == "s":
                    self.spacer_serial = max(self.spacer_serial, int(name[1:]))
