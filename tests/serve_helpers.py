"""Starting the real server (``python -m pipeline.serve``) for a test, and what its tests send."""
from __future__ import annotations

import io
import os
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


def start(ref: str, tmp: Path, *args: str, timeout: float = 180) -> Running:
    """The server on 127.0.0.1, any free port (``--port 0``), once it says it is ready."""
    ready, log = tmp / "ready", tmp / "server.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "pipeline.serve", ref, "--host", "127.0.0.1",
                             "--port", "0", "--ready-file", str(ready), *args], cwd=ROOT, env=env,
                            stdout=log.open("w"), stderr=subprocess.STDOUT)
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
