"""``--follow``: a server started on a registry alias serves each version the alias is promoted
to, warmed up before it answers, no request refused for the swap; a version it cannot serve, and a
registry that fails, leave the version serving in place and are said once."""
from __future__ import annotations

import json
import shutil
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import requests

from tests.conftest import run_folder
from tests.registry_support import candidate, registry_cli
from tests.serve_helpers import line_png, metrics, start


def _versions(root: Path, report: dict, tmp: Path) -> dict:
    """The tiny run's published INT8 version in a copy of its registry, its FP32 model published
    beside it with the same evidence (another version of the same task, as a later run would
    publish) but for a p99 target its gate judged (the tiny run's judged none), and one whose
    evidence records a preprocessing this code cannot rebuild."""
    from pipeline.config import RegistryConfig
    from pipeline.registry import open_backend, publish

    cfg = RegistryConfig(root=str(root))
    int8 = report["published"].split(" ")[0]
    entry, folder = open_backend(cfg).pull("ocr", int8.split("@")[1], tmp / "first")
    evidence = json.loads((Path(folder) / "manifest.json").read_text())
    fp32 = Path(report["lineage"]["fp32"]["path"]) / "model.onnx"
    config = evidence["config"]
    judged = {**config, "gate": {**config["gate"], "check_slo_p99": True},
              "slo": {**config["slo"], "p99_ms": TARGET_MS}}
    other = publish(cfg, "ocr", "fp32", candidate(fp32), {**evidence, "config": judged})
    odd = publish(cfg, "ocr", "odd", candidate(fp32),
                  {**evidence, "serving": {**evidence["serving"], "height": 48}})
    return {"int8": int8, "fp32": other.ref, "odd": odd.ref}


TARGET_MS = 5000.0  # the FP32 version's p99 target: far above any wait this test's client makes


def _wait(what, deadline_s: float = 60):
    deadline = time.monotonic() + deadline_s
    while not what():
        assert time.monotonic() < deadline, "not within a minute"
        time.sleep(0.05)


def test_a_followed_alias_is_served_as_it_moves_and_no_request_is_refused(tiny_run, tmp_path):
    workdir, proc = tiny_run
    root = tmp_path / "registry"
    shutil.copytree(workdir / "registry", root)
    report = json.loads((run_folder(proc) / "report.json").read_text())
    v = _versions(root, report, tmp_path)
    r = f"registry.root={root}"

    def promote(ref: str):
        return registry_cli("promote", ref.split("@")[0], "production", r)

    assert promote(v["int8"]).returncode == 0
    running = start("ocr:production", tmp_path, r, "--follow", "0.2", "--workers", "1",
                    "--threads", "1")
    answers, stop = [], threading.Event()

    def ask():
        while not stop.is_set():
            got = requests.post(f"{running.url}/predict", data=line_png(),
                                headers={"Content-Type": "image/png"}, timeout=60)
            answers.append((got.status_code, got.json().get("version")))

    def ready() -> dict:
        return requests.get(f"{running.url}/readyz", timeout=30).json()

    def serving():
        return ready()["version"]

    asking = threading.Thread(target=ask)
    asking.start()
    try:
        assert serving() == v["int8"]
        assert ready()["max_queue_ms"] == 0  # its gate judged no p99 target: no such limit
        _wait(lambda: answers)  # (each move below waits for an answer of the version before it)
        assert promote(v["fp32"]).returncode == 0
        _wait(lambda: serving() == v["fp32"] and answers[-1][1] == v["fp32"])
        assert ready()["max_queue_ms"] == TARGET_MS  # the longest wait: the new version's target
        # a version whose inputs this code cannot read as recorded: refused, the FP32 one stays
        assert promote(v["odd"]).returncode == 0
        _wait(lambda: metrics(running.url)[("serve_model_updates_total",
                                             ("outcome", "refused"))] == 1)
        assert serving() == v["fp32"]
        assert promote(v["int8"]).returncode == 0  # a rollback is a move like any other
        _wait(lambda: serving() == v["int8"] and answers[-1][1] == v["int8"])
        assert ready()["max_queue_ms"] == 0
        # the FP32 version's folder went with it, as did the refused one's; the first pull's
        # stays (a text model's workers read their tokenizer files there)
        pulled = [Path(ln.rsplit(" into ", 1)[1]) for ln in running.log.read_text().splitlines()
                  if ln.startswith("pulled ")]
        assert [p.name for p in pulled] == ["pulled", "follow-1", "follow-2", "follow-3"]
        assert [p.is_dir() for p in pulled] == [True, False, False, True]
        # the registry fails a lookup: said once, the version serving stays and answers
        (root / "index.json").rename(root / "index.moved")
        _wait(lambda: metrics(running.url)[("serve_model_updates_total",
                                            ("outcome", "failed"))] >= 2)
        (root / "index.moved").rename(root / "index.json")
        stop.set()
        asking.join()
        assert requests.post(f"{running.url}/predict", data=line_png(seed=1),
                             headers={"Content-Type": "image/png"}, timeout=60).ok
        m = metrics(running.url)
        assert m[("serve_model_info", ("ref", "ocr:production"), ("version", v["int8"]))] == 1
        assert m[("serve_model_updates_total", ("outcome", "swapped"))] == 2
    finally:
        stop.set()
        asking.join()
        assert running.stop() == 0, running.log.read_text()
    # every request answered, each naming the version that computed it, in the order promoted
    assert {code for code, _ in answers} == {200}, answers
    order = [ver for k, (_, ver) in enumerate(answers) if k == 0 or answers[k - 1][1] != ver]
    assert order == [v["int8"], v["fp32"], v["int8"]], order
    log = running.log.read_text()
    assert log.count(": now serving it (was ") == 2
    assert f"longest queue wait admitted: {TARGET_MS:g} ms, its p99 target (was none)" in log
    assert "longest queue wait admitted: none (its gate judged no p99 target) " \
        f"(was {TARGET_MS:g} ms)" in log
    assert f"moved to {v['odd']}, which this server does not serve" in log
    assert "preprocessing cannot be rebuilt" in log
    assert log.count("looking it up in the registry failed") == 1, log  # said once


