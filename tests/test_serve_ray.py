"""The Ray Serve deployments (``pipeline.serve.ray_serve``) on one local Ray cluster started here
(starting one costs more than either test, so the module shares it):
- two replicas of the tiny run's published model answer raw PNG bytes over Ray Serve's HTTP proxy
  on 127.0.0.1 with what the model says when it is run directly on the same preprocessed input,
  and bad input with the HTTP server's one-line 4xx;
- the decoder's deployment (``generate_application``), started by the command line on that
  cluster (``python -m pipeline.serve FOLDER --replicas 1 --ray-address ADDR``), streams the tiny
  Llama's tokens through the proxy as server-sent events, one event per token, equal to
  onnxruntime-genai's greedy generation run directly; a request over the sequence length is the
  HTTP server's 413; SIGTERM deletes its application, leaves the other, and exits 0.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.conftest import run_folder
from tests.serve_helpers import (greedy_reference, line_png, local_ray, sse_events, start,
                                 tiny_decoder)

PROMPT = "the quick brown fox jumps over"


@pytest.fixture(scope="module")
def cluster():
    pytest.importorskip("ray.serve")
    with local_ray() as (serve, url):
        yield serve, url


@pytest.fixture(scope="module")
def ray_app(cluster, tiny_run, tmp_path_factory):
    from pipeline.serve.artifact import open_ref
    from pipeline.serve.config import ServeConfig
    from pipeline.serve.ray_serve import application

    serve, url = cluster
    _, proc = tiny_run
    served = open_ref(str(run_folder(proc)), tmp_path_factory.mktemp("pull"))
    cfg = ServeConfig(max_batch=4, max_wait_ms=20, intra_op_threads=1, workers=1)
    serve.run(application(served, cfg, replicas=2, num_cpus=0.5), name="recognizer",
              route_prefix="/predict")
    yield served, f"{url}/predict", serve


def _direct(model, task_key, bodies: list[bytes]) -> list[str]:
    """The model run on the same bytes, through the same functions, in a child process (as the
    runner runs stages: a session here would set onnxruntime's process-wide thread pool in the
    test worker, and later tests' plain sessions would be refused)."""
    from pipeline import runtimes
    from pipeline.config import HardwareRuntime
    from pipeline.models import task
    from pipeline.serve.inputs import Limits
    from pipeline.serve.readers import prepare

    t = task(task_key)
    loaded = runtimes.load(model, HardwareRuntime("cpu", "CPUExecutionProvider", 1, 1))
    answers = []
    for body in bodies:
        p = prepare(body, "image/png", Limits(1 << 24, 1 << 24, 1 << 14), task_key)
        answers.append(t.predictions(loaded.run(p.feeds))[0])
    return answers


def test_replicas_answer_raw_bytes_and_bad_input(ray_app):
    served, url, serve = ray_app
    bodies = [line_png(width=64 + 4 * (k % 3), seed=k) for k in range(8)]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda b: requests.post(url, data=b, timeout=120,
                                                        headers={"Content-Type": "image/png"}),
                                bodies))
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
    from pipeline.core import isolate

    assert [a.json()["prediction"] for a in answers] == isolate.call(
        "direct", _direct, served.model, served.reader_key, bodies)
    # each replica names the version it answers with: what the run published
    assert "@sha256:" in served.version
    assert {a.json()["version"] for a in answers} == {served.version}
    bad = requests.post(url, data=b"not an image", timeout=60)
    assert bad.status_code == 415 and "not a PNG or JPEG" in bad.json()["error"]
    status = serve.status().applications["recognizer"].deployments["Recognizer"]
    assert status.replica_states.get("RUNNING") == 2, json.dumps(str(status))


def test_the_command_line_deploys_a_decoder_replica_that_streams_the_greedy_tokens(cluster,
                                                                                   tmp_path):
    """``python -m pipeline.serve FOLDER --replicas 1 --ray-address ADDR``: the decoder's
    deployment on the module's cluster, behind its Ray Serve proxy; SIGTERM deletes that
    application alone (the recognizer's stays) and exits 0. (Without ``--ray-address`` the
    command starts a cluster of its own, the same code but for ``ray.init``'s address.)"""
    import ray

    from pipeline.core import isolate

    serve, url = cluster
    folder = tiny_decoder(tmp_path / "decoder")
    port = int(url.rsplit(":", 1)[1])
    # as local_ray's cluster was started: without token authentication
    env = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    running = start(str(folder), tmp_path, "--replicas", "1", "--replica-cpus", "0.5",
                    "--threads", "1", "--max-seq-len", "64", "--max-sequences", "2",
                    "--ray-address", ray.get_runtime_context().gcs_address,
                    port=port, env=env, timeout=420)
    try:
        url = running.url
        assert url.endswith(f":{port}")
        deadline = time.monotonic() + 300
        while requests.get(f"{url}/readyz", timeout=30).status_code != 200:
            assert time.monotonic() < deadline, "the replica never warmed up"
            time.sleep(0.5)
        with requests.post(f"{url}/generate", json={"prompt": PROMPT, "max_new_tokens": 10},
                           stream=True, timeout=120) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith(
                "text/event-stream"), r.text
            events = sse_events(r.iter_lines(decode_unicode=True))
        too_long = requests.post(f"{url}/generate",
                                 json={"prompt": PROMPT, "max_new_tokens": 65}, timeout=60)
    finally:
        code = running.stop(timeout=180)
    assert code == 0, running.log.read_text()
    assert "pipeline-tiny-llama" not in serve.status().applications
    tokens = [e["id"] for kind, e in events if kind == "token"]
    assert events[-1][0] == "done" and tokens == events[-1][1]["tokens"]
    assert tokens == isolate.call("reference generation", greedy_reference, str(folder), PROMPT,
                                  10)
    assert too_long.status_code == 413 and "--max-seq-len" in too_long.json()["error"]


def test_ray_serve_arguments_that_cannot_work_are_refused_in_one_line(tmp_path):
    import socket

    from tests.conftest import ROOT, one_line

    def serve(*args):
        return subprocess.run([sys.executable, "-m", "pipeline.serve", str(tmp_path), *args],
                              cwd=ROOT, capture_output=True, text=True, timeout=120)

    one_line(serve("--replicas", "2", "--port", "0"), 2, "--port 0", "Ray Serve")
    one_line(serve("--ray-address", "127.0.0.1:6379", "--port", "8123"), 2, "--replicas")
    one_line(serve("--replicas", "-1"), 2, "--replicas")
    # nothing listens there: one line at once, where ray.init would retry for minutes
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    one_line(serve("--replicas", "1", "--ray-address", f"127.0.0.1:{free}", "--port", "8123"), 3,
             f"127.0.0.1:{free}", "no Ray cluster answers")
