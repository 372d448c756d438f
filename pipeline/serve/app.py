"""The HTTP server: Starlette routes over the producer/consumer pipeline, or everything inline.

Routes: ``POST /predict`` (the raw bytes of one request; JSON back: the prediction as the task
decodes it, the model, and the time each stage took), ``GET /healthz`` (the process answers),
``GET /readyz`` (200 only after the model and the workers are warm, 503 before), ``GET /metrics``
(Prometheus text).

``pipeline`` mode is Case 1's fix: decoding and preprocessing run in worker processes
(``workers``: spawned, each on a socket the event loop reads and writes), the batcher
(``batcher``) runs the model on its own thread and postprocesses, and the event loop only moves
bytes. ``inline`` mode decodes, preprocesses, runs a batch of one and postprocesses in the request
handler (Starlette's thread pool), as a first server would: kept to measure against.

Admission: a request counts from when its body is read until it is answered; past
``queue_limit`` of them a request is answered 503 with Retry-After at once, so memory stays
bounded whatever the offered rate, and so is one that would wait longer than ``max_queue_ms``
behind those admitted (``admission.Backlog``). A body is refused by its Content-Length or,
without one, as soon as more than the limit has streamed in; it is never read whole first.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from dataclasses import replace
from typing import NamedTuple

import uvicorn
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from pipeline.serve.admission import Backlog
from pipeline.serve.batcher import Batcher, Job
from pipeline.serve.config import ServeConfig
from pipeline.serve.inputs import BadInput, Limits, Prepared
from pipeline.serve.readers import in_image, prepare
from pipeline.serve.metrics import ServerMetrics
from pipeline.serve.workers import WorkerError, WorkerLost, Workers


class Current(NamedTuple):
    """The version served and its loaded model, swapped as one (``Server.swap``): a batch reads
    both once, so it runs whole on one version and its answers name that version."""
    served: object
    model: object


class Server:
    """One served model: its runtime, workers, batcher and metrics."""

    def __init__(self, served, cfg: ServeConfig):
        from pipeline.serve.readers import reader

        self.current, self.cfg = Current(served, None), cfg
        self.reader = reader(served.reader_key)
        self.limits = Limits.of(cfg)
        self.metrics = ServerMetrics(cfg.max_batch, served)
        self.ready = False
        self.stopping = False  # set on SIGTERM: new requests are refused, admitted ones answered
        self.failed: str | None = None  # why start-up failed (one line); the CLI exits non-zero
        self.failed_code = 3  # the failure's exit code: 2 for arguments (a ConfigError)
        self.admitted = 0
        self.receiving = 0  # bodies streaming in, not yet admitted (bounded: RECEIVING)
        self.backlog = Backlog()  # the wait a request admitted now would have
        self.workers: Workers | None = None
        self.batcher: Batcher | None = None
        self.follower = None  # pipeline.serve.follow.Follower, with --follow
        self.following: asyncio.Task | None = None

    @property
    def served(self):
        return self.current.served

    @property
    def in_flight(self) -> str:
        return f"{self.admitted} request(s)"

    # -- life cycle ------------------------------------------------------------------------
    async def start(self) -> None:
        if self.cfg.mode == "pipeline":
            self.workers = Workers(self.cfg.workers, self.served.reader_key,
                                   on_restart=self.metrics.worker_restarts.inc)
            await self.workers.start()
        self.current = Current(self.served, await run_in_threadpool(self._load, self.served))
        if self.cfg.mode == "pipeline":
            self.batcher = Batcher(self._run_batch, self.cfg.max_batch, self.cfg.max_wait_ms,
                                   self.cfg.shape_bucket,
                                   on_batch=self._batch_formed,
                                   loop=asyncio.get_running_loop(),
                                   consumers=self.cfg.consumers)
            self.batcher.start()
        await self._warm_up()
        self.ready = True
        if self.follower is not None:
            self.following = asyncio.create_task(self.follower.run())

    def _batch_formed(self, size: int) -> None:
        """A batch the model ran, counted once serving: warm-up's batches answer no client."""
        if self.ready:
            self.metrics.batch_size.observe(size)

    async def stop(self) -> None:
        self.ready = False
        if self.following is not None:
            self.following.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.following
        if self.batcher is not None:
            await run_in_threadpool(self.batcher.stop)
        if self.workers is not None:
            await self.workers.stop()

    def _load(self, served):
        from pipeline import runtimes
        from pipeline.config import HardwareRuntime

        deployed = served.runtime
        threads = self.cfg.intra_op_threads
        settings = HardwareRuntime("cpu", "CPUExecutionProvider", threads, 1, None,
                                   deployed.runtime, deployed.precision,
                                   deployed.performance_hint)
        return runtimes.load(served.model, settings)

    def load_warm(self, served):
        """``served``'s model loaded on this server's threads and run on the warm-up request a
        few times (its first runs allocate), off the serving path: what ``swap`` takes. In a
        thread of its own, while the current version answers."""
        model = self._load(served)
        body, content_type = self.reader.warm_request()
        feeds = prepare(body, content_type, self.limits, served.reader_key).feeds
        for _ in range(max(1, self.cfg.warmup_runs)):
            self.reader.answers(model.run(self.reader.stack([feeds])))
        return model

    def swap(self, served, model) -> None:
        """Serve ``served`` (loaded and warmed by ``load_warm``) from the next batch on; a batch
        already running finishes on the version it started with, and says so. The longest wait
        admitted, where it was the first version's p99 target (no --max-queue-ms), becomes the
        new version's: the target its own gate judged."""
        if self.cfg.max_queue_from_target:
            self.cfg = replace(self.cfg, max_queue_ms=served.target_ms or 0.0)
        self.current = Current(served, model)
        self.metrics.serving(served)

    async def _warm_up(self) -> None:
        """The whole path, a few times: workers, batcher, runtime (its first runs allocate)."""
        from pipeline.core.errors import ConfigError

        body, content_type = self.reader.warm_request()
        for _ in range(max(1, self.cfg.warmup_runs)):
            try:
                await self.answer(body, content_type, hold=False)
            except BadInput as e:  # limits so tight that no request could pass: a bad argument
                raise ConfigError(f"the limits refuse even the warm-up request ({e.line})") \
                    from None

    # -- the data path -----------------------------------------------------------------------
    async def answer(self, body: bytes, content_type: str,
                     hold: bool = True) -> tuple[object, str | None, dict]:
        """(prediction, the version that computed it, stage timings in ms) for one request's
        bytes; raises ``BadInput``. ``hold=False``: the batcher runs it without waiting for
        company (warm-up)."""
        if self.cfg.mode == "inline":
            return await run_in_threadpool(self._inline, body, content_type)
        # A worker that dies with this request (killed, out of memory, a decoder that crashed on
        # these bytes) fails it with WorkerLost and is replaced; not retried: bytes that crash a
        # decoder would crash the next worker too.
        prepared: Prepared = await self.workers.prepare(body, content_type, self.limits)
        (answer, version), timings = await self.batcher.submit(prepared.feeds, prepared.size,
                                                               hold)
        return in_image(answer, prepared.geometry), version, {
            "decode": prepared.decode_ms, "preprocess": prepared.preprocess_ms, **timings}

    def _run_batch(self, jobs: list[Job]) -> list:
        """One answer per job: ((prediction, version), timings)."""
        start = time.perf_counter()
        served, model = self.current  # once: a swap meanwhile takes the next batch
        outputs = model.run(self.reader.stack([j.feeds for j in jobs]))
        ran = time.perf_counter()
        predictions = self.reader.answers(outputs)
        done = time.perf_counter()
        self.metrics.busy.inc(done - start)
        timings = {"inference": (ran - start) * 1000.0, "postprocess": (done - ran) * 1000.0,
                   "batch": len(jobs)}
        return [((p, served.version), dict(timings)) for p in predictions]

    def _inline(self, body: bytes, content_type: str):
        prepared = prepare(body, content_type, self.limits, self.served.reader_key)
        self._batch_formed(1)
        ((answer, version), timings), = self._run_batch([Job(prepared.feeds, prepared.size)])
        return in_image(answer, prepared.geometry), version, {
            "decode": prepared.decode_ms, "preprocess": prepared.preprocess_ms, "queue": 0.0,
            **timings}


