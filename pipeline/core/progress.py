"""Progress of long work with an ETA: what runs, k of n, elapsed and time left.

In: the total, then ``update(k, what)`` after each step. Out: on a terminal, a bar redrawn on one
line; in a log (a pipe, CI, ``make bench`` capturing output), a plain line every ``every`` of the
way, so a log is not flooded with carriage returns. ``around(log)`` wraps a line printer (the
runner's) so that its lines go above the bar instead of through it. The time left is the mean
step time so far times the steps left: reused (cached) steps count as fast ones. Standard library
only; ``clock`` is injectable for tests.
"""
from __future__ import annotations

import sys
import time


def hms(seconds: float) -> str:
    s = int(max(seconds, 0))
    return f"{s // 3600}h{s // 60 % 60:02d}m{s % 60:02d}s" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


class Progress:
    def __init__(self, total: int, label: str, stream=None, width: int = 24, every: float = 0.1,
                 clock=time.monotonic, unit: str = "steps"):
        self.total, self.label, self.width, self.unit = max(total, 1), label, width, unit
        self.stream = stream or sys.stdout
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.every = max(1, int(self.total * every))
        self.clock, self.t0 = clock, clock()
        self.shown = ""  # the bar currently on the terminal's last line

    def line(self, k: int, what: str = "") -> str:
        elapsed = self.clock() - self.t0
        rate = k / elapsed if elapsed > 0 else 0.0
        left = (self.total - k) / rate if rate > 0 else 0.0
        head = f"  {self.label}"
        if self.tty:
            done = int(self.width * min(k, self.total) / self.total)
            head += f" [{'#' * done}{'-' * (self.width - done)}]"
        return (f"{head} {k}/{self.total} {self.unit}, elapsed {hms(elapsed)}, "
                f"about {hms(left)} left" + (f": {what}" if what else ""))

    def update(self, k: int, what: str = "") -> None:
        if self.tty:
            self.shown = self.line(k, what)
            self.stream.write("\r\x1b[K" + self.shown + ("\n" if k >= self.total else ""))
            if k >= self.total:
                self.shown = ""
        elif k % self.every == 0 or k >= self.total or k == 1:
            self.stream.write(self.line(k, what) + "\n")
        self.stream.flush()

    def done(self) -> None:
        """Ends the bar's line on a terminal (a search that stopped before its total)."""
        if self.tty and self.shown:
            self.stream.write("\n")
            self.stream.flush()
            self.shown = ""

    def around(self, log):
        """``log`` printing above the bar: the bar is cleared, the line printed, the bar redrawn."""
        def wrapped(msg: str) -> None:
            if self.tty and self.shown:
                self.stream.write("\r\x1b[K")
                self.stream.flush()
            log(msg)
            if self.tty and self.shown:
                self.stream.write(self.shown)
                self.stream.flush()
        return wrapped
