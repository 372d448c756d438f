"""A Hugging Face encoder served from text: the tokenizer travels with the published model, and
the server's answers through HTTP are the run's own outputs.

The tiny BERT folder (``tests/hf_tiny.py``: random weights, a WordPiece tokenizer trained in the
test) is compiled with dynamic INT8 and published to a local registry; the server pulls the
version (the model, its tokenizer files and ``config.json``, every blob re-hashed), tokenizes each
evaluation sentence with the evaluation's own ``encode`` and answers the embedding. The vectors,
in the split's order, must hash to the candidate's output-hash ledger. The run evaluates one
sentence at a time (``model.eval_batch_size=1``) and the server runs batches of one
(``--max-batch 1``), on as many threads side by side as it has cores: dynamic INT8 computes
each activation's scale over the whole batch, so a vector computed beside other sentences differs
in its last digits from the one computed alone.
"""
from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.conftest import run_cli, run_folder
from tests.serve_helpers import start

pytestmark = pytest.mark.slow

DATA = ["data=jsonl", "data.input_column=text", "data.calibration_samples=24",
        "data.evaluation_samples=24"]
FAST = ["bench.min_rounds=20", "bench.min_seconds=0", "bench.max_seconds=1",
        "bench.warmup_max_runs=20", "bench.size_buckets=2", "bench.cold_start_repeats=0",
        "bench.aa_tolerance=0.5", "gate.min_speedup=0", "gate.check_slo_p99=false",
        "gate.require_aa_check=false",  # timing verdicts off: tests/conftest.py tiny_args
        "quant.profile_runs=3", "quant.ranking_samples=20", "quant.region_trials=0"]


@pytest.fixture(scope="module")
def text_run(tmp_path_factory):
    """(root, report, published ref) of the tiny encoder's run, published to a local registry."""
    from tests import hf_tiny

    root = tmp_path_factory.mktemp("hf_serve")
    hf_tiny.bert(root / "embed")
    hf_tiny.text_data(root / "text.jsonl", 60)
    proc = run_cli("model=hf", f"model.path={root / 'embed'}", *DATA,
                   f"data.path={root / 'text.jsonl'}", "metric=agreement", "quant=dynamic",
                   "model.eval_batch_size=1", "gate.max_accuracy_drop=0.5",
                   f"workdir={root / 'work'}", f"data_dir={root / 'data'}",
                   f"registry.root={root / 'registry'}", *FAST)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((run_folder(proc) / "report.json").read_text())
    report["_folder"] = str(run_folder(proc))
    return root, report, report["published"].split("@")[0]


def _evaluation_texts(root, report) -> list[str]:
    """The evaluation split's sentences in the order the run evaluated them."""
    from pipeline.config import ModelConfig
    from pipeline.config.data import DataConfig
    from pipeline.config.metrics import MetricConfig
    from pipeline.models import task
    from pipeline.models.sources import task_key

    cfg = report["config"]
    key = task_key(ModelConfig(name="hf", path=cfg["model"]["path"], params={}),
                   DataConfig(format="jsonl", path=cfg["data"]["path"], input_column="text",
                              calibration_samples=24, evaluation_samples=24),
                   MetricConfig(name="agreement"), data_dir=str(root / "data"))
    t = task(key)
    ds = t.dataset(t.split("evaluation", 24, str(root / "data")))
    return [str(x) for x in ds["text"]]


def test_the_published_version_carries_the_tokenizer(text_run):
    root, report, ref = text_run
    spec = report["serving"]
    assert spec["reader"] == "text" and spec["task"] == "feature-extraction"
    assert spec["input_names"] == ["input_ids", "attention_mask", "token_type_ids"]
    assert {"tokenizer.json", "config.json"} <= set(spec["files"])
    assert report["publish"]["status"] == "published", report["publish"]


def test_server_embeddings_equal_the_runs_output_hash_ledger(text_run, tmp_path):
    from pipeline.metrics.outputs import output_hash

    root, report, ref = text_run
    candidate = next(r for r in report["rows"] if r["role"] == "candidate")
    texts = _evaluation_texts(root, report)
    # the text model's own split: one worker, the model on every usable core, one intra-op
    # thread each; sentences sent four at a time, so the consumers run side by side
    running = start(ref, tmp_path, f"registry.root={root / 'registry'}", "--max-batch", "1")
    try:
        split = requests.get(f"{running.url}/readyz", timeout=60).json()
        assert (split["workers"], split["intra_op_threads"]) == (1, 1), split
        assert split["consumers"] == len(os.sched_getaffinity(0)), split

        def ask(k: int) -> list:
            # half as plain UTF-8, half as JSON: both are read the same way
            r = (requests.post(f"{running.url}/predict", data=texts[k].encode(),
                               headers={"Content-Type": "text/plain; charset=utf-8"}, timeout=60)
                 if k % 2 else
                 requests.post(f"{running.url}/predict", json={"text": texts[k]}, timeout=60))
            assert r.status_code == 200, r.text
            return r.json()["prediction"]

        with ThreadPoolExecutor(4) as pool:
            vectors = list(pool.map(ask, range(len(texts))))
        bad = [requests.post(f"{running.url}/predict", data=body, headers={"Content-Type": ct},
                             timeout=60) for body, ct in
               ((b"caf\xe9", "text/plain"), (b'{"txt": 1}', "application/json"),
                (b"\x89PNG\r\n\x1a\n", "image/png"), (b"   ", "text/plain"))]
    finally:
        assert running.stop() == 0, running.log.read_text()
    assert len(vectors[0]) == 32 and all(isinstance(v, float) for v in vectors[0])
    ledger = [{"decision": None, "output": v} for v in vectors]
    assert output_hash(ledger) == candidate["output_sha256"]
    assert [b.status_code for b in bad] == [400, 400, 415, 400], [b.text for b in bad]
    assert "UTF-8" in bad[0].json()["error"] and '"text"' in bad[1].json()["error"]


def test_a_changed_tokenizer_is_refused(text_run, tmp_path):
    """Served from the run's folder, the tokenizer is read from model.path: edited since the
    evaluation, it is refused in one line (exit 3) rather than served with other token ids."""
    import shutil
    import subprocess
    import sys

    from tests.conftest import ROOT

    root, report, _ = text_run
    folder = tmp_path / "run"
    shutil.copytree(report["_folder"], folder)
    moved = tmp_path / "embed"
    shutil.copytree(root / "embed", moved)
    body = json.loads((folder / "report.json").read_text())
    body["config"]["model"]["path"] = str(moved)
    (folder / "report.json").write_text(json.dumps(body))
    with open(moved / "tokenizer.json", "a") as f:
        f.write(" ")
    proc = subprocess.run([sys.executable, "-m", "pipeline.serve", str(folder), "--port", "0"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "tokenizer.json changed since the evaluation" in proc.stderr, proc.stderr