# Bodies streaming in before admission, at most this many times --queue-limit: a client that
# stalls mid-body is cut off after --body-timeout-s and holds no place in the queue meanwhile,
# and those arriving at once are bounded too (each may hold up to --max-body-bytes)
RECEIVING = 4


def _error(status: int, line: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": line}, status_code=status, headers=headers)


async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
    """Starlette's own refusals (404 no such route, 405 wrong method) as JSON like every other
    error, not its plain text."""
    return _error(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}",
                  exc.headers)


# Every server's app (this one, the decoder's) answers its routing errors so
ERRORS_AS_JSON = {HTTPException: _http_error}


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BadInput(413, f"body of {declared} bytes (Content-Length) is over the limit of "
                            f"{limit} bytes (--max-body-bytes)")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BadInput(413, f"body of more than {limit} bytes is over the limit "
                                "(--max-body-bytes)")
        chunks.append(chunk)
    return b"".join(chunks)


def build(served, cfg: ServeConfig) -> tuple[Starlette, Server]:
    server = Server(served, cfg)
    m = server.metrics

    async def predict(request: Request) -> Response:
        start = time.perf_counter()
        refused = refusal(server)
        if refused is not None:
            return refused
        # The body is read before the request is admitted: a client that sends its headers and
        # then stalls holds no place in the queue, and is cut off after --body-timeout-s
        body = await receive(request, server, cfg)
        if isinstance(body, Response):
            return body
        refused = refusal(server)  # again: the queue may have filled while it streamed
        if refused is not None:
            return refused
        server.admitted += 1
        m.queue_depth.set(server.admitted)
        try:
            answer, version, timings = await server.answer(body,
                                                           request.headers.get("content-type", ""))
        except BadInput as e:
            return m.refused("bad_input", e.status, _error(e.status, e.line))
        except (WorkerLost, WorkerError) as e:
            return m.refused("error", 500, _error(500, str(e)))
        except Exception as e:  # noqa: BLE001 - a runtime failure: 500 in one line, keep serving
            line = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            return m.refused("error", 500, _error(500, line))
        finally:
            server.admitted -= 1
            server.backlog.answered(time.perf_counter(), server.admitted)
            m.queue_depth.set(server.admitted)
        timings["total"] = (time.perf_counter() - start) * 1000.0
        m.observe(timings)
        m.requests.labels("ok").inc()
        return JSONResponse({"prediction": answer, "model": server.served.ref,
                             "version": version,
                             "timing_ms": {k: round(v, 4) if isinstance(v, float) else v
                                           for k, v in timings.items()}})

    ready = {"model": server.served.ref, "version": lambda: server.served.version,
             "mode": cfg.mode,
             "workers": cfg.workers, "consumers": cfg.consumers,
             "intra_op_threads": cfg.intra_op_threads,
             "max_batch": cfg.max_batch, "queue_limit": cfg.queue_limit,
             "max_queue_ms": lambda: server.cfg.max_queue_ms}
    routes = [Route("/predict", predict, methods=["POST"]), *service_routes(server, m, ready)]
    return Starlette(routes=routes, lifespan=lifespan(server),
                     exception_handlers=ERRORS_AS_JSON), server


