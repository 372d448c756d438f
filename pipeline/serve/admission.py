"""How long a request admitted now would wait: the work ahead of it, in time.

A queue limit in requests bounds memory, but says nothing of latency: the same 64 requests ahead
are a tenth of a second for an OCR line model and seconds for a float transformer. So the server
also refuses (503, Retry-After) a request that would wait longer than ``max_queue_ms`` (by
default the p99 target the artifact's gate judged): it would be answered late whatever happened
next, and admitting it only makes every request behind it later too.

The wait is estimated from the server's own answers, not from a model of the machine or of its
stages: the time between two answers while the server stayed busy (some request in flight from
one answer to the next), as a moving average. When requests queue, that is the reciprocal of what
the server answers per second, whatever its shape (worker processes and a batcher, or everything
in handler threads, where a request's own time says nothing, since it shares the cores with every
other request in flight), and with whatever else runs on the cores; a request with N ahead of it
waits about N of them. With few in flight the gaps follow the arrivals instead, which makes the
estimate about the current time in the server (N over the rate, Little's law): below any target
worth setting. Before the server has been busy from one answer to the next there is no estimate,
and only the count applies.
"""
from __future__ import annotations

from dataclasses import dataclass

# The weight of each new gap: about the last 50 answers count, so a change in what the cores
# give the server moves the estimate within a tenth of a second at the rates these servers hold,
# while a batch's answers (many at once, then a batch's time) average out.
ALPHA = 0.02


@dataclass
class Backlog:
    per_request_s: float | None = None   # the moving average of the gaps
    _busy_since: float | None = None     # the last answer, if others were in flight after it

    def answered(self, now: float, in_flight: int) -> None:
        """An answer left at ``now`` (seconds, a monotonic clock), ``in_flight`` requests still
        admitted and unanswered after it."""
        if self._busy_since is not None:
            gap = now - self._busy_since
            old = self.per_request_s
            self.per_request_s = gap if old is None else old + ALPHA * (gap - old)
        # The count only falls at an answer, so in flight after this one means busy until the next
        self._busy_since = now if in_flight > 0 else None

    def wait_ms(self, ahead: int) -> float | None:
        """The estimated wait of a request with ``ahead`` admitted before it; None before the
        server has been busy from one answer to the next."""
        if self.per_request_s is None:
            return None
        return ahead * self.per_request_s * 1000.0
