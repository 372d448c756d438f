"""How long a request admitted now would wait: the work ahead of it, in time.

A queue limit in requests bounds memory, but says nothing of latency: 64 requests ahead are 60 ms
for an OCR line model on two cores and two seconds for a float transformer. So the server also
refuses (503, Retry-After) a request that would wait longer than ``max_queue_ms`` (by default the
artifact's own p99 target): it would be answered late whatever happened next, and admitting it
only makes every request behind it later too.

The wait is estimated from the server's own recent service times, not from a model of the
machine: each stage's time per request (decode + preprocess in the workers; the model's run and
postprocessing per request of its batch) as an exponential moving average over the requests it
answered, divided by the lanes that run it in parallel (workers; consumer threads). The slowest
lane's time per request, times the requests ahead, is the wait. Queueing time itself is not a
service time and is left out (a batcher holding a lone request for company is not slow).
Before any request has been answered there is no estimate, and only the count applies.
"""
from __future__ import annotations

from dataclasses import dataclass, field

# The weight of each new request's time: about the last 50 requests count, so a burst of
# someone else's load on the cores moves the estimate within a fraction of a second at the
# rates these servers hold, and one slow request does not.
ALPHA = 0.02


@dataclass
class Backlog:
    lanes: dict[str, int]                      # stage -> how many run it at once
    per_request_s: dict[str, float] = field(default_factory=dict)

    @classmethod
    def for_mode(cls, mode: str, workers: int, consumers: int, cores: int) -> "Backlog":
        """``pipeline``: workers prepare, consumers run the model; ``inline``: each request runs
        whole in a handler thread, as many at once as there are cores."""
        if mode == "inline":
            return cls({"request": max(1, cores)})
        return cls({"prepare": max(1, workers), "model": max(1, consumers)})

    def observe(self, timings: dict) -> None:
        """One answered request's stage timings (ms, as the server reports them; the model's
        are its batch's, shared by ``batch`` requests)."""
        prepare = (timings.get("decode", 0.0) + timings.get("preprocess", 0.0)) / 1000.0
        model = (timings.get("inference", 0.0) + timings.get("postprocess", 0.0)) / 1000.0 \
            / max(1, int(timings.get("batch", 1)))
        if "request" in self.lanes:
            self._add("request", prepare + model)
        else:
            self._add("prepare", prepare)
            self._add("model", model)

    def _add(self, stage: str, seconds: float) -> None:
        old = self.per_request_s.get(stage)
        self.per_request_s[stage] = seconds if old is None else old + ALPHA * (seconds - old)

    def wait_ms(self, ahead: int) -> float | None:
        """The estimated wait of a request with ``ahead`` admitted before it; None before any
        request was answered."""
        if not self.per_request_s:
            return None
        slowest = max(s / self.lanes[k] for k, s in self.per_request_s.items())
        return ahead * slowest * 1000.0
