"""zoo entry ``rapidocr``: PaddleOCR's PP-OCRv4 text recognizer as RapidOCR ships it
(``rapidocr-onnxruntime==1.4.4``, ``models/ch_PP-OCRv4_rec_infer.onnx``), made by others, run
through the documented command line (``model=onnx metric=ctc`` with the PaddleOCR settings of
docs/byo.md) as a user would, then served from raw bytes.

In: the package, fetched at bench time (``benchmarks.zoo.fetch``), and the packages its own
inference code imports (OpenCV, pyclipper, shapely), each fetched the same way into a folder of
its own under ``artifacts/zoo/``; those are only ever imported by a child process that has them
on its ``PYTHONPATH`` (``python -m benchmarks.zoo.rapidocr``), never by the pipeline or by
this process. Data: text lines rendered here with the machine's fonts (``/usr/share/fonts``;
Debian's ``fonts-dejavu-core`` is enough): English words, numbers, prices, dates and codes in
dark ink on light paper, written as docs/byo.md describes (a folder of PNGs and ``labels.jsonl``).
No character set file: the pipeline reads the model's ``character`` metadata and appends the
space RapidOCR's decoder appends (``pipeline.metrics.ctc``).

Out: FP32 parity (the share of evaluation lines on which the run's FP32 row, read from its
evaluate stage's predictions, decodes the same string as RapidOCR's ``TextRecognizer`` called
with one line at a time; also against the recognizer as shipped, batches of 6 sorted by aspect,
shown, not a target); per quant mode (``int8``, ``auto``, default gate settings) the verdict,
sequence accuracy and CER of FP32 / FP16 / candidate and the candidate's speedups with CIs from
the run's report; and, after the first passing run, that run folder served by the real server
(``python -m pipeline.serve``): every evaluation line's PNG file posted as it is to
``/predict``, the answers compared with the candidate's predictions one by one and, as a list,
with the candidate's ``output_sha256``, with the server's and the client's p50/p99.
"""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

REQUIREMENT = "rapidocr-onnxruntime==1.4.4"
MODEL = Path("rapidocr_onnxruntime") / "models" / "ch_PP-OCRv4_rec_infer.onnx"
# What RapidOCR's own code imports (its recognizer calls cv2.resize; the package's __init__
# imports the detector's pyclipper and shapely too), pinned as the probe of this model found them
REFERENCE_DEPS = ("opencv-python-headless==5.1.0.95", "pyclipper==1.4.0", "shapely==2.2.0")
CALIBRATION, EVALUATION = 100, 200
QUICK = (32, 64)
QUANTS = ("int8", "auto")
# What TextRecognizer.resize_norm_img does: height 48, the width ceil(48 * w / h), cv2's
# bilinear resize of the BGR image, (x / 255 - 0.5) / 0.5, zeros padded on the right to at
# least 320 pixels (rec_img_shape [3, 48, 320]). One line per call, as the parity is read.
DATA_ARGS = ["data=labels_file", "data.image.resize=height", "data.image.height=48",
             "data.image.width_rounding=ceil", "data.image.min_width=320",
             "data.image.mean=[0.5,0.5,0.5]", "data.image.std=[0.5,0.5,0.5]",
             "data.image.channel_order=bgr", "data.image.pad=constant", "data.image.pad_value=0",
             "data.image.pad_units=normalized", "metric=ctc", "model.eval_batch_size=1"]
ROOT = Path("artifacts") / "bench-zoo" / "rapidocr"
AUTO_TIMEOUT_S = 1800  # quant=auto took about 10 minutes on 2 cores; past this, recorded
FONT_NAMES = ("DejaVuSans.ttf", "DejaVuSans-Bold.ttf", "DejaVuSerif.ttf", "DejaVuSansMono.ttf")
WORDS = """time year people way day man thing woman life child world school state family student
group country problem hand part place case week company system program question work number
night point home water room mother area money story fact month right study book eye job word
business issue side kind head house service friend father power hour game line end member law
car city name president team minute idea body information back parent face level office door
health person art war history party result change morning reason research girl moment air
teacher force education foot age policy music market sense nation plan college interest death
experience effect class control care field development role effort rate heart show leader light
voice police mind price report decision son view town road value building action model season
society tax director position player record paper space ground form event matter center couple
site project activity star table need court oil situation cost industry figure street image
phone data picture practice piece land product doctor wall patient worker news test movie north
love support technology step baby computer type attention film tree source window evidence
population truth song network""".split()
CODE_LETTERS = "ABCDEFGHKLMNPRSTUVWXYZ"
SERVE_TIMEOUT_S = 300


