"""``python -m pipeline.serve REF [options] [registry overrides]``: serve a published artifact
over HTTP (``pipeline.serve``).

    REF                       a registry ref (ocr:production, ocr:int8-0123...), a pulled folder
                              (model.onnx + manifest.json) or a run's folder (artifacts/runs/latest)
    --host H --port P         where to listen (127.0.0.1:8000; port 0: any free port)
    --mode pipeline|inline    worker processes + dynamic batcher (default), or all in the handler
    --workers N               preprocessing processes (default: a third of the usable cores)
    --threads N               the runtime's intra-op threads (default: the other usable cores;
                              1 for a text model)
    --consumers N             threads running the model, a batch each (default: 1; for a text
                              model, the usable cores)
    --max-batch N --max-wait-ms MS --shape-bucket N    the batcher (8, 2 ms, 0: exact sizes)
    --queue-limit N           requests admitted at once; past it 503 + Retry-After (256)
    --max-queue-ms MS         503 + Retry-After for a request that would wait longer than MS
                              behind those admitted (default: the p99 target the artifact's gate
                              judged, slo.p99_ms, none if it judged none, and with --follow
                              each new version's; 0: off)
    --max-body-bytes N --max-pixels N --max-side N     input limits (10 MiB, 16 Mpx, 16384)
    --max-input-values N      the preprocessed input's limit, all feeds (262144: an OCR line
                              32 tall and 8192 wide); past it 413, the model not run
    --body-timeout-s S        a body not received whole within S is 408 (30)
    --ready-file PATH         written (the port) once warm: how a script learns the port
    --follow S                a registry alias (ocr:production): every S seconds, look up the
                              version it names, and when it moved, pull, warm up and serve that
                              one in its place, no request refused for it (0: off, the default)
    --replicas N              serve on Ray Serve instead (pipeline.serve.ray_serve): N replicas
                              behind Ray Serve's proxy on --host:--port (a port other than 0)
    --ray-address ADDR        a running Ray cluster to deploy to (default: a local one of its
                              own, stopped on exit); --replica-cpus F  CPUs per replica (1)
    --max-sequences N --max-seq-len N --max-new-tokens N --kv-budget-mb MB
                              a decoder: sequences at once (4), prompt + new tokens per sequence
                              (the model's context), new tokens when a request names none (64),
                              KV cache all sequences may reserve (half the memory available)
    --decode-batch N          a decoder: sequences decoded together in batches of up to N by
                              onnxruntime-genai's Engine (0: one generator per sequence)

    python -m pipeline.serve load URL [--files DIR | --texts FILE |
        --ocr-lines N [--scale S] [--format F]]
        [--rates Q,Q,.. | --start-qps Q [--growth G] [--max-steps N] [--refine N]] [--seconds S]
        [--max-seconds S] [--window S] [--slo-ms MS] [--concurrency C,C,..] [--out FILE]
        [--allow-remote]
                              the load generator (pipeline.serve.load): open-loop Poisson steps
                              and a concurrency sweep from raw bytes (--texts: a line each, JSON
                              objects as application/json); only 127.0.0.1/localhost
                              unless --allow-remote; --max-seconds: a low rate's step runs longer,
                              up to S, until its p99 interval can close

Registry overrides are Hydra's, as for ``python -m pipeline.registry`` (``registry=oci
registry.url=...``). SIGTERM or Ctrl-C: stop accepting, answer what is in flight, exit 0. Errors
before serving are one line on stderr: 2 bad arguments, 3 an artifact that cannot be served.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from pipeline.cli.args import Parser
from pipeline.serve.inputs import MAX_INPUT_VALUES
from pipeline.core.errors import ConfigError, PipelineError, cli


def _parser() -> argparse.ArgumentParser:
    p = Parser(prog="python -m pipeline.serve", add_help=False)
    p.add_argument("ref")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--mode", default="pipeline")
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--consumers", type=int, default=0)
    p.add_argument("--max-batch", type=int, default=8)
    p.add_argument("--max-wait-ms", type=float, default=2.0)
    p.add_argument("--shape-bucket", type=int, default=0)
    p.add_argument("--queue-limit", type=int, default=256)
    p.add_argument("--max-queue-ms", type=float, default=None)
    p.add_argument("--max-body-bytes", type=int, default=10 * 1024 * 1024)
    p.add_argument("--max-pixels", type=int, default=16 * 1024 * 1024)
    p.add_argument("--max-side", type=int, default=16384)
    p.add_argument("--max-input-values", type=int, default=MAX_INPUT_VALUES)
    p.add_argument("--body-timeout-s", type=float, default=30.0)
    p.add_argument("--ready-file", default=None)
    p.add_argument("--follow", type=float, default=0.0)
    p.add_argument("--max-sequences", type=int, default=4)
    p.add_argument("--max-seq-len", type=int, default=0)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--kv-budget-mb", type=float, default=0.0)
    p.add_argument("--decode-batch", type=int, default=0)
    p.add_argument("--replicas", type=int, default=0)
    p.add_argument("--ray-address", default=None)
    p.add_argument("--replica-cpus", type=float, default=1.0)
    return p




def parse(argv: list[str]):
    """(namespace, ServeConfig, registry overrides); a bad argument is a ``ConfigError``."""
    from pipeline.cli.registry import _is_override
    from pipeline.serve.config import ServeConfig

    overrides = [a for a in argv if _is_override(a)]
    rest = [a for a in argv if a not in overrides]
    parser = _parser()
    try:
        ns, unknown = parser.parse_known_args(rest)
    except SystemExit:
        raise ConfigError(f"bad arguments: {' '.join(rest)} (python -m pipeline.serve -h)") \
            from None
    if unknown:
        raise ConfigError(f"unknown argument(s) {' '.join(unknown)} (python -m pipeline.serve -h)")
    if ns.replicas < 0 or ns.replica_cpus <= 0:
        raise ConfigError("--replicas must be >= 0 and --replica-cpus > 0")
    if (ns.replicas or ns.ray_address) and ns.port == 0:
        raise ConfigError("--port 0 with Ray Serve: its proxy listens on the port it is given, "
                          "and cannot say which one it drew; name a free port")
    if ns.ray_address and not ns.replicas:
        raise ConfigError("--ray-address without --replicas: say how many replicas to deploy")
    _check_follow(ns)
    if ns.ray_address:  # before anything is pulled
        _check_reachable(ns.ray_address)
    _check_host(ns.host)
    cfg = ServeConfig(host=ns.host, port=ns.port, mode=ns.mode, workers=ns.workers,
                      intra_op_threads=ns.threads, consumers=ns.consumers,
                      max_batch=ns.max_batch,
                      max_wait_ms=ns.max_wait_ms, shape_bucket=ns.shape_bucket,
                      queue_limit=ns.queue_limit, max_queue_ms=ns.max_queue_ms,
                      max_body_bytes=ns.max_body_bytes,
                      max_pixels=ns.max_pixels, max_side=ns.max_side,
                      max_input_values=ns.max_input_values, body_timeout_s=ns.body_timeout_s,
                      max_sequences=ns.max_sequences, max_seq_len=ns.max_seq_len,
                      max_new_tokens=ns.max_new_tokens, kv_budget_mb=ns.kv_budget_mb,
                      decode_batch=ns.decode_batch)
    return ns, cfg, overrides


def _check_follow(ns) -> None:
    """``--follow`` follows an alias of a registry, on this server (not Ray Serve's)."""
    import math

    from pipeline.registry.names import ALIASES, parse_ref

    if not ns.follow:
        return
    if not 0 < ns.follow < math.inf:
        raise ConfigError(f"--follow={ns.follow}: seconds between looks, > 0 (0: off)")
    if ns.replicas:
        raise ConfigError("--follow with --replicas: Ray Serve's replicas keep the version they "
                          "were deployed with; deploy again to serve another")
    alias = None if Path(ns.ref).is_dir() or ":" not in ns.ref else parse_ref(ns.ref)[1]
    if alias not in ALIASES:
        raise ConfigError(f"--follow: {ns.ref} is not a registry alias ({', '.join(ALIASES)}, "
                          "e.g. ocr:production): nothing it names ever moves")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print(__doc__)
        return 0
    if argv[0] == "load":
        return cli(_load, argv[1:], __doc__)
    return cli(_serve, argv, __doc__)


def _load(argv: list[str]) -> int:
    from urllib.parse import urlparse

    from pipeline.serve import load

    p = Parser(prog="python -m pipeline.serve load", add_help=False)
    p.add_argument("url")
    p.add_argument("--files", default=None)
    p.add_argument("--texts", default=None)
    p.add_argument("--ocr-lines", type=int, default=64)
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--format", default="PNG", choices=("PNG", "JPEG"))
    p.add_argument("--rates", default=None)
    p.add_argument("--start-qps", type=float, default=10.0)
    p.add_argument("--growth", type=float, default=1.5)
    p.add_argument("--max-steps", type=int, default=12)
    p.add_argument("--refine", type=int, default=3)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--max-seconds", type=float, default=0.0)
    p.add_argument("--window", type=float, default=1.0)
    p.add_argument("--slo-ms", type=float, default=None)
    p.add_argument("--concurrency", default="")
    p.add_argument("--max-in-flight", type=int, default=256)
    p.add_argument("--out", default=None)
    p.add_argument("--allow-remote", action="store_true")
    try:
        ns, unknown = p.parse_known_args(argv)
        rates = [float(r) for r in ns.rates.split(",")] if ns.rates else None
        concurrency = [int(c) for c in ns.concurrency.split(",") if c]
    except (SystemExit, ValueError):
        raise ConfigError(f"bad arguments: {' '.join(argv)} (python -m pipeline.serve -h)") \
            from None
    if unknown:
        raise ConfigError(f"unknown argument(s) {' '.join(unknown)} (python -m pipeline.serve -h)")
    url = urlparse(ns.url)
    if url.scheme not in ("http", "https") or not url.hostname:
        raise ConfigError(f"{ns.url}: not an http:// or https:// URL (e.g. "
                          "http://127.0.0.1:8000)")
    host = url.hostname
    if host not in ("127.0.0.1", "localhost", "::1") and not ns.allow_remote:
        raise ConfigError(f"{ns.url}: load goes to this machine only (127.0.0.1, localhost); "
                          "--allow-remote for another host")
    _check_load_numbers(ns, rates or [], concurrency)
    slo = ns.slo_ms
    if slo is None:  # the project's SLO (conf/slo/default.yaml), as the pipeline judges it
        from pipeline.engine.compose import compose

        slo = compose([]).slo.p99_ms
    for given, what in ((ns.files, "folder"), (ns.texts, "file")):
        if given and not (Path(given).is_dir() if what == "folder" else Path(given).is_file()):
            raise ConfigError(f"{given}: no such {what}")
    if ns.out:  # before minutes of measuring, not after
        load.check_writable(Path(ns.out))
    bodies = load.files(Path(ns.files)) if ns.files else load.texts(Path(ns.texts)) \
        if ns.texts else load.ocr_lines(ns.ocr_lines, ns.scale, fmt=ns.format)
    if not bodies:
        raise ConfigError(f"{ns.files or ns.texts}: nothing to send (no files, or no lines)")
    cfg = load.LoadConfig(slo_p99_ms=slo, step_seconds=ns.seconds, window_s=ns.window,
                          max_in_flight=ns.max_in_flight, max_step_seconds=ns.max_seconds)
    report = load.run(ns.url.rstrip("/"), bodies, cfg, rates, ns.start_qps, ns.growth,
                      ns.max_steps, concurrency, refine=ns.refine)
    print(f"highest rate with p99 <= {slo:g} ms (steady): {report.max_qps_within_slo:.1f} req/s")
    if ns.out:
        load.write(report, Path(ns.out))
        print(f"report: {ns.out}")
    answered = sum(s.ok for s in report.steps) + sum(c.ok for c in report.concurrency)
    if not answered:  # nothing measured is not a rate of 0
        errors: dict = {}
        for s in [*report.steps, *report.concurrency]:
            for k, n in s.errors.items():
                errors[k] = errors.get(k, 0) + n
        raise PipelineError(f"{ns.url}: no request was answered 200 ({errors or 'none sent'}); "
                            "is the server running there, and ready (GET /readyz)?")
    return 0


def _check_load_numbers(ns, rates: list[float], concurrency: list[int]) -> None:
    """Every number the load generator takes, finite and in range, in one line (NaN passes
    every comparison, so each is asked to be finite first)."""
    import math

    floats = {"--rates": rates, "--start-qps": [ns.start_qps], "--seconds": [ns.seconds],
              "--window": [ns.window], "--scale": [ns.scale], "--growth": [ns.growth],
              "--max-seconds": [ns.max_seconds],
              "--slo-ms": [ns.slo_ms] if ns.slo_ms is not None else []}
    bad = [k for k, vs in floats.items() if not all(math.isfinite(v) for v in vs)]
    positive = {"--rates": min(rates, default=1), "--start-qps": ns.start_qps,
                "--seconds": ns.seconds, "--window": ns.window, "--scale": ns.scale,
                "--slo-ms": ns.slo_ms if ns.slo_ms is not None else 1,
                "--concurrency": min(concurrency, default=1), "--ocr-lines": ns.ocr_lines,
                "--max-in-flight": ns.max_in_flight, "--max-steps": ns.max_steps}
    bad += [k for k, v in positive.items() if k not in bad and not v > 0]
    if ns.growth <= 1 and "--growth" not in bad:
        bad.append("--growth")
    bad += [k for k, v in (("--refine", ns.refine), ("--max-seconds", ns.max_seconds))
            if k not in bad and v < 0]
    if bad:
        raise ConfigError(f"{', '.join(bad)}: out of range (rates, --start-qps, --seconds, "
                          "--window, --scale, --slo-ms, --concurrency, --ocr-lines, "
                          "--max-in-flight and --max-steps > 0 and finite, --growth > 1, "
                          "--refine and --max-seconds >= 0)")


def _costs(cfg, served, text: bool) -> tuple[float, float, int] | None:
    """(preprocessing ms, the model's ms, its threads) per request, for the split of the cores
    between the workers and the model's threads when either is left to the server: the reader's
    warm-up request prepared here, and the model's time per sample as its gate's benchmark
    measured it on the threads it ran on. None where the split does not depend on them (text,
    inline, both counts given, a decoder) or nothing was measured."""
    if (text or cfg.mode != "pipeline" or served.kind != "predict" or not served.latency_ms
            or (cfg.workers and cfg.intra_op_threads)):
        return None
    from pipeline.serve.inputs import Limits
    from pipeline.serve.readers import prepare_ms

    prep = prepare_ms(served.reader_key, Limits.of(cfg))
    threads = served.runtime.intra_op_threads
    if prep is None or not isinstance(threads, int) or threads < 1:
        return None
    return prep, served.latency_ms, threads


def _serve(argv: list[str]) -> int:
    import signal

    import uvicorn

    from pipeline.serve.app import Draining, build
    from pipeline.serve.artifact import open_ref
    from pipeline.serve.readers import TextKey

    ns, cfg, overrides = parse(argv)
    with tempfile.TemporaryDirectory(prefix="pipeline-serve-") as tmp:
        served = open_ref(ns.ref, Path(tmp) / "pulled", overrides)
        # the split needs the model's kind and costs; the longest wait admitted, its p99 target
        text = isinstance(served.reader_key, TextKey)
        costs = _costs(cfg, served, text)
        cfg = cfg.resolved(text=text, target_ms=served.target_ms, max_batch=served.max_batch,
                           costs=costs)
        if ns.replicas:
            return _serve_ray(ns, cfg, served)
        if served.kind == "generate":  # a decoder: streamed generation, KV-cache admission
            from pipeline.serve.generate import build as build_generate

            if ns.follow:
                raise ConfigError(f"--follow: {ns.ref} is a decoder, whose server keeps the "
                                  "version it started with; restart it to serve another")
            app, server = build_generate(served, cfg)
        else:
            app, server = build(served, cfg)
            if ns.follow:
                from pipeline.serve.artifact import registry
                from pipeline.serve.follow import Follower

                server.follower = Follower(ns.ref, registry(overrides), ns.follow, Path(tmp),
                                           server)
        config = uvicorn.Config(app, host=cfg.host, port=cfg.port, log_level="warning",
                                access_log=False, lifespan="on", timeout_graceful_shutdown=60)
        userver = Draining(config, server)
        # uvicorn drains on SIGTERM (stops accepting, answers what is in flight, shuts the
        # lifespan down) and then raises the signal again under the handler it found, which
        # would end the process with 143. A drain that completed is a clean exit: the handler
        # it finds ignores the repeat, and the exit code is 0.
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: None)
        if served.kind == "generate":  # no batcher or workers: sequences and their KV cache
            what, how = "a decoder", (f"max_sequences={cfg.max_sequences} "
                                      f"decode_batch={cfg.decode_batch or 'off'}")
        else:
            what, how = served.what, (
                f"mode={cfg.mode} workers={cfg.workers} consumers={cfg.consumers} "
                f"threads={cfg.intra_op_threads} max_batch={cfg.max_batch}")
            if costs:
                how += (f" (cores shared as a request's CPU time: preprocessing {costs[0]:.2f} "
                        f"ms, the model {costs[1]:.2f} ms on {costs[2]} thread(s) as "
                        "benchmarked)")
        print(f"serving {served.named} ({served.model_name}, {what}) on "
              f"http://{cfg.host}:{cfg.port or '(a free port)'} {how}"
              + (f", following {ns.ref} every {ns.follow:g} s" if ns.follow else ""), flush=True)
        _announce(userver, server, cfg.host, Path(ns.ready_file) if ns.ready_file else None)
        userver.run()
    if server.failed:
        print(f"error: {server.failed}", file=sys.stderr)
        return server.failed_code
    print("serve: drained and stopped", flush=True)
    return 0