def refusal(server) -> Response | None:
    """The 503 a request gets before any work (warming up, shutting down, overloaded), counted;
    None: it may go on. By the server's config as it is now: a swap may have changed the
    longest wait admitted (``Server.swap``)."""
    m, cfg = server.metrics, server.cfg
    headers = {"Retry-After": str(cfg.retry_after_s)}
    if not server.ready or server.stopping:
        if server.stopping:  # this connection is not kept: the listening socket is closing
            headers["Connection"] = "close"
        return m.refused("unavailable", 503, _error(503, not_serving(server), headers))
    full = overloaded(server, cfg) or (
        f"{server.receiving} bodies still arriving ({RECEIVING}x --queue-limit)"
        if server.receiving >= RECEIVING * cfg.queue_limit else None)
    if full:
        return m.refused("overloaded", 503, _error(
            503, f"overloaded: {full}; retry after {cfg.retry_after_s} s", headers))
    return None


async def receive(request: Request, server, cfg: ServeConfig) -> bytes | Response:
    """The request's whole body, or the answer to a body refused (413), late (408) or abandoned
    by its client (no error of the server's: counted apart, answered to no one)."""
    m = server.metrics
    server.receiving += 1
    try:
        return await asyncio.wait_for(_read_body(request, cfg.max_body_bytes),
                                      cfg.body_timeout_s)
    except BadInput as e:
        return m.refused("bad_input", e.status, _error(e.status, e.line))
    except asyncio.TimeoutError:
        return m.refused("bad_input", 408, _error(
            408, f"body not received whole within {cfg.body_timeout_s:g} s (--body-timeout-s)",
            {"Connection": "close"}))
    except ClientDisconnect:
        m.requests.labels("disconnected").inc()
        return Response(status_code=499)
    finally:
        server.receiving -= 1


