"""Decoders served: greedy generation streamed as server-sent events, each sequence admitted only
when its KV cache fits.

In: a ``Served`` of kind ``generate`` (an onnxruntime-genai folder: ``genai_config.json``, the ONNX
decoder, its tokenizer, as the decoder recipe published it) and a ``ServeConfig``. Out: a
Starlette app: ``POST /generate`` (JSON ``{"prompt": "...", "max_new_tokens": N}``, or the prompt
as UTF-8 text) answering ``text/event-stream``: one ``token`` event per generated token (its id and
text), then one ``done`` event (every id, the text, time to first token, tokens/s); ``/healthz``,
``/readyz``, ``/metrics`` as the batch server has them.

Generation is the pipeline's own greedy loop (``pipeline.measure.decode.greedy``: onnxruntime-
genai's Generator, one per sequence, its KV cache in the runtime), each step on a worker thread so
the event loop keeps streaming. Admission, before a token is generated, in this order:
- a prompt of no tokens, or prompt + ``max_new_tokens`` over ``--max-seq-len`` (default: the
  model's context): 400 / 413 in one line;
- ``--max-sequences`` sequences already generating: 503 with Retry-After;
- its KV cache (layers x KV heads x head size x 2 x the cache's bytes, for every position up to
  prompt + new tokens: onnxruntime-genai allocates a sequence's cache for its whole length when it
  starts) on top of what the admitted sequences reserved, over ``--kv-budget-mb`` (default: half
  the memory available when the server started), or more than the machine has available now
  less a margin: 503 with Retry-After. A sequence's reservation is returned when its stream ends,
  finished or abandoned by the client.
With ``--decode-batch N`` the sequences are decoded together instead, in batches of up to N, by
onnxruntime-genai's Engine (``pipeline.serve.decode_engine``): the weights are read once per step
for the whole batch. Its KV cache is one buffer for N rows of ``--max-seq-len`` positions,
reserved against the budget when the server starts (a budget it does not fit is refused then);
admission then counts sequences only. Without it, each sequence has its own generator, and the
weights are read once per step per sequence. Not handled: sampling, adding a sequence to a batch
already running (the static Engine waits for the batch to finish), prefix caching.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from pipeline.serve.app import ERRORS_AS_JSON, lifespan, not_serving, receive, service_routes
from pipeline.serve.config import ServeConfig
from pipeline.serve.inputs import BadInput, Limits, json_body, read_text
from pipeline.serve.metrics import SECONDS, ServerMetrics

MB = 1024 * 1024
MARGIN_MB = 256  # never admit a sequence that would leave the machine less available than this


@dataclass(frozen=True)
class KvShape:
    """What one position of one sequence's KV cache holds, from ``genai_config.json`` and the
    graph's past inputs."""
    layers: int
    kv_heads: int
    head_dim: int
    bytes_per_value: int
    context: int  # the model's longest sequence (genai_config search.max_length)

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.bytes_per_value


def kv_shape(folder: Path) -> KvShape:
    import onnx

    config = json.loads((folder / "genai_config.json").read_text())
    decoder = config["model"]["decoder"]
    graph = onnx.load(str(folder / decoder.get("filename", "model.onnx")),
                      load_external_data=False).graph
    past = [i for i in graph.input if i.name.startswith("past_key_values")]
    elem = past[0].type.tensor_type.elem_type if past else onnx.TensorProto.FLOAT
    size = onnx.helper.tensor_dtype_to_np_dtype(elem).itemsize
    context = int(config.get("search", {}).get("max_length")
                  or config["model"].get("context_length") or 2048)
    return KvShape(int(decoder["num_hidden_layers"]), int(decoder["num_key_value_heads"]),
                   int(decoder["head_size"]), size, context)


class Refused(Exception):
    def __init__(self, status: int, line: str):
        super().__init__(line)
        self.status, self.line = status, line


