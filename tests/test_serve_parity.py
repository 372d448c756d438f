"""Parity through HTTP: the server's answers on the evaluation split are the run's own outputs.

A run of the trained OCR model (``model=ocr``, 64 evaluation lines) whose evaluation read each line
alone (``model.eval_batch_size=1``): in a batch the evaluation pads every line to the widest one,
and a bidirectional LSTM reads those padded columns, so only an evaluation of single lines is what
a server answering single requests must reproduce. Each line is encoded as PNG (lossless), posted
as raw bytes, decoded and preprocessed by the server's workers and batched with other lines of its
width; the decoded strings, in the split's order, must hash to the run's output-hash ledger, in
both the pipeline and the inline mode. The trained model reads these lines (its accuracy is in the
report), so a wrong resize, colour or normalization would change the strings: the tiny random
model reads every line as the same string and could not tell.
"""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.conftest import run_cli
from tests.serve_helpers import png, start

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("ocr")
    proc = run_cli("model=ocr", "quant=int8", "model.eval_samples=64",
                   "model.calibration_samples=32", "model.eval_batch_size=1",
                   "model.parity_samples=8", "quant.ranking_samples=16",
                   "quant.latency_aware=false", f"workdir={workdir}",
                   f"data_dir={workdir / 'data'}", "registry=null",
                   "bench.batch_sizes=[1]", "gate.speedup_batch_size=1", "bench.min_rounds=20",
                   "bench.min_seconds=0", "bench.max_seconds=0.3", "bench.warmup_max_runs=20",
                   "bench.size_buckets=2", "bench.cold_start_repeats=0", "bench.aa_tolerance=0.5",
                   "gate.min_speedup=0", "gate.check_slo_p99=false",
                   "gate.require_aa_check=false")  # timing verdicts off: tests/conftest.py
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return workdir


@pytest.mark.parametrize("mode", ["pipeline", "inline"])
def test_server_outputs_equal_the_runs_output_hash_ledger(real_run, tmp_path, mode):
    from pipeline.metrics.outputs import output_hash
    from pipeline.models.ocr import data as ocr_data
    from pipeline.models.ocr.crnn import dataset

    report = json.loads((real_run / "runs" / "latest" / "report.json").read_text())
    candidate = next(r for r in report["rows"] if r["role"] == "candidate")
    assert candidate["sequence_accuracy"] > 90, candidate  # it reads the lines
    ds, _ = dataset("evaluation", 64, real_run / "data")
    bodies = [png(ocr_data.to_array(row)) for row in ds]
    running = start(str(real_run / "runs" / "latest"), tmp_path, "--mode", mode,
                    "--max-batch", "8", "--max-wait-ms", "5")
    try:
        def ask(body: bytes) -> dict:
            r = requests.post(f"{running.url}/predict", data=body,
                              headers={"Content-Type": "image/png"}, timeout=120)
            assert r.status_code == 200, r.text
            return r.json()

        with ThreadPoolExecutor(8) as pool:  # concurrent, so the batcher forms batches
            answers = list(pool.map(ask, bodies))
    finally:
        assert running.stop() == 0, running.log.read_text()
    predictions = [a["prediction"] for a in answers]
    wrong = [(k, p, t) for k, (p, t) in enumerate(zip(predictions, ds["text"])) if p != t]
    assert output_hash(predictions) == candidate["output_sha256"], wrong[:5]
