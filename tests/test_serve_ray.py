"""The Ray Serve deployment (``pipeline.serve.ray_serve``) on a local Ray cluster started here:
two replicas of the tiny run's published model answer raw PNG bytes over Ray Serve's HTTP proxy
on 127.0.0.1 with what the model says when it is run directly on the same preprocessed input, and
bad input with the HTTP server's one-line 4xx.
"""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.conftest import run_folder
from tests.serve_helpers import line_png, local_ray


@pytest.fixture(scope="module")
def ray_app(tiny_run, tmp_path_factory):
    pytest.importorskip("ray.serve")
    from pipeline.serve.artifact import open_ref
    from pipeline.serve.config import ServeConfig
    from pipeline.serve.ray_serve import application

    _, proc = tiny_run
    served = open_ref(str(run_folder(proc)), tmp_path_factory.mktemp("pull"))
    with local_ray() as (serve, url):
        cfg = ServeConfig(max_batch=4, max_wait_ms=20, intra_op_threads=1, workers=1)
        serve.run(application(served, cfg, replicas=2, num_cpus=0.5), route_prefix="/predict")
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
        "direct", _direct, served.model, served.task_key, bodies)
    bad = requests.post(url, data=b"not an image", timeout=60)
    assert bad.status_code == 415 and "not a PNG or JPEG" in bad.json()["error"]
    status = serve.status().applications["default"].deployments["Recognizer"]
    assert status.replica_states.get("RUNNING") == 2, json.dumps(str(status))