class Admission:
    """Sequences at once and the KV bytes they reserved, checked and taken in one step."""

    def __init__(self, max_sequences: int, budget_bytes: int, available=None):
        from pipeline.core.env import meminfo_bytes

        self.max_sequences, self.budget = max_sequences, budget_bytes
        self.available = available or (lambda: meminfo_bytes("MemAvailable"))
        self.active, self.reserved = 0, 0

    def admit(self, kv_bytes: int) -> None:
        """Take a slot and ``kv_bytes``, or raise ``Refused`` (503) saying which limit."""
        if self.active >= self.max_sequences:
            raise Refused(503, f"overloaded: {self.active} sequences generating (the limit, "
                               "--max-sequences)")
        if self.reserved + kv_bytes > self.budget:
            raise Refused(503, f"KV cache of {kv_bytes / MB:.3f} MB does not fit: "
                               f"{self.reserved / MB:.3f} MB of {self.budget / MB:.3f} MB "
                               "reserved (--kv-budget-mb)")
        free = self.available()
        if free is not None and kv_bytes > free - MARGIN_MB * MB:
            raise Refused(503, f"KV cache of {kv_bytes / MB:.2f} MB does not fit the "
                               f"{free / MB:.0f} MB this machine has available")
        self.active += 1
        self.reserved += kv_bytes

    def release(self, kv_bytes: int) -> None:
        self.active -= 1
        self.reserved -= kv_bytes


class Generating:
    """One served decoder: the model, its tokenizer, the admission and the metrics."""

    def __init__(self, served, cfg: ServeConfig):
        from prometheus_client import Gauge, Histogram

        from pipeline.core.env import meminfo_bytes

        self.served, self.cfg = served, cfg
        self.folder = Path(served.model).parent
        self.kv = kv_shape(self.folder)
        self.max_seq_len = min(cfg.max_seq_len or self.kv.context, self.kv.context)
        available = meminfo_bytes("MemAvailable") or 0
        budget = int(cfg.kv_budget_mb * MB) if cfg.kv_budget_mb else available // 2
        self.admission = Admission(cfg.max_sequences, budget)
        self.engine = None  # --decode-batch: the EngineLoop, started with the model
        self.limits = Limits(cfg.max_body_bytes, 1, 1)
        self.receiving = 0  # bodies streaming in (app.receive)
        self.metrics = ServerMetrics(1, served)
        r = self.metrics.registry
        self.active = Gauge("serve_sequences_active", "Sequences generating", registry=r)
        self.kv_reserved = Gauge("serve_kv_reserved_bytes", "KV cache reserved by admitted "
                                 "sequences", registry=r)
        self.ttft = Histogram("serve_time_to_first_token_seconds", "Prompt in to first token out",
                              buckets=SECONDS, registry=r)
        self.tokens = Histogram("serve_token_seconds", "Time per generated token after the first",
                                buckets=SECONDS, registry=r)
        self.ready, self.failed, self.failed_code = False, None, 3
        self.stopping = False  # set on SIGTERM (app.Draining): new sequences are refused
        self.model = self.tokenizer = None

    @property
    def in_flight(self) -> str:
        return f"{self.admission.active} sequence(s) generating"

    async def start(self) -> None:
        self.model, self.tokenizer = await run_in_threadpool(self._load)
        for _ in range(max(1, self.cfg.warmup_runs)):  # the first runs allocate
            await run_in_threadpool(lambda: list(self._greedy(self.encode("warm up"), 2)))
        self.ready = True

    async def stop(self) -> None:
        self.ready = False
        if self.engine is not None:
            self.engine.stop()

    def engine_bytes(self) -> int:
        """The Engine's KV buffer: every row of a batch at the longest sequence."""
        return self.cfg.decode_batch * self.max_seq_len * self.kv.bytes_per_token

    def _load(self):
        import onnxruntime_genai as og

        from pipeline.measure.decode import load_model

        if not self.cfg.decode_batch:
            model = load_model(self.folder, self.cfg.intra_op_threads or None)
            return model, og.Tokenizer(model)
        from pipeline.core.errors import ConfigError
        from pipeline.serve.decode_engine import EngineLoop, overlay

        need = self.engine_bytes()
        if need > self.admission.budget:
            raise ConfigError(
                f"--decode-batch {self.cfg.decode_batch}: its KV buffer of {need / MB:.1f} MB "
                f"({self.cfg.decode_batch} rows of {self.max_seq_len} positions, --max-seq-len) "
                f"is over the budget of {self.admission.budget / MB:.1f} MB (--kv-budget-mb)")
        model = load_model(self.folder, self.cfg.intra_op_threads or None,
                           overlay(self.cfg.decode_batch, self.max_seq_len))
        self.engine = EngineLoop(model, self.cfg.decode_batch, self.cfg.max_wait_ms / 1000.0)
        self.admission.reserved = need  # held from now on; sequences take slots only
        return model, og.Tokenizer(model)

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in self.tokenizer.encode(text)]

    def _greedy(self, prompt: list[int], new_tokens: int):
        if self.engine is not None:
            return self.engine.generate(prompt, new_tokens)
        from pipeline.measure.decode import greedy

        return greedy(self.model, prompt, new_tokens)

    def kv_need(self, prompt: list[int], new_tokens: int) -> int:
        """What a sequence reserves at admission: its own KV cache, or nothing more with the
        Engine, whose buffer was reserved whole at start."""
        return 0 if self.cfg.decode_batch else (len(prompt) + new_tokens) * self.kv.bytes_per_token

    def request(self, body: bytes, content_type: str) -> tuple[list[int], int]:
        """(prompt ids, new tokens) of a request, checked against the length limits."""
        new = self.cfg.max_new_tokens
        if content_type.split(";")[0].strip().lower() == "application/json":
            value = json_body(body)
            if not isinstance(value, dict) or not isinstance(value.get("prompt"), str):
                raise BadInput(400, 'JSON body must be an object with a string "prompt", e.g. '
                                    '{"prompt": "Once upon", "max_new_tokens": 32}')
            new = value.get("max_new_tokens", new)
            if not isinstance(new, int) or isinstance(new, bool) or new < 1:
                raise BadInput(400, f"max_new_tokens={new!r}: must be an integer >= 1")
            text = value["prompt"]
        else:
            text = read_text(body, content_type, self.limits)
        prompt = self.encode(text)
        if not prompt:
            raise BadInput(400, "the prompt has no tokens")
        if len(prompt) + new > self.max_seq_len:
            raise BadInput(413, f"prompt of {len(prompt)} tokens + {new} new tokens is over the "
                                f"limit of {self.max_seq_len} tokens per sequence (--max-seq-len)")
        return prompt, new


