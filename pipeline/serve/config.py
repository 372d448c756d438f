"""How the server runs: typed settings, with worker and thread counts from the cores this process
may use (``os.sched_getaffinity``), never from what this machine happens to be.

Why a split: Case 1 of issue 36, an image service whose decoding and preprocessing shared the
model's process and left the accelerator at 20 %. Here the producer side (decode + preprocess in
worker processes) and the consumer (the model's intra-op threads) each get cores of their own,
in proportion to what a request costs each side (``cost_split``: the warm-up request prepared at
start-up against the model's time in the artifact's own benchmark), each at least one; about a
third of the cores to the workers when the artifact records no benchmark (``default_split``).

A text model is split otherwise: tokenizing a request costs a hundredth of what even a small
transformer's inference does (all-mpnet-base-v2: 0.06 against 12 CPU-ms), so a third of the cores
for workers would sit idle while the model's one thread queues. Its server keeps one worker and
runs the model on every core, one request (or batch) per core side by side, each with one
intra-op thread: on 2 cores its p99 at 110 requests/s was 142 to 152 ms, against more than a
second for one thread at 90 requests/s.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

from pipeline.core.errors import ConfigError
from pipeline.serve.inputs import MAX_INPUT_VALUES

MODES = ("pipeline", "inline")
MAX_WAIT_MS = 10_000.0  # a batch wait past ten seconds is a typo, not a policy
MAX_BATCH = 4096


def usable_cores() -> int:
    return len(os.sched_getaffinity(0))


def default_split(cores: int) -> tuple[int, int]:
    """(preprocessing workers, inference intra-op threads) for ``cores`` usable cores."""
    workers = max(1, cores // 3)
    return workers, max(1, cores - workers)


# A model faster than this per request keeps its own core(s) apart from the workers' even when
# preprocessing is cheap: onnxruntime's pool threads spin between runs, and at a run every few
# tenths of a millisecond they hold the core the worker needs (the OCR model, 0.27 ms a line:
# 740 -> under 500 req/s with a second thread on 2 cores). A 1.7 s detector answered 1.4 to
# 1.85x sooner on every core. Between the two nothing was measured; 10 ms keeps short models on
# the split.
SHARE_ALL_CORES_MS = 10.0


def cost_split(cores: int, prepare_ms: float, model_ms: float,
               model_threads: int = 1) -> tuple[int, int]:
    """(preprocessing workers, inference intra-op threads) with the cores shared as a request's
    CPU time is: ``prepare_ms`` (decode and preprocess, on one core) against the model's
    ``model_ms`` on ``model_threads`` threads (its CPU-ms: the product). Neither side then waits
    on the other at saturation. Preprocessing that needs under half a core, for a model slower
    than ``SHARE_ALL_CORES_MS``, gets one worker sharing a core with the model's threads on
    every core: a detector of 1.7 s a page whose page resizes in 38 ms would otherwise run on
    half the machine while the worker idles."""
    model_cpu_ms = model_ms * max(1, model_threads)
    share = prepare_ms / max(prepare_ms + model_cpu_ms, 1e-9)
    if cores < 2 or (cores * share < 0.5 and model_ms >= SHARE_ALL_CORES_MS):
        return 1, cores
    workers = min(cores - 1, max(1, round(cores * share)))
    return workers, cores - workers


@dataclass(frozen=True)
class ServeConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    mode: str = "pipeline"          # pipeline: workers + batcher; inline: all in the handler
    workers: int = 0                # preprocessing processes; 0 = from the usable cores
    intra_op_threads: int = 0       # the runtime's threads; 0 = from the usable cores
    consumers: int = 0              # threads running the model, a batch each; 0 = from the cores
                                    # and the model's kind (1 for an image model)
    max_batch: int = 8              # the batcher's largest batch
    max_wait_ms: float = 2.0        # how long the oldest request waits for company
    shape_bucket: int = 0           # batch only requests whose size axis matches after rounding
                                    # up to this (0: exactly equal: no padding inside a batch)
    queue_limit: int = 256          # requests admitted and not yet answered; past it: 503
                                    # (a bound on memory: each holds its body until answered)
    max_queue_ms: float | None = None  # a request that would wait longer (admission.Backlog):
                                    # 503; None = the p99 target the artifact's gate judged
                                    # (none if it judged none), 0 = no such limit
    max_queue_from_target: bool = False  # set by ``resolved``: max_queue_ms is that target, not
                                    # given, so a server following its alias takes each new
                                    # version's (``Server.swap``)
    retry_after_s: int = 1          # the Retry-After a 503 carries
    max_body_bytes: int = 10 * 1024 * 1024   # a larger body is 413 before it is read whole
    max_pixels: int = 16 * 1024 * 1024       # an image header claiming more is 413, not decoded
    max_side: int = 16384                    # nor a side longer than this
    max_input_values: int = MAX_INPUT_VALUES  # a request whose preprocessed input (the model's
                                    # feeds) holds more values is 413 before the model runs: an
                                    # OCR line 32 tall and 8192 wide (a 16384x1 image of 98 bytes
                                    # becomes one 524288 wide, gigabytes of activations)
    body_timeout_s: float = 30.0    # a body not received whole within this is 408: a client
                                    # that stalls holds no place in the queue meanwhile
    warmup_runs: int = 3            # runs per path before /readyz says ready
    # decoders (pipeline.serve.generate): each sequence's KV cache is reserved at admission
    max_sequences: int = 4          # sequences generating at once; past it: 503
    max_seq_len: int = 0            # prompt + new tokens per sequence; 0 = the model's context
    max_new_tokens: int = 64        # new tokens when a request names none
    kv_budget_mb: float = 0.0       # KV cache all sequences may reserve; 0 = half the memory
                                    # available when the server starts
    decode_batch: int = 0           # 0: one generator per sequence; N: onnxruntime-genai's
                                    # Engine, sequences decoded together in batches of up to N

    def __post_init__(self):
        if self.mode not in MODES:
            raise ConfigError(f"--mode={self.mode!r}: valid choices: {', '.join(MODES)}")
        for key in ("max_batch", "queue_limit", "max_body_bytes", "max_pixels", "max_side",
                    "max_input_values", "max_sequences", "max_new_tokens"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"--{key.replace('_', '-')}={getattr(self, key)}: must be > 0")
        for key in ("workers", "intra_op_threads", "consumers", "shape_bucket", "warmup_runs",
                    "port", "max_seq_len", "decode_batch"):
            if getattr(self, key) < 0:
                raise ConfigError(f"--{key.replace('_', '-')}={getattr(self, key)}: must be >= 0")
        if not self.port <= 65535:
            raise ConfigError(f"--port={self.port}: a TCP port is 0 to 65535 (0: any free one)")
        if self.max_batch > MAX_BATCH:
            raise ConfigError(f"--max-batch={self.max_batch}: at most {MAX_BATCH} (a batch "
                              "is one model run; past a few dozen it only adds latency)")
        # NaN passes every comparison and infinity overflows a timer: each is refused by name
        if not 0 <= self.max_wait_ms <= MAX_WAIT_MS:
            raise ConfigError(f"--max-wait-ms={self.max_wait_ms}: must be 0 to {MAX_WAIT_MS:g} "
                              "(how long the oldest request waits for company)")
        if self.max_queue_ms is not None and not 0 <= self.max_queue_ms < math.inf:
            raise ConfigError(f"--max-queue-ms={self.max_queue_ms}: must be >= 0 and finite "
                              "(0: no such limit)")
        if not 0 < self.body_timeout_s < math.inf:
            raise ConfigError(f"--body-timeout-s={self.body_timeout_s}: must be > 0 and finite")
        if not 0 <= self.kv_budget_mb < math.inf:
            raise ConfigError(f"--kv-budget-mb={self.kv_budget_mb}: must be >= 0 and finite")

    def resolved(self, text: bool = False, target_ms: float | None = None,
                 max_batch: int | None = None,
                 costs: tuple[float, float, int] | None = None) -> "ServeConfig":
        """Zero counts replaced by the split of the usable cores; ``text``: the model reads text
        (a tokenizer's cost, next to nothing: one worker, every core running the model);
        ``target_ms``: the artifact's p99 target, the longest wait admitted unless given;
        ``max_batch``: the most the model's graph runs at once (1: it declares a batch of 1),
        a cap on the batcher's; ``costs``: (preprocessing ms, the model's ms, the threads it
        was timed on) per request, which split the cores (``cost_split``) instead of the fixed
        third."""
        from dataclasses import replace

        if max_batch is not None and self.max_batch > max_batch:
            return replace(self, max_batch=max_batch).resolved(text, target_ms, costs=costs)
        if self.max_queue_ms is None:
            return replace(self, max_queue_ms=target_ms or 0.0,
                           max_queue_from_target=True).resolved(text, costs=costs)
        cores = usable_cores()
        if self.mode == "inline":  # no workers: the model's threads may have every core
            return replace(self, workers=0, consumers=0,
                           intra_op_threads=self.intra_op_threads or cores)
        if text:
            return replace(self, workers=self.workers or 1,
                           consumers=self.consumers or cores,
                           intra_op_threads=self.intra_op_threads or 1)
        workers, threads = cost_split(cores, *costs) if costs else default_split(cores)
        return replace(self, workers=self.workers or workers, consumers=self.consumers or 1,
                       intra_op_threads=self.intra_op_threads or threads)
