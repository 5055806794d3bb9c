"""How a run of ``fsage age`` stops on Ctrl-C or SIGTERM: between two ops."""

from __future__ import annotations

import signal
from types import FrameType
from typing import Any


class _Interrupt:
    """Ctrl-C or SIGTERM stops a run between two ops (its record and journal consistent, a
    mounted image unmounted, exit status 130 or 143); a second one stops it now. Held from
    before the target is opened, so a signal while an image is being mounted or a run set up
    stops it before its first op instead of leaving a mount behind."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.hit = False
        self.signum = 0
        self._old: dict[int, Any] = {}

    def __enter__(self) -> _Interrupt:
        import threading

        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._old[sig] = signal.signal(sig, self._handler)
        return self

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        if self.hit:  # a second signal: stop now
            raise KeyboardInterrupt
        self.hit = True
        self.signum = signum

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
