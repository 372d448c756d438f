"""A plain-text progress bar for the recovery fine-tune (minutes of work inside a stage).

In: the total step count, then ``update(step, loss)`` after every step. Out: a bar with the step,
the loss, the rate and the time left, on the given stream. On a terminal it redraws one line;
in a log (a pipe, CI, ``make bench`` capturing output) it prints a line every ``every`` of the
way instead, so a log is not flooded with carriage returns. Standard library only.
"""
from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, total: int, label: str = "recovery", stream=None, width: int = 24,
                 every: float = 0.1):
        self.total, self.label, self.width = total, label, width
        self.stream = stream or sys.stdout
        self.tty = self.stream.isatty()
        self.every = max(1, int(total * every))
        self.t0 = time.monotonic()

    def line(self, step: int, loss: float) -> str:
        elapsed = time.monotonic() - self.t0
        rate = step / elapsed if elapsed > 0 else 0.0
        left = (self.total - step) / rate if rate > 0 else 0.0
        done = int(self.width * step / self.total)
        return (f"  {self.label} [{'#' * done}{'-' * (self.width - done)}] {step}/{self.total} "
                f"loss {loss:.4f}  {rate:.2f} steps/s  {int(left) // 60}m{int(left) % 60:02d}s left")

    def update(self, step: int, loss: float) -> None:
        if self.tty:
            end = "\n" if step == self.total else ""
            self.stream.write("\r" + self.line(step, loss) + end)
        elif step % self.every == 0 or step == self.total:
            self.stream.write(self.line(step, loss) + "\n")
        self.stream.flush()
