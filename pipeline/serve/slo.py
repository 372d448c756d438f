"""``slo.mode=serve``: the candidate behind the real server at the end of a run, its p99 judged from
raw bytes.

In: the run's ``Config`` and the recipe's ``Outcome`` (the candidate artifact, the deployed
runtime, the task and its evaluation split). Out: the verdict amended in place: a check
``served_p99_ms`` (the p99 a client measured, against ``slo.p99_ms``) and ``verdict["served"]``
(the rate offered, p50/p99/p999, errors, whether the step reached steady state, the time per
server stage, the server's settings), which the report carries beside the model-only numbers.

How: the candidate's files are linked into a temporary folder laid out as a pull is (model,
``manifest.json`` with the run's config, serving spec and deployed runtime, and the tokenizer files
a text model reads), ``python -m pipeline.serve`` serves it on 127.0.0.1 (a port of its own) in a
child process, and the load generator (``load``) offers ``slo.serve_qps`` open-loop for
``slo.serve_seconds`` from the evaluation split's samples as a client sends them (PNG for a
recognizer, UTF-8 for a text model). The check passes when that p99 meets the target and at most
1 % of requests failed; a server that does not start, or a step with no answered request, fails
closed. Steady state is reported, not required: at a fixed rate below capacity a shared host's
noise unsettles the windows' medians long before the p99 misses. Not handled: decoders (the
server does not generate yet) and the user's own models with an image input beside others (no
reader).
"""
from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pipeline.core.errors import ConfigError

START_TIMEOUT_S = 300.0
MAX_ERROR_SHARE = 0.01


def preflight(t) -> None:
    """Before any stage: a task the server cannot read is one line, not a failed gate later."""
    if not hasattr(t, "serving_spec"):
        raise ConfigError("slo.mode=serve: the server reads the built-in OCR tasks, Hugging "
                          "Face encoders and the user's own models of one image input or of "
                          "arrays; this model has no reader (use slo.mode=model)")
    if getattr(t, "not_served", None):
        raise ConfigError(f"slo.mode=serve: {t.not_served} (use slo.mode=model)")


def request_bodies(t, ds, count: int = 64) -> list[bytes]:
    """Up to ``count`` evaluation samples as a client sends them: a line as PNG, a sentence as
    UTF-8, the user's own image file as it is (PNG or JPEG; another format as PNG), a model of
    array inputs' sample as JSON (an image file among its inputs in base64)."""
    n = min(count, len(ds))
    from pipeline.task.serving import ArrayInputs, ImageInput

    spec = t.serving_spec()
    if isinstance(spec, ImageInput):
        return _image_files(t, ds, n, t.column_of(spec.input))
    if isinstance(spec, ArrayInputs):  # each sample's arrays, as the JSON body the server reads
        return _array_bodies(t, ds, n, spec)
    if hasattr(t, "from_image"):  # the built-in recognizers: their lines as images
        from PIL import Image

        from pipeline.models.ocr import data as ocr_data

        out = []
        for k in range(n):
            buf = io.BytesIO()
            Image.fromarray(ocr_data.to_array(ds[k])).save(buf, format="PNG")
            out.append(buf.getvalue())
        return out
    from pipeline.models.hf_folder import PAIR_TEXT

    column = PAIR_TEXT if PAIR_TEXT in ds.column_names else t.data_cfg.input_column
    return [str(x).encode() for x in ds[column][:n]]


def _array_bodies(t, ds, n: int, spec) -> list[bytes]:
    """The first ``n`` samples as a client sends them: numpy's ``.npz`` of each input's array
    by name (what a client holding arrays sends: JSON numbers cost the server tens of
    milliseconds a request to parse); with an input read from an image file, JSON, the file's
    bytes in base64 (``{"b64": ...}``) and the other arrays' values."""
    import base64

    part = spec.image_input
    files = _image_files(t, ds, n, t.column_of(part.name)) if part is not None else None
    if part is None:
        import numpy as np

        out = []
        for sample in t._arrays(ds, list(range(n))):
            buf = io.BytesIO()
            np.savez(buf, **sample)
            out.append(buf.getvalue())
        return out
    out = []
    for k, sample in enumerate(t._arrays(ds, list(range(n)))):
        inputs = {name: a.tolist() for name, a in sample.items()
                  if part is None or name != part.name}
        if part is not None:
            inputs[part.name] = {"b64": base64.b64encode(files[k]).decode()}
        out.append(json.dumps({"inputs": inputs}).encode())
    return out


def _image_files(t, ds, n: int, column: str) -> list[bytes]:
    """The first ``n`` images of the user's data set's ``column``, each file's own bytes."""
    from pipeline.data.images import open_checked
    from pipeline.models.user_task import _undecoded
    from pipeline.serve.inputs import MAGIC

    raw = _undecoded(ds.select(range(n)))[column]
    out = []
    for r in raw:
        body = r.get("bytes") or Path(r["path"]).read_bytes()
        if not any(body.startswith(m) for m in MAGIC.values()):  # a BMP, WebP, ...: as PNG
            buf = io.BytesIO()
            open_checked(body, name=r.get("path")).save(buf, format="PNG")
            body = buf.getvalue()
        out.append(body)
    return out