def _label(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.35:  # one word, some capitalized
        w = rng.choice(WORDS)
        return w.capitalize() if rng.random() < 0.4 else w
    if kind < 0.55:  # a number, a price, a date or a code
        f = rng.randrange(4)
        if f == 0:
            return str(rng.randrange(10, 10 ** rng.randint(3, 8)))
        if f == 1:
            return f"{rng.randrange(1, 999)}.{rng.randrange(100):02d}"
        if f == 2:
            return (f"{rng.randrange(2000, 2030)}-{rng.randrange(1, 13):02d}-"
                    f"{rng.randrange(1, 29):02d}")
        return f"{rng.choice(CODE_LETTERS)}{rng.choice(CODE_LETTERS)}{rng.randrange(1000, 9999)}"
    return " ".join(rng.choice(WORDS) for _ in range(2 if kind < 0.8 else 3))


def write_lines(folder: Path, count: int, seed: int = 1234) -> Path:
    """``count`` text lines (``_label``) in the machine's DejaVu fonts, 32-64 px high, dark ink
    on light paper; returns ``labels.jsonl``."""
    from PIL import Image, ImageDraw, ImageFont

    from benchmarks.zoo import truetype_fonts

    fonts = truetype_fonts(FONT_NAMES)
    labels, stamp = folder / "labels.jsonl", folder / ".complete"
    if stamp.exists() and stamp.read_text() == f"{count} {seed}\n":
        return labels
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    rows = []
    for k in range(count):
        text, height = _label(rng), rng.randint(32, 64)
        font = ImageFont.truetype(str(rng.choice(fonts)), int(height * rng.uniform(0.55, 0.7)))
        left, top, right, bottom = font.getbbox(text)
        margin = rng.randint(1, 4)
        img = Image.new("RGB", (right - left + 2 * margin, height),
                        tuple(rng.randint(215, 255) for _ in range(3)))
        y = (height - (bottom - top)) // 2 - top + rng.randint(-2, 2)
        ImageDraw.Draw(img).text((margin - left, y), text, font=font,
                                 fill=tuple(rng.randint(0, 60) for _ in range(3)))
        img.save(folder / f"{k:04d}.png")
        rows.append({"file": f"{k:04d}.png", "label": text})
    labels.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows),
                      encoding="utf-8")
    stamp.write_text(f"{count} {seed}\n")
    return labels


def _reference_child(package: Path, folder: Path, labels: Path, out: Path) -> None:
    """Runs in the child (``python -m benchmarks.zoo.rapidocr``): RapidOCR's own
    ``TextRecognizer``, configured by its own ``config.yaml``, on every line in the labels
    file's order, one line per call and as shipped (all lines in one call: sorted by aspect,
    batches of ``rec_batch_num``)."""
    from rapidocr_onnxruntime.ch_ppocr_rec.text_recognize import TextRecognizer
    from rapidocr_onnxruntime.utils import LoadImage, read_yaml

    pkg = package / "rapidocr_onnxruntime"
    cfg = read_yaml(pkg / "config.yaml")["Rec"]
    cfg["model_path"] = str(pkg / cfg["model_path"])
    rec, load = TextRecognizer(cfg), LoadImage()
    rows = [json.loads(x) for x in labels.read_text(encoding="utf-8").splitlines() if x.strip()]
    images = [load(str(folder / r["file"])) for r in rows]
    t0 = time.time()
    one = [rec([im])[0][0][0] for im in images]
    seconds = time.time() - t0
    shipped = [text for text, _ in rec(images)[0]]
    import cv2

    out.write_text(json.dumps({"one_line_per_call": one, "as_shipped": shipped,
                               "seconds_one_line_per_call": round(seconds, 1),
                               "model_file": cfg["model_path"],
                               "rec_batch_num": cfg["rec_batch_num"],
                               "rec_img_shape": cfg["rec_img_shape"],
                               "opencv": cv2.__version__}, ensure_ascii=False),
                   encoding="utf-8")


