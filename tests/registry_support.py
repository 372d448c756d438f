"""Helpers for the registry tests: tiny ONNX models built here, their evidence, publishing from a
child process (so it can be killed), the registry CLI, and the real servers (Debian's
docker-registry, ``mlflow server``) started on 127.0.0.1 on a free port and stopped afterwards."""
from __future__ import annotations

import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import types
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DOCKER_REGISTRY = "/usr/bin/docker-registry"


def make_model(path: Path, seed: int, floats: int = 16) -> Path:
    """An Add of a seed-dependent constant, image [batch,1,32,width] -> logits, plus ``floats``
    random weights so that sizes and digests differ."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.full((1, 1, 1, 1), float(seed), np.float32), "w")
    pad = numpy_helper.from_array(
        np.random.default_rng(seed).standard_normal(floats).astype(np.float32), "pad")
    graph = helper.make_graph(
        [helper.make_node("Add", ["image", "w"], ["logits"])], f"tiny{seed}",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 1, 32, "width"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 1, 32, "width"])],
        [w, pad])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    return path


def evidence(passed: bool = True) -> dict:
    """What ``python -m pipeline`` puts in a manifest, with small made-up numbers."""
    return {"config": {"model": {"name": "ocr"}, "quant": {"mode": "int8"},
                       "hardware": {"intra_op_threads": 2, "inter_op_threads": 1},
                       "bench": {"batch_sizes": [1, 8]}},
            "lineage": {"source": {"digest": "a" * 64, "stage": "load", "parent": None}},
            "verdict": {"passed": passed, "summary": "PASS" if passed else "FAIL: 0.9x < 1.0x"},
            "metrics": {"sequence_accuracy": 97.5, "cer": 0.6, "agreement_with_fp16": 0.99},
            "latency": {"8": {"p50": 2.5, "p99": 3.1}},
            "environment": {"tools": {"onnx": "1.x", "onnxruntime": "1.y"}},
            "input_contract": {"input": "image", "shape": [{"min": 1, "max": 8}]},
            "calibration_set": "c" * 64, "evaluation_set": "e" * 64}


def candidate(model: Path) -> types.SimpleNamespace:
    sha = hashlib.sha256(Path(model).read_bytes()).hexdigest()
    return types.SimpleNamespace(model=Path(model), digest=sha, files_digest=sha)


def version_of(model: Path, mode: str = "int8") -> str:
    return f"{mode}-{candidate(model).files_digest[:16]}"


# A child that publishes one model: argv = model, gate verdict (pass|fail), then key=value fields
# of RegistryConfig; with PUBLISH_GO set it says it is ready (<go>.ready-<pid>) and waits for
# that file first (a start barrier).
PUBLISH = """
import os, sys, time
from pathlib import Path
from pipeline.config import RegistryBackend, RegistryConfig
from pipeline.registry import publish
from tests.registry_support import candidate, evidence
go = os.environ.get("PUBLISH_GO")
if go:
    Path(f"{go}.ready-{os.getpid()}").touch()
while go and not Path(go).exists():
    time.sleep(0.002)
fields = dict(a.split("=", 1) for a in sys.argv[3:])
if "backend" in fields:
    fields["backend"] = RegistryBackend(fields["backend"])
print(publish(RegistryConfig(**fields), model_name="ocr", mode="int8",
              candidate=candidate(sys.argv[1]), manifest=evidence(sys.argv[2] == "pass")))
"""


def publish_cmd(model: Path, passed: bool = True, **fields) -> list[str]:
    return [sys.executable, "-c", PUBLISH, str(model), "pass" if passed else "fail",
            *(f"{k}={v}" for k, v in fields.items())]


def env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def registry_cli(*args: str, cwd: Path = ROOT, timeout: int = 120) -> subprocess.CompletedProcess:
    from tests.conftest import run_cli

    return run_cli(*args, cwd=cwd, timeout=timeout, module="pipeline.registry")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A child server in its own process group, waited for by polling ``health_url``."""

    def __init__(self, cmd: list[str], health_url: str, log: Path, env_extra: dict | None = None,
                 startup_s: float = 60):
        self.log = open(log, "wb")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     env={**os.environ, **(env_extra or {})},
                                     start_new_session=True)
        deadline = time.monotonic() + startup_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                with urllib.request.urlopen(health_url, timeout=2) as r:
                    if r.status == 200:
                        return
            except urllib.error.HTTPError as e:
                if e.code == 401:  # up, and asking for credentials
                    return
                time.sleep(0.2)
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"{cmd[0]} did not come up at {health_url}; log: "
                           f"{Path(log).read_text(errors='replace')[-2000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # the group: mlflow runs uvicorn children
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


def docker_registry() -> tuple[str | None, str]:
    """The docker-registry binary, installed from Debian when missing and we are root with apt;
    ``(None, reason)`` when it is absent and cannot be installed."""
    if os.access(DOCKER_REGISTRY, os.X_OK):
        return DOCKER_REGISTRY, ""
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return None, "not root or no apt-get"
    apt, last = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}, "apt-get failed"
    for cmd in (["apt-get", "install", "-y", "-q", "docker-registry"],
                ["sh", "-c", "apt-get update -q && apt-get install -y -q docker-registry"]):
        try:
            done = subprocess.run(cmd, env=apt, capture_output=True, text=True, timeout=300)
            lines = (done.stderr or done.stdout).strip().splitlines()
            last = lines[-1] if lines else f"exit code {done.returncode}"
        except subprocess.TimeoutExpired:
            last = "apt-get timed out"
        if os.access(DOCKER_REGISTRY, os.X_OK):
            return DOCKER_REGISTRY, ""
    return None, last


def start_docker_registry(tmp: Path, htpasswd: Path | None = None) -> tuple[str, Path, Server]:
    """A registry on a free port; with ``htpasswd`` it wants HTTP basic auth."""
    binary, reason = docker_registry()
    if binary is None:
        import pytest

        pytest.skip(f"Debian's docker-registry is not installed and could not be installed "
                    f"({reason}); .ci/run installs it")
    storage, port = tmp / "storage", free_port()
    config = tmp / "config.yml"
    config.write_text(f"""version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: {storage}
  delete:
    enabled: true
http:
  addr: 127.0.0.1:{port}
  secret: test-only-upload-state-secret
""" + (f"""auth:
  htpasswd:
    realm: test
    path: {htpasswd}
""" if htpasswd else ""))
    url = f"http://127.0.0.1:{port}"
    return url, storage, Server([binary, "serve", str(config)], f"{url}/v2/", tmp / "log")


def start_mlflow(tmp: Path) -> tuple[str, Server]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
           "--workers", "1", "--backend-store-uri", f"sqlite:///{tmp / 'mlflow.db'}",
           "--artifacts-destination", str(tmp / "artifacts")]
    # No background job runner: seven worker processes on a 2-core machine, and unused here.
    server = Server(cmd, f"{url}/health", tmp / "log", startup_s=120,
                    env_extra={"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
    return url, server


def flip_byte(path: Path, offset: int = 40) -> None:
    data = bytearray(path.read_bytes())
    data[offset % len(data)] ^= 0x01
    path.write_bytes(bytes(data))


def htpasswd_line(user: str, password: str) -> str | None:
    """A bcrypt htpasswd entry (cost 4: the registry checks it on every request), or None where
    Python has no ``crypt`` module with bcrypt."""
    import warnings

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            import crypt
        hashed = crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=16))
    except (ImportError, ValueError, AttributeError):
        return None
    return f"{user}:{hashed}\n" if hashed and hashed.startswith("$2") else None