def served_folder(cfg, out, dest: Path) -> Path:
    """The candidate laid out as a pulled folder: its files linked, not copied."""
    from pipeline.core.artifact import plain
    from pipeline.core.json_record import to_json

    t = out.run.task
    dest.mkdir(parents=True)
    cand = out.models["candidate"]
    for f in Path(cand.path).iterdir():  # the model and any external data file beside it
        if f.is_file() and f.name != "artifact.json":
            os.symlink(f.resolve(), dest / f.name)
    for name, path in (t.serving_files().items() if hasattr(t, "serving_files") else ()):
        os.symlink(Path(path).resolve(), dest / name)
    (dest / "manifest.json").write_text(json.dumps({
        "config": plain(cfg), "serving": to_json(t.serving_spec()), "metrics": {},
        "runtime": {"deployed": to_json(out.runtimes.deployed) if out.runtimes else {}}}))
    return dest


def judge(cfg, out) -> dict:
    """Serve the candidate, load it, and add the served p99 check to ``out.verdict``."""
    from pipeline.models.sources import Splits
    from pipeline.serve import load

    slo = cfg.slo
    t = out.run.task
    result: dict = {"qps": slo.serve_qps, "seconds": slo.serve_seconds}
    tmp = Path(tempfile.mkdtemp(prefix="pipeline-slo-serve-"))
    proc = None
    try:
        bodies = request_bodies(t, t.dataset(Splits(t, cfg).evaluation))
        folder = served_folder(cfg, out, tmp / "served")
        ready, log = tmp / "ready", tmp / "server.log"
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
        with open(log, "w") as sink:
            proc = subprocess.Popen([sys.executable, "-m", "pipeline.serve", str(folder),
                                     "--host", "127.0.0.1", "--port", "0", "--ready-file",
                                     str(ready)], stdout=sink, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ready.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                lines = log.read_text().strip().splitlines()
                raise RuntimeError(f"the server did not start (exit {proc.poll()}): "
                                   f"{lines[-1] if lines else 'no output'}")
            time.sleep(0.1)
        url = f"http://127.0.0.1:{ready.read_text()}"
        print(f"slo.mode=serve: {slo.serve_qps:g} requests/s for {slo.serve_seconds:g} s "
              f"from raw bytes, {url}", flush=True)
        report = load.run(url, bodies, load.LoadConfig(slo_p99_ms=slo.p99_ms,
                                                       step_seconds=slo.serve_seconds),
                          rates=[slo.serve_qps])
        step = report.steps[0]
        result.update(p50_ms=step.p50_ms, p99_ms=step.p99_ms, p999_ms=step.p999_ms,
                      sent=step.sent, ok=step.ok, errors=step.errors, steady=step.steady,
                      stage_ms=step.stage_ms, network_ms=step.network_ms,
                      server=requests_settings(url))
    except Exception as e:  # noqa: BLE001 - measuring failed: the check fails closed, with why
        result["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    finally:
        if proc is not None:
            result["server_exit"] = _stop(proc)
        shutil.rmtree(tmp, ignore_errors=True)
    _amend(out.verdict, result, slo.p99_ms)
    return result


def requests_settings(url: str) -> dict:
    """The served settings as the server reports them (/readyz: mode, workers, threads)."""
    import requests

    body = requests.get(f"{url}/readyz", timeout=30).json()
    return {k: body.get(k) for k in ("mode", "workers", "intra_op_threads")}


def _stop(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def _amend(verdict, result: dict, target: float) -> None:
    """The served p99 joins ``verdict`` (a ``gate.verdict.Verdict``) as one more check."""
    import math

    from pipeline.gate.verdict import Check

    p99 = result.get("p99_ms", float("nan"))
    failed = sum((result.get("errors") or {}).values())
    share = failed / max(result.get("sent") or 0, 1)
    ok = (result.get("ok") or 0) > 0 and math.isfinite(p99)
    passed = ok and p99 <= target and share <= MAX_ERROR_SHARE
    if "error" in result:
        detail = f"served_p99_ms: measuring failed ({result['error']}) (fails closed)"
    elif not ok:
        detail = "served_p99_ms: no request was answered (fails closed)"
    else:
        detail = (f"served p99 {p99:.2f} ms from raw bytes at {result['qps']:g} requests/s, "
                  f"{failed} of {result['sent']} failed"
                  + ("" if result.get("steady") else " (not steady)"))
    for key in ("p50_ms", "p99_ms", "p999_ms", "network_ms"):  # JSON has no NaN
        if key in result and not math.isfinite(result[key]):
            result[key] = None
    verdict.checks.append(Check("served_p99_ms", p99 if ok else None, target, bool(passed),
                                detail))
    verdict.served = result