def reference(package: Path, deps: list[Path], folder: Path, labels: Path) -> dict:
    """RapidOCR's own reading of every line, in a child process whose ``PYTHONPATH`` holds the
    package and the folders of its dependencies."""
    out = ROOT / "reference.json"
    out.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        str(p.resolve()) for p in (package, *deps, Path.cwd()))}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.zoo.rapidocr", str(package),
                           str(folder), str(labels), str(out)], env=env, capture_output=True,
                          text=True, timeout=1800)
    if proc.returncode != 0 or not out.exists():
        raise RuntimeError(f"RapidOCR's own recognizer failed (exit {proc.returncode}): "
                           f"{proc.stderr.strip()[-2000:]}")
    return json.loads(out.read_text(encoding="utf-8"))


def evaluation_order(args: list[str]) -> dict:
    """The evaluation split as the run reads it: its rows of the labels file, in order, and each
    line's file as a client sends it (``pipeline.serve.slo.request_bodies``)."""
    from benchmarks.byo import _task
    from pipeline.serve.slo import request_bodies

    cfg, t = _task(args)
    split = t.split("evaluation", cfg.data.evaluation_samples, cfg.data_dir)
    return {"rows": list(t.data().evaluation[:split.count]),
            "bodies": request_bodies(t, t.dataset(split), split.count)}


def stage_predictions(report: dict, label: str, sha256: str | None = None) -> dict | None:
    """The predictions a run's evaluate stage wrote: the stage labelled ``label``, or else the
    first whose predictions hash to ``sha256``, those whose label starts with ``label[:-1]``
    first (a candidate evaluated on another runtime, ``evaluate[candidate @ openvino bf16]``;
    quant=auto's winner may be a float model, ``evaluate[fp32 @ openvino bf16]``)."""
    from pipeline.metrics.outputs import output_hash

    stages = [s for s in report.get("stages", []) if s.get("stage") == "evaluate"]
    exact = [s for s in stages if s.get("label") == label]
    near = [s for s in stages if s.get("label", "").startswith(label[:-1])]
    # another runtime's evaluation (``@``) first: auto's winner is one; then any same hash
    rest = sorted((s for s in stages if s not in near),
                  key=lambda s: " @ " not in s.get("label", "")) if sha256 else []
    for s in exact + near + rest:
        f = Path(s.get("path", "")) / "predictions.json"
        if not f.exists():
            continue
        preds = json.loads(f.read_text(encoding="utf-8"))
        if s in exact and sha256 is None or output_hash(preds) == sha256:
            return {"stage": s["label"], "predictions": preds}
    return None


def parity(preds: list[str], rows: list[int], ref: list[str]) -> dict:
    same = [p == ref[r] for p, r in zip(preds, rows)]
    differ = [{"row": r, "pipeline": p, "reference": ref[r]}
              for p, r, s in zip(preds, rows, same) if not s]
    return {"agree_percent": 100.0 * sum(same) / len(same), "lines": len(same),
            "differ": differ[:10]}


def _percentile(values: list[float], q: float) -> float | None:
    import numpy as np

    return float(np.percentile(values, q)) if values else None