@pytest.mark.parametrize("args, words", [
    (["ocr:int8-0123456789abcdef", "--follow", "5"], "not a registry alias"),
    (["ocr", "--follow", "5"], "not a registry alias"),
    (["ocr:production", "--follow", "-1"], "seconds between looks"),
    (["ocr:production", "--follow", "inf"], "seconds between looks"),
    (["ocr:production", "--follow", "5", "--replicas", "2", "--port", "8123"], "Ray Serve"),
])
def test_what_cannot_be_followed_is_refused_before_anything_is_pulled(args, words):
    from pipeline.cli.serve import parse
    from pipeline.core.errors import ConfigError

    with pytest.raises(ConfigError, match=words):
        parse(args)


def test_a_folder_is_not_followed(tmp_path):
    from pipeline.cli.serve import parse
    from pipeline.core.errors import ConfigError

    with pytest.raises(ConfigError, match="not a registry alias"):
        parse([str(tmp_path), "--follow", "1"])


def _graph(path: Path, batch) -> Path:
    """y = x + 1 on x [batch, 4]: ``batch`` a name (any batch) or 1 (its graph runs one)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [batch, 4]) for n in ("x", "y")]
    graph = helper.make_graph([helper.make_node("Add", ["x", "one"], ["y"])], "g", io[:1],
                              io[1:], [numpy_helper.from_array(np.ones(4, np.float32), "one")])
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(helper.make_model(graph), str(path))
    return path


def test_a_version_is_served_in_place_only_where_this_server_reads_its_inputs_alike(tmp_path):
    """What ``--follow`` swaps in: the same reading of inputs (a text model's tokenizer by its
    files' digests, wherever they were pulled), a predictor, a graph that takes the server's
    batches."""
    from pipeline.runtimes.record import Deployed
    from pipeline.serve.artifact import Served
    from pipeline.serve.follow import unservable
    from pipeline.serve.readers import TextKey
    from pipeline.task.serving import TextInput

    def version(folder: str, key="ocr", batch="batch", **kw) -> Served:
        return Served("m:production", _graph(tmp_path / folder / "model.onnx", batch), "m", key,
                      None, None, None, Deployed.read(None, None), **kw)

    now = version("a")
    assert unservable(now, version("b"), 8) is None
    assert "1 sample(s) at a time" in unservable(now, version("c", batch=1), 8)
    assert unservable(now, version("c", batch=1), 1) is None
    assert "decoder" in unservable(now, version("d", kind="generate"), 8)
    assert "read inputs differently" in unservable(now, version("e", key="ocr_mobile"), 8)
    spec = TextInput(task="feature-extraction", input_names=("input_ids",), max_length=64,
                     pad_token_id=0, metric="cosine", top_k=5, labels=None,
                     files={"tokenizer.json": "a" * 64})
    text = version("f", key=TextKey(str(tmp_path / "f"), spec))
    assert unservable(text, version("g", key=TextKey(str(tmp_path / "g"), spec)), 8) is None
    longer = replace(spec, max_length=128)
    assert "read inputs differently" in unservable(
        text, version("h", key=TextKey(str(tmp_path / "h"), longer)), 8)
