"""A server process for the serve bench: started in a session of its own, known to be up once
it wrote its port to a file (``--ready-file``, or the naive server's own), stopped with SIGTERM
(its drain) and killed with its process group only when the drain takes over two minutes."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path


def start(cmd: list[str], port_file: Path, timeout: float = 300) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.monotonic() + timeout
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"server did not start: {' '.join(cmd)} (exit {proc.poll()})")
        time.sleep(0.1)
    time.sleep(0.2)  # the naive server writes the port as soon as it listens
    return proc, f"http://127.0.0.1:{port_file.read_text()}"


def stop(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait()


def status_mb(pid: int, key: str) -> float:
    """A memory line of ``/proc/PID/status`` in MB: ``VmRSS`` (resident now), ``VmHWM`` (its
    peak)."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(ln.split()[1]) / 1024 for ln in f if ln.startswith(key + ":"))


def serve_announcing(app, port_file: Path) -> int:
    """``app`` on uvicorn at 127.0.0.1, a free port, written to ``port_file`` once listening
    (what ``start`` waits for); returns when the server stops."""
    import threading

    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning",
                                           access_log=False))

    def announce():
        while not (server.started and server.servers):
            time.sleep(0.05)
        port_file.write_text(str(server.servers[0].sockets[0].getsockname()[1]))

    threading.Thread(target=announce, daemon=True).start()
    server.run()
    return 0