def served(run_dir: Path, bodies: list[bytes], candidate: dict, expected: list[str] | None
           ) -> dict:
    """The run folder behind the real server; every body posted once, one at a time."""
    import tempfile

    import requests

    from pipeline.metrics.outputs import output_hash

    with tempfile.TemporaryDirectory() as tmp:
        ready, log = Path(tmp) / "ready", Path(tmp) / "server.log"
        env = {**os.environ, "PYTHONPATH": str(Path.cwd())}
        proc = subprocess.Popen([sys.executable, "-m", "pipeline.serve", str(run_dir), "--host",
                                 "127.0.0.1", "--port", "0", "--ready-file", str(ready)],
                                env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
        try:
            t0 = time.monotonic()
            while not ready.exists():
                if proc.poll() is not None or time.monotonic() - t0 > SERVE_TIMEOUT_S:
                    raise RuntimeError(f"the server did not start (exit {proc.poll()}): "
                                       f"{log.read_text()[-2000:]}")
                time.sleep(0.1)
            started_s = time.monotonic() - t0
            url = f"http://127.0.0.1:{ready.read_text().strip()}/predict"
            answers, server_ms, client_ms, errors = [], [], [], []
            for k, body in enumerate(bodies):
                c0 = time.perf_counter()
                r = requests.post(url, data=body, headers={"Content-Type": "image/png"},
                                  timeout=60)
                client_ms.append(1000 * (time.perf_counter() - c0))
                if r.status_code != 200:
                    errors.append({"line": k, "status": r.status_code, "body": r.text[:300]})
                    answers.append(None)
                    continue
                payload = r.json()
                answers.append(payload.get("prediction"))
                total = (payload.get("timing_ms") or {}).get("total")
                if isinstance(total, (int, float)):
                    server_ms.append(float(total))
        finally:
            if proc.poll() is None:
                proc.terminate()
            exit_code = proc.wait(60)
    out = {"run": str(run_dir), "lines": len(bodies), "errors": errors[:10],
           "error_count": len(errors), "server_start_s": round(started_s, 1),
           "server_exit_code": exit_code,
           "ledger_sha256": candidate.get("output_sha256"),
           "answers_sha256": output_hash([a if isinstance(a, str) else json.dumps(a)
                                          for a in answers]),
           "p50_ms_server_total": _percentile(server_ms, 50),
           "p99_ms_server_total": _percentile(server_ms, 99),
           "p50_ms_client": _percentile(client_ms, 50),
           "p99_ms_client": _percentile(client_ms, 99)}
    out["ledger_match"] = out["answers_sha256"] == out["ledger_sha256"]
    if expected is not None:
        out["agree_with_candidate"] = sum(a == e for a, e in zip(answers, expected))
        out["differ"] = [{"line": k, "served": a, "candidate": e}
                         for k, (a, e) in enumerate(zip(answers, expected)) if a != e][:10]
    return out


def _run(cli, args: list[str]) -> dict:
    """One documented command line: ``benchmarks.byo._run``'s record, the run folder, the
    candidate's speedups from the report and the report itself (dropped before the JSON)."""
    from benchmarks import byo

    latest = Path("artifacts") / "runs" / "latest"
    code, seconds, rep = cli(args, timeout=AUTO_TIMEOUT_S)
    if code == 124:
        return {"command": "python -m pipeline " + " ".join(args),
                "timed_out_after_s": AUTO_TIMEOUT_S, "exit_code": code}
    out = byo._run(lambda a: (code, seconds, rep), args)
    out["run"] = str(latest.resolve())
    rows = {r["role"]: r for r in rep["rows"]}
    out["speedup_vs_fastest_float"] = {
        b: {"median": v.get("speedup_vs_fastest_float"), "ci95": v.get("speedup_ci95")}
        for b, v in rows["candidate"].get("latency", {}).items()}
    out["output_sha256"] = {role: r.get("output_sha256") for role, r in rows.items()}
    out["_report"] = rep
    return out


def measure_runs(cli, common: list[str], ref: dict, order: dict) -> dict:
    """Both quant modes, then the FP32 parity from the first report and the serving of the
    first passing run."""
    from pipeline.metrics.outputs import output_hash

    out: dict = {"runs": {}}
    for q in QUANTS:
        try:
            out["runs"][q] = _run(cli, [*common, f"quant={q}"])
        except RuntimeError as e:
            out["runs"][q] = {"error": str(e)}
    reports = {q: r.pop("_report") for q, r in out["runs"].items() if "_report" in r}
    rows, texts = order["rows"], ref["one_line_per_call"]
    for q, rep in reports.items():
        fp32 = stage_predictions(rep, "evaluate[fp32]")
        if fp32 is None:
            continue
        out["parity"] = {"from": f"quant={q} run, {fp32['stage']}",
                         "one line per call": parity(fp32["predictions"], rows, texts),
                         "as shipped (batches of 6)": parity(fp32["predictions"], rows,
                                                             ref["as_shipped"])}
        out["parity"]["fp32 hash is the row's"] = (
            output_hash(fp32["predictions"]) == out["runs"][q]["output_sha256"].get("fp32"))
        break
    passing = [q for q, r in out["runs"].items() if r.get("exit_code") == 0 and q in reports]
    if passing:
        q = passing[0]
        sha = out["runs"][q]["output_sha256"].get("candidate")
        cand = stage_predictions(reports[q], "evaluate[candidate]", sha)
        try:
            out["served"] = {"quant": q, "predictions_from": cand and cand["stage"],
                             **served(Path(out["runs"][q]["run"]), order["bodies"],
                                      {"output_sha256": sha},
                                      cand["predictions"] if cand else None)}
        except Exception as e:  # noqa: BLE001 - recorded in the JSON
            out["served"] = {"quant": q, "error": f"{type(e).__name__}: {e}"}
    else:
        out["served"] = {"skipped": "no run passed its gate"}
    return out


def measure(cli, quick: bool = False) -> dict:
    from benchmarks.zoo.fetch import fetch
    from pipeline.core import isolate

    t0 = time.time()
    package = fetch(REQUIREMENT)
    deps = [fetch(req) for req in REFERENCE_DEPS]
    calibration, evaluation = QUICK if quick else (CALIBRATION, EVALUATION)
    ROOT.mkdir(parents=True, exist_ok=True)
    folder = ROOT / "lines"
    labels = write_lines(folder, calibration + evaluation)
    given = package / MODEL  # as the package ships it
    common = ["model=onnx", f"model.path={given}", *DATA_ARGS, f"data.path={folder}",
              f"data.labels={labels}", f"data.calibration_samples={calibration}",
              f"data.evaluation_samples={evaluation}", "registry=null",
              f"bench.nonce=zoo-{time.strftime('%Y%m%dT%H%M%S')}"]
    ref = reference(package, deps, folder, labels)
    order = isolate.call("zoo rapidocr: the evaluation split's rows and files",
                         evaluation_order, common)
    out: dict = {"requirement": REQUIREMENT, "reference_deps": list(REFERENCE_DEPS),
                 "file": str(given), "lines": calibration + evaluation,
                 "calibration": calibration, "evaluation": evaluation, "data_args": DATA_ARGS,
                 "reference": {k: v for k, v in ref.items()
                               if k not in ("one_line_per_call", "as_shipped")}}
    gold = [json.loads(x)["label"] for x in labels.read_text(encoding="utf-8").splitlines()]
    out["reference"]["sequence_accuracy_on_evaluation"] = 100.0 * sum(
        ref["one_line_per_call"][r] == gold[r] for r in order["rows"]) / len(order["rows"])
    out.update(measure_runs(cli, common, ref, order))
    out["seconds"] = round(time.time() - t0, 1)
    out["summary"] = [summary(out)]
    out["targets"] = targets(out)
    return out


def summary(out: dict) -> dict:
    """The results page's row (``benchmarks.zoo`` describes the keys)."""
    from benchmarks.zoo import run_rows

    runs, acc, verdict = run_rows(out["runs"], "sequence_accuracy")
    # from the run's report: against the fastest float model the gate timed (FP32 or FP16, on
    # any runtime it tried), so it goes to the table's "peers" column under that name
    speedup = {f"{q} vs fastest float b{b}": sp for q, r in runs.items()
               for b, sp in r.get("speedup_vs_fastest_float", {}).items() if sp.get("median")}
    par = (out.get("parity") or {}).get("one line per call") or {}
    return {"model": "RapidOCR PP-OCRv4 rec (ch_PP-OCRv4_rec_infer.onnx)",
            "metric": "sequence accuracy %", "parity_percent": par.get("agree_percent"),
            "verdict": verdict, "accuracy": acc, "speedup": speedup}


def targets(out: dict) -> dict:
    from benchmarks.zoo import ocr_run_targets

    t: dict = {}
    par = out.get("parity") or {}
    if not par:
        t["FP32 parity with RapidOCR's TextRecognizer: measured"] = ["no run's FP32 predictions",
                                                                    False]
    for label in ("one line per call", "as shipped (batches of 6)"):
        if label in par:
            p = par[label]["agree_percent"]
            one = label == "one line per call"
            t[f"FP32 parity with RapidOCR's TextRecognizer, {label} (% of lines)"
              + ("" if one else ", shown, not a target")] = [p, p >= 99.0 if one else None]
    t.update(ocr_run_targets(out["runs"]))
    for q, run in out["runs"].items():
        for b, sp in run.get("speedup_vs_fastest_float", {}).items():
            t[f"quant={q} batch {b}: candidate vs fastest float (speedup, CI)"] = [sp, None]
    s = out.get("served") or {}
    if "ledger_match" in s:
        n = s["lines"]
        t[f"served (quant={s['quant']}): PNG bytes posted, answers equal to the candidate's "
          f"predictions (of {n})"] = [s.get("agree_with_candidate"),
                                      s.get("agree_with_candidate") == n]
        t[f"served (quant={s['quant']}): answers hash to the candidate's output_sha256"] = [
            s["ledger_match"], s["ledger_match"]]
        t[f"served (quant={s['quant']}): p50 / p99 ms, server total, one request at a time"] = [
            [s["p50_ms_server_total"], s["p99_ms_server_total"]], None]
    else:
        t["served: measured"] = [s.get("error") or s.get("skipped"), False]
    return t


if __name__ == "__main__":  # the child of ``reference``: package folder, lines, labels, out
    _reference_child(*(Path(a) for a in sys.argv[1:5]))