def _serve_ray(ns, cfg, served) -> int:
    """``served`` as a Ray Serve application (``pipeline.serve.ray_serve``) of ``--replicas``
    replicas, on ``--ray-address``'s cluster or a local one of its own (on 127.0.0.1 when
    ``--host`` is, and stopped on exit), Ray Serve's proxy on ``--host:--port``. Blocks until
    SIGTERM or Ctrl-C, then deletes the application (Ray Serve lets each replica finish what it
    holds) and exits 0. The replicas read the model from this machine's disk: a cluster of
    several machines needs the artifact where each of them can read it."""
    import signal
    import threading

    import ray
    from ray import serve

    from pipeline.serve import ray_serve

    stop = threading.Event()
    local = ns.ray_address is None
    try:
        ray.init(address=ns.ray_address or "local", include_dashboard=False,
                 logging_level="ERROR", log_to_driver=False,
                 **({"_node_ip_address": "127.0.0.1"} if local and cfg.host == "127.0.0.1"
                    else {}))
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise PipelineError(f"Ray cluster {ns.ray_address or '(local)'}: cannot start or join it "
                            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
                            ) from None
    name = f"pipeline-{served.model_name}"
    try:
        serve.start(http_options={"host": cfg.host, "port": cfg.port})
        build = ray_serve.generate_application if served.kind == "generate" else \
            ray_serve.application
        serve.run(build(served, cfg, ns.replicas, ns.replica_cpus), name=name, route_prefix="/")
        # after ray.init, which installs its own SIGTERM handler (it logs and aborts)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        what = served.what
        print(f"serving {served.named} ({served.model_name}, {what}) on Ray Serve "
              f"at http://{cfg.host}:{cfg.port}: {ns.replicas} replica(s) of "
              f"{ns.replica_cpus:g} CPU, cluster {ns.ray_address or 'local'}", flush=True)
        if ns.ready_file:  # serve.run returns once every replica is up: ready
            tmp = Path(ns.ready_file).with_name(Path(ns.ready_file).name + ".tmp")
            tmp.write_text(str(cfg.port))
            tmp.rename(ns.ready_file)
        stop.wait()
        serve.delete(name)
    finally:
        if local:
            serve.shutdown()
        ray.shutdown()
    print("serve: Ray Serve application deleted, stopped", flush=True)
    return 0


