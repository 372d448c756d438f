"""An ONNX file whose graph runs one sample at a time: it declares a batch of 1 and fails at batch
2 (a static export's Reshape to a constant ``[1, features]``, as transformers exported at fixed
shapes and detectors with NMS in the graph are). The run feeds it one sample per model run
wherever it evaluates, calibrates, times or serves it, says so, keeps the batch of 1 declared in
the artifact, and the server and the Triton config never batch it. An output without a leading
batch axis of 1 cannot be read per sample: one line."""
from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import onnx
import pytest
import requests

from tests.conftest import run_cli, run_folder
from tests.serve_helpers import start
from tests.test_serve_user_image import CLASSIFIER as ARGS, FAST  # the same classifier's run


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    from tests import byo_net

    root = tmp_path_factory.mktemp("batch_of_one")
    byo_net.write_folder(root / "data", 25)
    given = byo_net.to_onnx(byo_net.train(root / "cnn.safetensors"), root / "cnn.onnx")
    byo_net.batch_of_one(given, root / "one.onnx")
    byo_net.batch_of_one(given, root / "rows.onnx", rows=3)
    byo_net.batch_of_one(given, root / "mixed.onnx", mixed=True)
    return root


def test_the_run_sets_every_batch_size_to_what_the_graph_runs():
    """The config a run of such a graph runs with: each batch size above the limit lowered to it
    and named once; a graph of any batch leaves the config as composed."""
    from types import SimpleNamespace

    from pipeline.engine.compose import compose
    from pipeline.task.batch_limit import within

    cfg = compose(["bench.batch_sizes=[1,4,16]", "gate.speedup_batch_size=16",
                   "model.eval_batch_size=64", "bench.mode=load"])
    ran, note = within(cfg, SimpleNamespace(max_batch=1))
    assert (ran.bench.batch_sizes, ran.gate.speedup_batch_size, ran.model.eval_batch_size,
            ran.quant.calibration_batch_size, ran.bench.load.max_batch, ran.slo.batch_size) == \
        ([1], 1, 1, 1, 1, 1)
    assert ran.bench.mode == cfg.bench.mode and ran.quant.mode == cfg.quant.mode
    assert note.startswith("the model runs at most 1 sample(s) per run: ")
    assert "bench.batch_sizes=[1, 4, 16] -> [1]" in note and "slo.batch_size" not in note
    assert within(cfg, SimpleNamespace(max_batch=None)) == (cfg, None)
    assert within(ran, SimpleNamespace(max_batch=1)) == (ran, None)  # nothing left to lower


def test_an_output_without_a_batch_axis_is_refused_in_one_line(files):
    from benchmarks.byo import _task
    from pipeline.core.errors import ConfigError

    with pytest.raises(ConfigError, match=r"declares a fixed batch of 1 and the graph fails at "
                                          r"batch 2 \(.*Gemm.*\), so it runs one sample at a time;"
                                          r" but output logits is \[3, 1\] at batch 1, with no "
                                          r"leading batch axis"):
        _task([*ARGS, f"model.path={files / 'rows.onnx'}", f"data.path={files / 'data'}",
               f"data_dir={files / 'dd-rows'}"])


def test_a_graph_that_mixes_the_samples_at_batch_2_runs_one_at_a_time(files):
    """Batch 2 runs without an error but returns both samples' logits as one row: made dynamic,
    the batch would be read wrong without a word. It is a graph of batch 1, said so."""
    from benchmarks.byo import _task

    _, t = _task([*ARGS, f"model.path={files / 'mixed.onnx'}", f"data.path={files / 'data'}",
                  f"data_dir={files / 'dd-mixed'}"])
    assert t.max_batch == 1 and t.outputs[0].shape == ("batch", 3)
    assert any("mixes the samples: output logits is [1, 3] at batch 1 and [1, 6] at batch 2"
               in w for w in t.warnings), t.warnings
    assert [next(t.batches(t.dataset(t.split("evaluation", 45, "")), 8)).feeds["image"].shape[0]]\
        == [1]


