"""The server's Prometheus metrics (prometheus_client), on a registry of its own per server.

Requests by outcome (``OUTCOMES``), errors by HTTP status, a latency
histogram per stage (decode, preprocess, queue, inference, postprocess, and the whole request as
the server saw it), the queue's depth (requests admitted and not yet answered), the batch sizes
the batcher formed and the seconds the model's thread was busy; ``serve_model_info`` names
the ref as the user gave it and the exact version it resolved to (the one serving now, with
``--follow``), and ``serve_model_updates_total`` counts the versions a followed alias moved to.
Buckets span 0.1 ms to 10 s: a tiny model's stages take well under a millisecond, a request
past its SLO takes seconds.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest

# ok: answered; bad_input: refused for what was sent (4xx); overloaded: 503 for load;
# unavailable: 503 while warming up or shutting down; disconnected: the client left before its
# body was whole (answered to no one); error: the server failed it (500)
OUTCOMES = ("ok", "bad_input", "overloaded", "unavailable", "disconnected", "error")
# swapped: now served; refused: a version this server cannot serve (not tried again); failed:
# the registry did not answer or the pull failed on the way (tried again at the next look)
UPDATES = ("swapped", "refused", "failed")
STAGES = ("decode", "preprocess", "queue", "inference", "postprocess", "total")
SECONDS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
           1.0, 2.5, 5.0, 10.0)


class ServerMetrics:
    def __init__(self, max_batch: int, served=None):
        self.registry = CollectorRegistry()
        r = self.registry
        # which version answers, beside what it answered (an alias moves; --follow follows it)
        self.model_info = Info("serve_model", "What is served: the ref as given and the exact "
                               "version", registry=r)
        if served is not None:
            self.serving(served)
        self.updates = Counter("serve_model_updates", "Versions the followed alias moved to "
                               "(--follow), by outcome", ["outcome"], registry=r)
        for outcome in UPDATES:
            self.updates.labels(outcome)
        self.requests = Counter("serve_requests", "Requests answered, by outcome", ["outcome"],
                                registry=r)
        self.errors = Counter("serve_errors", "Requests answered with an error, by HTTP status",
                              ["status"], registry=r)
        self.stage = Histogram("serve_stage_seconds", "Time per request in each stage",
                               ["stage"], buckets=SECONDS, registry=r)
        self.worker_restarts = Counter("serve_worker_restarts",
                                       "Preprocessing workers replaced after one died",
                                       registry=r)
        self.queue_depth = Gauge("serve_queue_depth",
                                 "Requests admitted and not yet answered", registry=r)
        self.batch_size = Histogram("serve_batch_size", "Requests per model run",
                                    buckets=batch_buckets(max_batch), registry=r)
        # the article's utilisation: busy seconds over a step's seconds is the share of time the
        # model's thread worked (summed over the threads running the model: the consumers, or
        # inline's request threads; over 1 when they overlap)
        self.busy = Counter("serve_inference_busy_seconds", "Seconds spent running the model "
                            "and decoding its outputs (a batch's time once)", registry=r)
        for outcome in OUTCOMES:
            self.requests.labels(outcome)  # present at zero, so a scrape shows every series
        # each stage's child looked up once: ``labels()`` per observation is a locked lookup,
        # six of them on every request
        self.stages = {stage: self.stage.labels(stage) for stage in STAGES}

    def serving(self, served) -> None:
        self.model_info.info({"ref": served.ref, "version": served.version or ""})

    def refused(self, outcome: str, status: int, response):
        """``response`` (a request refused with HTTP ``status``), counted under ``outcome``."""
        self.requests.labels(outcome).inc()
        self.errors.labels(str(status)).inc()
        return response

    def observe(self, timings_ms: dict) -> None:
        for stage, ms in timings_ms.items():
            child = self.stages.get(stage)
            if child is not None:
                child.observe(ms / 1000.0)

    def text(self) -> bytes:
        return generate_latest(self.registry)


def batch_buckets(max_batch: int) -> tuple[int, ...]:
    """Every batch size up to 64, past it the powers of two and ``max_batch``: a scrape stays a
    few dozen lines whatever the largest batch allowed."""
    exact = range(1, min(max_batch, 64) + 1)
    powers = (1 << k for k in range(7, max_batch.bit_length()))
    return tuple(sorted({*exact, *(b for b in powers if b < max_batch), max_batch}))
