"""A progress bar for the recovery fine-tune (minutes of work inside a stage): the general one
(``pipeline.core.progress``) with the loss and the step rate in each line.

In: the total step count, then ``update(step, loss)`` after every step. Out: a bar with the step,
the loss, the rate and the time left, on the given stream: redrawn on a terminal, a line every
``every`` of the way in a log.
"""
from __future__ import annotations

from pipeline.core.progress import Progress as _Progress, hms


class Progress(_Progress):
    def __init__(self, total: int, label: str = "recovery", stream=None, width: int = 24,
                 every: float = 0.1):
        super().__init__(total, label, stream, width, every)

    def line(self, step: int, loss: float) -> str:
        elapsed = self.clock() - self.t0
        rate = step / elapsed if elapsed > 0 else 0.0
        left = (self.total - step) / rate if rate > 0 else 0.0
        done = int(self.width * step / self.total)
        return (f"  {self.label} [{'#' * done}{'-' * (self.width - done)}] {step}/{self.total} "
                f"loss {loss:.4f}  {rate:.2f} steps/s  {hms(left)} left")

    def update(self, step: int, loss: float) -> None:
        if self.tty:
            end = "\n" if step == self.total else ""
            self.stream.write("\r" + self.line(step, loss) + end)
        elif step % self.every == 0 or step == self.total:
            self.stream.write(self.line(step, loss) + "\n")
        self.stream.flush()
