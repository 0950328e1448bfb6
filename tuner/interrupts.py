"""Ctrl-C and SIGTERM (a scheduler's stop) while a run trains: the first ends it at its round's end, with a
checkpoint, so the advised --resume works; a second stops it at once. Sweeps stop through Ray Tune, which
saves the experiment's state (tuner/sweep/stages.py)."""

from __future__ import annotations

import signal
from contextlib import contextmanager

from rich.console import Console


class StopAtRoundEnd:
    """Ctrl-C or SIGTERM (a scheduler's stop) while a run trains: the first ends the run at the end of its round,
    with a checkpoint; a second stops it at once."""

    def __init__(self, console: Console):
        self.console, self.requested = console, False

    def __call__(self) -> bool:
        return self.requested

    def signalled(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        self.console.print(
            "Stopping at the end of this round, with a checkpoint (Ctrl-C again stops at once).",
            markup=False,
            highlight=False,
        )

    @contextmanager
    def installed(self):
        before = {s: signal.signal(s, self.signalled) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for s, handler in before.items():
                signal.signal(s, handler)
