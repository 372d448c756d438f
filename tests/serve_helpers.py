"""Starting the real server (``python -m pipeline.serve``) for a test, and what its tests send."""
from __future__ import annotations

import contextlib
import io
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


class Running:
    def __init__(self, proc: subprocess.Popen, url: str, log: Path):
        self.proc, self.url, self.log = proc, url, log

    def stop(self, sig=signal.SIGTERM, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout)

    def rss_mb(self) -> float:
        with open(f"/proc/{self.proc.pid}/status") as f:
            return next(int(ln.split()[1]) / 1024 for ln in f if ln.startswith("VmRSS:"))


def start(ref: str, tmp: Path, *args: str, timeout: float = 180, port: int = 0,
          env: dict | None = None) -> Running:
    """The server on 127.0.0.1, any free port (``--port 0``) unless ``port``, once it says it is
    ready; ``env``: more environment for it."""
    ready, log = tmp / "ready", tmp / "server.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    proc = subprocess.Popen([sys.executable, "-m", "pipeline.serve", ref, "--host", "127.0.0.1",
                             "--port", str(port), "--ready-file", str(ready), *args], cwd=ROOT,
                            env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)  # its own group: a test may signal it all
    deadline = time.monotonic() + timeout
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"server did not start (exit {proc.poll()}):\n{log.read_text()}")
        time.sleep(0.1)
    return Running(proc, f"http://127.0.0.1:{ready.read_text()}", log)


def png(array: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format="PNG")
    return buf.getvalue()


def line_png(width: int = 96, height: int = 32, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    return png(rng.integers(0, 256, size=(height, width), dtype=np.uint8))


def png_claiming(width: int, height: int) -> bytes:
    """A PNG whose header claims ``width`` x ``height`` grey pixels and whose data is a few bytes
    of a zlib stream: what a decompression bomb looks like before it is decoded."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr)
            + chunk(b"IDAT", zlib.compress(b"\0" * 4096, 9)) + chunk(b"IEND", b""))


def metrics(url: str) -> dict:
    """/metrics parsed by prometheus_client's own parser: {(name, labels...): value}."""
    import requests
    from prometheus_client.parser import text_string_to_metric_families

    text = requests.get(f"{url}/metrics", timeout=30).text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, *sorted(s.labels.items()))] = s.value
    return out


@contextlib.contextmanager
def local_ray(num_cpus: int = 2):
    """A local Ray cluster of its own with Ray Serve's proxy on a free 127.0.0.1 port: yields
    (serve, the proxy's URL); shut down after."""
    import socket
    import tempfile

    import ray
    from ray import serve

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # Ray 2.60 turns token authentication on for a new local cluster and writes a token to
    # ~/.ray/auth_token, which every later client on the machine then presents, and which a
    # cluster started without it (tests/test_sweep.py's `ray start`) refuses: a test leaves
    # nothing behind in the user's home
    mode = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"
    # a cluster of its own, on the loopback address (traffic stays on 127.0.0.1) and in a temp
    # folder of its own (short: Ray's socket paths must fit 107 bytes), so that nothing of another
    # cluster on this machine (a sweep test's, Ray's default /tmp/ray) is found or reused
    temp = tempfile.mkdtemp(prefix="ray-")
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, logging_level="ERROR",
             log_to_driver=False, _node_ip_address="127.0.0.1", _temp_dir=temp)
    # Ray Serve gives its HTTP proxy a fixed 60 s to come up (a constant, no setting); on two
    # cores busy with the other half of the suite, or a benchmark beside it, a fresh worker
    # process has missed that and the whole module errored at setup. The wait is a test's
    # patience, not behaviour under test: give it five minutes where the constant exists.
    from ray.serve._private import api as serve_api, client as serve_client

    for module in (serve_api, serve_client):
        if hasattr(module, "HTTP_PROXY_TIMEOUT"):
            module.HTTP_PROXY_TIMEOUT = max(module.HTTP_PROXY_TIMEOUT, 300)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        yield serve, f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)
        if mode is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = mode


def tiny_decoder(root: Path, name: str = "tiny-llama", **shape) -> Path:
    """The tiny Llama of ``tests/llm_tiny.py`` (``shape``: its layers, hidden, intermediate),
    exported FP32 by onnxruntime-genai's model builder and laid out as ``pipeline.registry pull``
    lays out a published decoder (the builder's folder plus ``manifest.json``)."""
    import json

    from llm_tiny import llama

    from tests import decoder_tiny

    llama(root / "hf", **shape)  # a byte-level BPE tokenizer, which onnxruntime-genai reads
    folder = decoder_tiny.build(root / "hf", root / "served", "fp32")
    (folder / "manifest.json").write_text(json.dumps(
        {"config": {"model": {"name": name, "source": "hf"}}, "metrics": {}}))
    return folder


def greedy_reference(folder: str, prompt: str, new: int) -> list[int]:
    """onnxruntime-genai's Generator run directly (greedy): the tokens a server must stream. Run
    it in a child process (``pipeline.core.isolate.call``)."""
    import onnxruntime_genai as og

    model = og.Model(folder)
    ids = og.Tokenizer(model).encode(prompt)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + new, do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens(np.asarray([ids], dtype=np.int32))
    while not gen.is_done():
        gen.generate_next_token()
    return [int(t) for t in gen.get_sequence(0)[len(ids):]]


def sse_events(lines) -> list[tuple[str, dict]]:
    """(event, data) pairs of a server-sent event stream's lines."""
    import json

    out, kind = [], None
    for line in lines:
        if line.startswith("event: "):
            kind = line[len("event: "):]
        elif line.startswith("data: "):
            out.append((kind, json.loads(line[len("data: "):])))
    return out