def _check_host(host: str) -> None:
    """``--host`` names an address this machine can resolve, before anything is pulled or
    loaded (uvicorn would fail to bind only after the model's start-up, naming no host)."""
    import socket

    try:
        socket.getaddrinfo(host, None)
    except (socket.gaierror, UnicodeError) as e:
        raise ConfigError(f"--host {host}: not an address to listen on "
                          f"({getattr(e, 'strerror', None) or e})") from None


def _check_reachable(address: str) -> None:
    """A cluster's ``HOST:PORT`` (its GCS) refused in one line when nothing answers there:
    ``ray.init`` would retry it for minutes, printing as it goes. ``ray://`` and ``auto`` are
    left to Ray."""
    import socket

    if "://" in address or address == "auto" or ":" not in address:
        return
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=5):
            return
    except (OSError, ValueError) as e:
        raise PipelineError(f"--ray-address {address}: no Ray cluster answers there "
                            f"({type(e).__name__}: {e})") from None


def _announce(userver, server, host: str, path: Path | None) -> None:
    """Once the server is ready, say so on stdout with the port it is bound to (``--port 0``
    draws one), and write that port to ``path`` if given (a thread that polls)."""
    import threading
    import time

    def wait():
        while not userver.should_exit:
            if server.ready and userver.started and userver.servers:
                port = userver.servers[0].sockets[0].getsockname()[1]
                print(f"serve: ready on http://{host}:{port}", flush=True)
                if path is not None:
                    tmp = path.with_name(path.name + ".tmp")
                    tmp.write_text(str(port))
                    tmp.rename(path)  # whole or absent: a reader never sees half a number
                return
            time.sleep(0.05)

    threading.Thread(target=wait, daemon=True).start()
