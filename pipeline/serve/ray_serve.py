"""The same server as a Ray Serve deployment: replicas, and ``@serve.batch`` as the batcher.

In: a ``Served`` (``artifact.open_ref``) and a ``ServeConfig``. Out: a Ray Serve application
(``application(...)``, for ``serve.run``) whose replicas each load the model on the runtime its
gate judged and answer ``POST`` with the raw bytes of one request (an image, or a text model's
text), exactly as ``pipeline.serve.app`` does: the same reader (``readers``: checks and one-line
4xx, preprocessing, decoding), the same JSON. A decoder: ``generate_application`` (below).

What differs: Ray Serve's proxy routes requests to ``replicas`` processes and bounds their queue
(``max_ongoing_requests`` per replica, ``max_queued_requests`` in front: past it the proxy answers
503), and ``@serve.batch`` gathers up to ``max_batch`` requests for up to ``max_wait_ms``. That
batcher has no notion of shape classes, so a gathered batch is split by line width and each width
runs as one batch: no line is padded to another's width, and every answer is the one the line gets
alone (as the HTTP server's batcher guarantees). Decoding and preprocessing run on a thread of the
replica, the model on another, so the replica's event loop keeps reading requests.

A decoder (``generate_application``) is deployed as the HTTP server's own Starlette app
(``generate.build``) behind ``@serve.ingress``: each replica builds it, Ray Serve runs its
lifespan (the model loads and warms up; until then ``/readyz`` and ``/generate`` answer 503) and
streams its server-sent events through the proxy, token by token. Admission (sequences, length,
KV budget) is per replica, as each replica holds its own sequences' caches.
"""
from __future__ import annotations

import asyncio
from pathlib import Path

from pipeline.serve.config import ServeConfig


def application(served, cfg: ServeConfig, replicas: int = 1, num_cpus: float = 1.0):
    from ray import serve
    from starlette.requests import Request
    from starlette.responses import JSONResponse

    from pipeline.serve.inputs import BadInput, Limits
    from pipeline.serve.readers import in_image, prepare

    root = str(Path(__file__).resolve().parents[2])  # the replicas import this checkout

    @serve.deployment(num_replicas=replicas, max_ongoing_requests=cfg.queue_limit,
                      max_queued_requests=cfg.queue_limit,
                      ray_actor_options={"num_cpus": num_cpus,
                                         "runtime_env": {"env_vars": {"PYTHONPATH": root}}})
    class Recognizer:
        def __init__(self, served, cfg: ServeConfig):
            from pipeline import runtimes
            from pipeline.config import HardwareRuntime
            from pipeline.serve.readers import reader

            self.served, self.cfg, self.reader = served, cfg, reader(served.reader_key)
            self.limits = Limits.of(cfg)
            deployed = served.runtime
            self.model = runtimes.load(served.model, HardwareRuntime(
                "cpu", "CPUExecutionProvider", cfg.intra_op_threads, 1, None,
                deployed.runtime, deployed.precision, deployed.performance_hint))
            self.model.run(self.reader.example())  # warm: the first run allocates

        def _run(self, group: list) -> list:
            outputs = self.model.run(self.reader.stack([p.feeds for p in group]))
            return self.reader.answers(outputs)

        @serve.batch(max_batch_size=cfg.max_batch, batch_wait_timeout_s=cfg.max_wait_ms / 1000.0)
        async def infer(self, prepared: list) -> list:
            by_size: dict[int, list[int]] = {}
            for k, p in enumerate(prepared):
                by_size.setdefault(p.size, []).append(k)
            answers: list = [None] * len(prepared)
            for rows in by_size.values():
                predictions = await asyncio.to_thread(self._run, [prepared[k] for k in rows])
                for k, p in zip(rows, predictions):
                    answers[k] = (p, len(rows))
            return answers

        async def __call__(self, request: Request):
            body = await request.body()
            try:
                p = await asyncio.to_thread(prepare, body, request.headers.get("content-type", ""),
                                            self.limits, self.served.reader_key)
            except BadInput as e:
                return JSONResponse({"error": e.line}, status_code=e.status)
            prediction, batch = await self.infer(p)
            prediction = in_image(prediction, p.geometry)
            return JSONResponse({"prediction": prediction, "model": self.served.ref,
                                 "version": self.served.version,
                                 "timing_ms": {"decode": p.decode_ms,
                                               "preprocess": p.preprocess_ms, "batch": batch}})

    return Recognizer.bind(served, cfg)


def generate_application(served, cfg: ServeConfig, replicas: int = 1, num_cpus: float = 1.0):
    """A decoder's ``/generate`` (tokens streamed as server-sent events), ``/readyz``,
    ``/healthz`` and ``/metrics``, on ``replicas`` Ray Serve replicas."""
    from ray import serve

    root = str(Path(__file__).resolve().parents[2])

    def app():  # built on each replica, where the model is loaded
        from pipeline.serve.generate import build

        return build(served, cfg)[0]

    # the proxy holds at most what the replicas may generate at once; past that it answers 503
    @serve.deployment(num_replicas=replicas, max_ongoing_requests=cfg.max_sequences,
                      max_queued_requests=cfg.max_sequences,
                      ray_actor_options={"num_cpus": num_cpus,
                                         "runtime_env": {"env_vars": {"PYTHONPATH": root}}})
    @serve.ingress(app)
    class Generator:
        pass

    return Generator.bind()