def overloaded(server, cfg: ServeConfig) -> str | None:
    """Why a request is refused for load (None: admitted): the queue's count, then the wait the
    requests admitted before it would give it."""
    if server.admitted >= cfg.queue_limit:
        return f"{server.admitted} requests in the queue (the limit, --queue-limit)"
    wait = server.backlog.wait_ms(server.admitted) if cfg.max_queue_ms else None
    if wait is not None and wait > cfg.max_queue_ms:
        return (f"about {wait:.3g} ms of work ahead of it ({server.admitted} requests), past "
                f"{cfg.max_queue_ms:g} ms (--max-queue-ms; the artifact's p99 target unless set)")
    return None


def not_serving(server) -> str:
    """Why a request is refused before any work: the server is warming up or shutting down."""
    if server.stopping:
        return "shutting down: in-flight requests are being answered, new ones refused"
    return "warming up: not ready yet (GET /readyz)"


class Draining(uvicorn.Server):
    """uvicorn's server, whose SIGTERM (or Ctrl-C) first marks ``server`` as stopping, so a
    request that reaches a handler after the signal (uvicorn closes its listening socket on its
    next tick, up to 0.1 s later) is refused 503 rather than started, and says on stdout how much
    is in flight; then uvicorn drains as it does: stop accepting, let every open response finish
    (a decoder's stream to its last token), shut the lifespan down."""

    def __init__(self, config: uvicorn.Config, server):
        super().__init__(config)
        self.served_by = server

    def handle_exit(self, sig, frame) -> None:
        if not self.should_exit:
            self.served_by.stopping = True
            # os.write, not print: this runs in a signal handler, which may interrupt a print of
            # the main thread (a buffered writer is not reentrant)
            os.write(1, f"serve: {signal.Signals(sig).name}: stopping; "
                        f"{self.served_by.in_flight} in flight, answered before exit\n".encode())
        super().handle_exit(sig, frame)


def service_routes(server, m, ready: dict) -> list:
    """/healthz (alive), /readyz (``ready`` once ``server.ready``, else 503 with why) and /metrics
    (Prometheus' text format): the same for every kind of server."""
    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "alive"})

    async def readyz(request: Request) -> Response:
        if server.ready:  # a value that is a function is read now (the version: --follow)
            return JSONResponse({"status": "ready", **{k: v() if callable(v) else v
                                                      for k, v in ready.items()}})
        return JSONResponse({"status": server.failed or "warming up"}, status_code=503)

    async def metrics(request: Request) -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST

        return Response(m.text(), media_type=CONTENT_TYPE_LATEST)

    return [Route("/healthz", healthz), Route("/readyz", readyz), Route("/metrics", metrics)]


def lifespan(server):
    """Start ``server`` (its ``start``, ``stop``, ``failed``) with the app, stop it with the app.
    Warm-up runs as a task: the server answers /healthz and /readyz (503) meanwhile; a start that
    fails is one line, then SIGTERM, and the command line exits non-zero."""
    @contextlib.asynccontextmanager
    async def span(app):
        async def start():
            try:
                await server.start()
            except Exception as e:  # noqa: BLE001 - one line, then the process ends non-zero
                from pipeline.core.errors import PipelineError

                # arguments that cannot work (ConfigError) end with 2, anything else with 3
                server.failed_code = e.exit_code if isinstance(e, PipelineError) else 3
                server.failed = str(e) if isinstance(e, PipelineError) else \
                    f"{type(e).__name__}: {e}"
                print(f"serve: start-up failed: {server.failed}", flush=True)
                os.kill(os.getpid(), signal.SIGTERM)

        starting = asyncio.create_task(start())
        try:
            yield
        finally:
            if not starting.done():
                starting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await starting
            await server.stop()

    return span