def _event(kind: str, payload: dict) -> bytes:
    return f"event: {kind}\ndata: {json.dumps(payload)}\n\n".encode()


def build(served, cfg: ServeConfig) -> tuple[Starlette, Generating]:
    server = Generating(served, cfg)
    m = server.metrics

    def refuse(status: int, line: str, outcome: str) -> JSONResponse:
        headers = {"Retry-After": str(cfg.retry_after_s)} if status == 503 else None
        if server.stopping:
            headers = {**(headers or {}), "Connection": "close"}
        return m.refused(outcome, status, JSONResponse({"error": line}, status_code=status,
                                                       headers=headers))

    async def generate(request: Request) -> Response:
        if not server.ready or server.stopping:
            return refuse(503, not_serving(server), "unavailable")
        body = await receive(request, server, cfg)  # streamed against the limit, not read whole
        if isinstance(body, Response):
            return body
        try:
            prompt, new = await run_in_threadpool(server.request, body,
                                                  request.headers.get("content-type", ""))
        except BadInput as e:
            return refuse(e.status, e.line, "bad_input")
        need = server.kv_need(prompt, new)
        try:
            server.admission.admit(need)
        except Refused as e:
            return refuse(e.status, e.line, "overloaded")
        server.active.set(server.admission.active)
        server.kv_reserved.set(server.admission.reserved)

        async def stream():
            start = time.perf_counter()
            tokens: list[int] = []
            decoder = server.tokenizer.create_stream()
            steps = server._greedy(prompt, new)
            last = start
            try:
                while True:
                    token = await run_in_threadpool(next, steps, None)
                    if token is None:
                        break
                    now = time.perf_counter()
                    (server.ttft if not tokens else server.tokens).observe(now - last)
                    last = now
                    tokens.append(token)
                    yield _event("token", {"id": token, "text": decoder.decode(token)})
                took = time.perf_counter() - start
                m.requests.labels("ok").inc()
                yield _event("done", {
                    "tokens": tokens, "text": server.tokenizer.decode(tokens),
                    "prompt_tokens": len(prompt), "model": served.ref,
                    "version": served.version,
                    "seconds": round(took, 6),
                    "tokens_per_s": round(len(tokens) / took, 3) if took > 0 else None})
            finally:  # finished, or the client went away: the reservation is returned
                server.admission.release(need)
                server.active.set(server.admission.active)
                server.kv_reserved.set(server.admission.reserved)

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})

    a = server.admission
    ready = {"model": served.ref, "version": served.version, "mode": "generate",
             "max_sequences": a.max_sequences, "max_seq_len": server.max_seq_len,
             "kv_budget_mb": round(a.budget / MB, 3),
             "kv_bytes_per_token": server.kv.bytes_per_token,
             "intra_op_threads": cfg.intra_op_threads, "decode_batch": cfg.decode_batch}
    routes = [Route("/generate", generate, methods=["POST"]), *service_routes(server, m, ready)]
    return Starlette(routes=routes, lifespan=lifespan(server),
                     exception_handlers=ERRORS_AS_JSON), server