def test_a_graph_of_batch_one_is_compiled_served_and_exported_a_sample_at_a_time(files,
                                                                               tmp_path):
    root = files
    args = [*ARGS, f"model.path={root / 'one.onnx'}", f"data.path={root / 'data'}"]
    proc = run_cli(*args, "quant=int8", f"workdir={root / 'work'}", f"data_dir={root / 'dd'}",
                   f"registry.root={root / 'registry'}", *FAST)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[E:onnxruntime" not in proc.stderr  # the probe's failure at batch 2 is one line
    assert re.search(r"warning: .*one\.onnx: input\(s\) image declare a fixed batch of 1 and "
                     r"the graph fails at batch 2 \(.*Gemm", proc.stderr), proc.stderr
    report = json.loads((run_folder(proc) / "report.json").read_text())
    config = report["config"]
    assert (config["bench"]["batch_sizes"], config["gate"]["speedup_batch_size"],
            config["model"]["eval_batch_size"], config["quant"]["calibration_batch_size"]) == \
        ([1], 1, 1, 1)
    assert any("at most 1 sample(s) per run" in w for w in report["warnings"])
    assert report["verdict"]["passed"], report["verdict"]
    ref = report["published"].split("@")[0]
    r = f"registry.root={root / 'registry'}"
    # served: requests arriving together are each run alone, and answer as evaluated
    from tests.test_serve_user_image import _evaluation_files, _task

    bodies = _evaluation_files(_task(root / "dd", *args), 45)
    running = start(ref, tmp_path, r)
    try:
        ready = requests.get(f"{running.url}/readyz", timeout=30).json()

        def post(body: bytes):
            return requests.post(f"{running.url}/predict", data=body, timeout=120,
                                 headers={"Content-Type": "image/png"})

        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(post, bodies))
    finally:
        assert running.stop() == 0, running.log.read_text()
    assert [a.status_code for a in answers] == [200] * 45, [a.text for a in answers][:3]
    assert ready["max_batch"] == 1, ready
    from pipeline.metrics.outputs import output_hash

    candidate = next(row for row in report["rows"] if row["role"] == "candidate")
    assert output_hash([a.json()["prediction"]["top_k"] for a in answers]) == \
        candidate["output_sha256"]
    # Triton: batching off, the batch of 1 in the dims
    repo = tmp_path / "triton"
    proc = run_cli("export-triton", ref, "--out", str(repo), r, module="pipeline.registry")
    assert proc.returncode == 0, proc.stderr
    # the artifact (pulled, re-hashed, into the model repository) keeps the batch it can run
    dims = onnx.load(str(next(repo.glob("*/1/model.onnx")))).graph.input[0].type.tensor_type
    assert [d.dim_value for d in dims.shape.dim] == [1, 3, 16, 16]
    text = next(repo.glob("*/config.pbtxt")).read_text()
    assert "max_batch_size: 0" in text and "dynamic_batching" not in text
    assert re.search(r'name: "image"\s+data_type: TYPE_FP32\s+dims: \[ 1, 3, 16, 16 \]', text)


def test_an_output_that_does_not_grow_at_batch_2_is_no_sign_of_folded_samples(files):
    """A graph of declared batch 1 that runs at batch 2, beside its logits a constant output
    (a detector's anchors): the logits follow the batch, the anchors stay as they are; the batch
    is made dynamic, as before, not run a sample at a time."""
    import numpy as np
    from onnx import helper, numpy_helper

    from benchmarks.byo import _task

    model = onnx.load(str(files / "cnn.onnx"))
    g = model.graph
    for v in (g.input[0], g.output[0]):
        v.type.tensor_type.shape.dim[0].dim_value = 1  # replaces the symbolic batch
    g.initializer.append(numpy_helper.from_array(np.ones((4, 2), np.float32), "anchor_values"))
    g.node.append(helper.make_node("Identity", ["anchor_values"], ["anchors"]))
    g.output.append(helper.make_tensor_value_info("anchors", onnx.TensorProto.FLOAT, [4, 2]))
    onnx.save(model, str(files / "anchors.onnx"))
    _, t = _task([*ARGS, f"model.path={files / 'anchors.onnx'}", f"data.path={files / 'data'}",
                  f"data_dir={files / 'dd-anchors'}"])
    assert t.max_batch is None and t.fixed_batch == ("image",)
    assert any("declares the batch axis dynamic" in w for w in t.warnings), t.warnings
