"""What the quantization sections of ``make bench`` share: onnxruntime's default INT8 as the peer,
a model scored like the pipeline scores it, and models timed against FP32 in one process.

In: ONNX model paths and the run's ``Config``. Out: a default ``quantize_static`` model, the
task metrics of a model, and paired speedups with their 95 % intervals. Used by ``quant.py``
(``model=ocr``) and ``own.py`` (``model=ocr_mobile``).
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace


def default_quantize(fp32_model: Path, out: Path, task_name: str, samples: int, data_dir: str) -> None:
    from onnxruntime.quantization import quantize_static

    from pipeline.models import module
    from pipeline.quant.calibration import Feeds

    t = module(task_name)
    ds, _ = t.dataset("calibration", samples, data_dir)
    feeds = Feeds({t.INPUT_NAME: x} for _, x, _ in t.batches(ds, 32, sort_by_width=False))
    quantize_static(str(fp32_model), str(out), feeds)  # every option at its default


def timed(models: dict, cfg, batch: int, extra_pairs=()) -> dict:
    """Every model against FP32 (and each (slower, faster) pair of ``extra_pairs``), timed in one
    process, interleaved round by round; speedups are medians of per-round ratios with CIs."""
    from pipeline.runtimes import onnxruntime as ort
    from pipeline.measure import timing
    from pipeline.models import module

    hw = cfg.hardware.target()
    t = module(cfg.model.source)
    ds, _ = t.dataset("evaluation", cfg.model.eval_samples, cfg.data_dir)
    inputs = [next(t.batches(ds.select(range(k * batch, (k + 1) * batch)), batch))[1] for k in range(8)]
    fns = {role: (lambda x, s=ort.session(path, hw): ort.run(s, x)) for role, path in models.items()}
    pairs = [("fp32", r) for r in models if r != "fp32"] + list(extra_pairs)
    times, info = timing.head_to_head(fns, inputs, pairs, 300, 60, 0.02)
    out = {"speedup_vs_fp32": {r: timing.ratio_ci(times["fp32"], times[r]) for r in models if r != "fp32"},
           "p50_ms": {r: float(sorted(v)[len(v) // 2]) for r, v in times.items()}, **info}
    if extra_pairs:
        out["speedup"] = {f"{b} vs {a}": timing.ratio_ci(times[a], times[b]) for a, b in extra_pairs}
    return out


def evaluate(model: Path, cfg) -> dict:
    from pipeline.stages.evaluate import Evaluate

    from pipeline.models import task

    m = cfg.model
    split = task(m.name).split("evaluation", m.eval_samples, cfg.data_dir)
    with tempfile.TemporaryDirectory() as out:
        return Evaluate(data=split, batch_size=m.eval_batch_size,
                        hardware=cfg.hardware.target()).run(SimpleNamespace(model=model),
                                                            Path(out))["metrics"]


def width_buckets(widths, n: int) -> list:
    """Indices of the OCR evaluation lines split into ``n`` buckets of equal count by width: the
    input distribution the head-to-head timings of ``peers`` and ``pruning`` draw from."""
    import numpy as np

    order = np.argsort(widths, kind="stable")
    return [b for b in np.array_split(order, n) if b.size]


def cli(args: list[str], timeout: float | None = None) -> tuple[int, float, dict]:
    """Run ``python -m pipeline`` with ``args``: (exit code, seconds, the report it wrote).
    ``timeout``: seconds after which the run and its stage processes (one process group) are
    stopped; it then reads exit code 124 and no report. A run that wrote no report of its own
    (refused before any stage) reads no report, never the previous run's."""
    import os
    import signal

    latest = Path("artifacts") / "runs" / "latest"
    # A refused run (a bad config: exit 2) writes no run folder and leaves "latest" on the run
    # before: that run's report is not this one's.
    before = latest.resolve() if latest.exists() else None
    t0 = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "pipeline", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        stdout, stderr = proc.communicate()
        sys.stdout.write(stdout)
        sys.stderr.write(stderr)
        return 124, time.time() - t0, {}
    seconds = time.time() - t0
    sys.stdout.write(stdout)
    sys.stderr.write(stderr)
    fresh = latest.exists() and latest.resolve() != before and (latest / "report.json").exists()
    return proc.returncode, seconds, json.loads((latest / "report.json").read_text()) if fresh else {}
