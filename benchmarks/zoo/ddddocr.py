"""zoo entry ``ddddocr``: the text recognizers of ``ddddocr==1.6.1``, made by others, run through
the documented command line (``model=onnx metric=ctc``, docs/byo.md) as a user would.

In: the package, fetched at bench time (``benchmarks.zoo.fetch``): ``common_old.onnx`` (what
``DdddOcr()`` loads; its convolutions and LSTM already dynamically quantized by its authors) and
``common.onnx`` (``DdddOcr(beta=True)``, float), each with its character set (index 0 is the CTC
blank), and its own inference code. Data: text lines rendered here with the machine's fonts
(``/usr/share/fonts``; Debian's ``fonts-dejavu-core`` is enough) from digits and lower-case
letters, all in both character sets, written as docs/byo.md describes (a folder of PNGs and
``labels.jsonl``).

Out, per model: FP32 parity (the share of evaluation lines on which the pipeline's FP32 model,
fed by the declarative preprocessing of ``DATA_ARGS``, decodes the same string as
``DdddOcr(...).classification(image)`` does one image at a time), in the evaluation's padded
batches and one line at a time: both recognizers end in a bidirectional LSTM that reads the
padding frames too, and ``common_old``'s in-graph dynamic quantization takes one scale over the
whole batch, so a line's reading can change with its batch-mates (the runs therefore evaluate
at ``model.eval_batch_size=1``, as the model is used); the gate verdict with
default settings, sequence accuracy and CER of FP32 / FP16 / candidate for ``quant=int8`` and
``quant=auto``; onnxruntime's default ``quantize_static`` of the same FP32 model on the same
calibration lines; speedups with CIs at batch 1 and 8, timed side by side in one process
(``benchmarks.byo.timed``).

The package's files are handed over unedited. Both declare a batch of exactly 1 and an output
``[1, seqlen]`` although the graph returns ``[time, batch, classes]``: the pipeline finds that out
by running the graph (docs/byo.md, "An ONNX file only"), says so in a warning line, and its import
stage declares the batch axis dynamic; the time-major layout is found the same way, so no
``metric.time_major`` is given. ``common_old`` is already quantized: ``quant=int8`` is refused
before any stage (exit 2, recorded) and ``quant=auto`` runs as ``quant=none``; onnxruntime's
``quantize_static`` is not applied to it. The reference code imports OpenCV, which its
text recognizer never calls (Pillow resizes, numpy does the rest): it runs in a child process
with a stand-in module that fails on any use, so OpenCV need not be installed.
"""
from __future__ import annotations

import json
import random
import time
from pathlib import Path

REQUIREMENT = "ddddocr==1.6.1"
# model -> (DdddOcr keyword, the CharsetManager method that holds its character set)
MODELS = {"common_old": ({"old": True}, "_get_old_charset"),
          "common": ({"beta": True}, "_get_beta_charset")}
CALIBRATION, EVALUATION = 64, 200
QUICK = (32, 64)
QUANTS = ("int8", "auto")
CHARS = "0123456789abcdefghijklmnopqrstuvwxyz"
# What ddddocr's own code does to an image (core/ocr_engine.py): height 64, the width scaled and
# truncated (int()), both with Pillow's LANCZOS, the colour image then converted to grey, /255.
DATA_ARGS = ["data=labels_file", "data.image.resize=height", "data.image.height=64",
             "data.image.color=grey", "data.image.convert=after_resize",
             "data.image.interpolation=lanczos", "data.image.width_rounding=floor"]
ROOT = Path("artifacts") / "bench-zoo" / "ddddocr"
AUTO_TIMEOUT_S = 1800  # quant=auto on a graph this size may search long; past it, recorded as such


def write_lines(folder: Path, count: int, seed: int = 0) -> Path:
    """``count`` text lines (4-8 characters of ``CHARS``) in the machine's TrueType fonts, black
    on white at sizes 24-40 px with random margins; returns ``labels.jsonl``."""
    from PIL import Image, ImageDraw, ImageFont

    from benchmarks.zoo import truetype_fonts

    fonts = truetype_fonts()
    labels = folder / "labels.jsonl"
    stamp = folder / ".complete"
    if stamp.exists() and stamp.read_text() == f"{count} {seed}\n":
        return labels
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    rows = []
    for k in range(count):
        text = "".join(rng.choice(CHARS) for _ in range(rng.randint(4, 8)))
        font = ImageFont.truetype(str(rng.choice(fonts)), rng.randint(24, 40))
        left, top, right, bottom = font.getbbox(text)
        m = rng.randint(4, 12)
        img = Image.new("RGB", (right - left + 2 * m, bottom - top + 2 * m), (255, 255, 255))
        ImageDraw.Draw(img).text((m - left, m - top), text, font=font, fill=(0, 0, 0))
        img.save(folder / f"{k}.png")
        rows.append({"file": f"{k}.png", "label": text})
    labels.write_text("".join(json.dumps(r) + "\n" for r in rows))
    stamp.write_text(f"{count} {seed}\n")
    return labels


def reference(package: Path, model: str, folder: Path, labels: Path) -> dict:
    """In a child process: the package's own ``DdddOcr(...).classification`` on every line, in
    the labels file's order, and the model's character set (blank first)."""
    import sys
    import types

    class NoOpenCV(types.ModuleType):
        def __getattr__(self, name):
            raise RuntimeError(f"cv2.{name}: the reference's text recognizer used OpenCV")

    sys.modules.setdefault("cv2", NoOpenCV("cv2"))
    sys.path.insert(0, str(package))
    import ddddocr
    from PIL import Image

    kwargs, charset_method = MODELS[model]
    ocr = ddddocr.DdddOcr(**kwargs)
    engine = ocr.ocr_engine
    expected = package / "ddddocr" / f"{model}.onnx"
    loaded = Path(engine.session._model_path) if hasattr(engine.session, "_model_path") else None
    rows = [json.loads(line) for line in labels.read_text().splitlines() if line.strip()]
    t0 = time.time()
    texts = [ocr.classification(Image.open(folder / r["file"])) for r in rows]
    return {"texts": texts, "seconds": round(time.time() - t0, 1),
            "charset": getattr(engine.charset_manager, charset_method)(),
            "engine_charset_matches": engine.charset_manager.get_charset()
            == getattr(engine.charset_manager, charset_method)(),
            "model_file": str(loaded or expected)}


def write_charset(charset: list[str], path: Path) -> dict:
    """The character set as docs/byo.md takes it: one character per line, class i+1 the i-th
    line (class 0 is the blank, ``charset[0] == ''``). An entry of several characters (the beta
    set holds ``''``) cannot be one line's character: it gets a stand-in character the set does
    not hold, and the stand-ins are returned (no generated label contains them)."""
    if charset[0] != "":
        raise RuntimeError(f"ddddocr's character set does not start with the blank: {charset[:3]}")
    taken = set(charset)
    spare = (chr(c) for c in range(0xE000, 0xF8FF) if chr(c) not in taken)  # private use area
    lines, standins = [], {}
    for c in charset[1:]:
        if len(c) != 1:
            standins[c] = next(spare)
            c = standins[c]
        lines.append(c)
    path.write_text("".join(c + "\n" for c in lines), encoding="utf-8")
    return standins


def pipeline_predictions(model: Path, args: list[str]) -> dict:
    """The pipeline's import and evaluate stages on ``model`` (the file as the package ships it):
    its decoded strings and the data-set rows they belong to (the evaluation split, in order)."""
    import tempfile
    from types import SimpleNamespace

    from benchmarks.byo import _task
    from pipeline.stages.evaluate import Evaluate
    from pipeline.stages.import_onnx import ImportOnnx

    cfg, t = _task(args)
    split = t.split("evaluation", cfg.data.evaluation_samples, cfg.data_dir)
    parity = t.split("evaluation", 8, cfg.data_dir)
    with tempfile.TemporaryDirectory() as out, tempfile.TemporaryDirectory() as imported:
        ImportOnnx(task=t.key, path=t.onnx_source, sha256=t.onnx_sha256, data=parity,
                   hardware=cfg.hardware.target()).run(None, Path(imported))
        model = Path(imported) / "model.onnx"
        res = Evaluate(data=split, batch_size=cfg.model.eval_batch_size,
                       hardware=cfg.hardware.target()).run(SimpleNamespace(model=model), Path(out))
        preds = json.loads((Path(out) / "predictions.json").read_text())
    return {"predictions": preds, "rows": t.data().evaluation[:split.count],
            "metrics": res["metrics"]}


def parity(mine: dict, ref: list[str], standins: dict) -> dict:
    back = {v: k for k, v in standins.items()}
    same = [("".join(back.get(c, c) for c in p) == ref[r]) for p, r in
            zip(mine["predictions"], mine["rows"])]
    differ = [{"row": r, "pipeline": p, "reference": ref[r]}
              for p, r, s in zip(mine["predictions"], mine["rows"], same) if not s]
    return {"agree_percent": 100.0 * sum(same) / len(same), "lines": len(same),
            "differ": differ[:10]}


def measure_model(cli, package: Path, name: str, folder: Path, labels: Path,
                  calibration: int, evaluation: int) -> dict:
    from benchmarks import byo
    from pipeline.core import isolate

    root = ROOT / name
    root.mkdir(parents=True, exist_ok=True)
    ref = isolate.call(f"zoo ddddocr {name}: the package's own inference", reference,
                       package, name, folder, labels)
    charset = root / "charset.txt"
    standins = write_charset(ref.pop("charset"), charset)
    given = handed = package / "ddddocr" / f"{name}.onnx"  # as the package ships it
    common = ["model=onnx", f"model.path={handed}", *DATA_ARGS, f"data.path={folder}",
              f"data.labels={labels}", f"data.calibration_samples={calibration}",
              f"data.evaluation_samples={evaluation}", "metric=ctc",
              f"metric.charset={charset}", "registry=null",
              # accuracy as the model is used (one line per call): padding changes its reading
              "model.eval_batch_size=1",
              f"bench.nonce=zoo-{time.strftime('%Y%m%dT%H%M%S')}"]
    out: dict = {"file": str(given), "charset_standins": standins,
                 "reference": {k: v for k, v in ref.items() if k != "texts"}, "runs": {}}
    # FP32 parity: the file as shipped, through the import stage as a run takes it in,
    # read through the pipeline's preprocessing, batching and decoding, one line at a time (as
    # the runs evaluate, and as the reference reads) and in padded batches of 64.
    out["parity"] = {}
    for label, extra in (("batch 1", []), ("batches of 64 (the default)",
                                           ["model.eval_batch_size=64"])):
        mine = isolate.call(f"zoo ddddocr {name}: the pipeline's FP32 predictions ({label})",
                            pipeline_predictions, handed, [*common, *extra])
        out["parity"][label] = parity(mine, ref["texts"], standins)
    lines = labels.read_text().splitlines()
    out["reference"]["accuracy_on_evaluation"] = 100.0 * sum(
        ref["texts"][r] == str(json.loads(lines[r])["label"]) for r in mine["rows"]) / len(
        mine["rows"])
    for q in QUANTS:
        args = [*common, f"quant={q}"]
        try:
            if q == "auto":
                code, seconds, rep = cli(args, timeout=AUTO_TIMEOUT_S)
                if code == 124:
                    out["runs"][q] = {"command": "python -m pipeline " + " ".join(args),
                                      "timed_out_after_s": AUTO_TIMEOUT_S, "exit_code": code}
                    continue
                out["runs"][q] = byo._run(lambda a: (code, seconds, rep), args)
            else:
                out["runs"][q] = byo._run(cli, args)
        except RuntimeError as e:
            out["runs"][q] = {"error": str(e)}
    done = [q for q in QUANTS if "lineage" in out["runs"][q]]
    if not done:
        return out
    args = [*common, f"quant={done[0]}"]
    fp32 = Path(out["runs"][done[0]]["lineage"]["fp32"]) / "model.onnx"
    default = root / "ort_default.onnx"
    import onnx

    from pipeline.models.onnx_file import quantized_ops

    held = quantized_ops(onnx.load(str(given), load_external_data=False).graph)
    if held:  # quantize_static re-quantizes float models only (as quant=int8, refused)
        out["ort_default"] = {"skipped": f"already quantized ({', '.join(held)})"}
    else:
        out["ort_default"] = {
            "built": isolate.call(f"zoo ddddocr {name}: onnxruntime default quantize_static",
                                  byo.default_quantize, fp32, default, args),
            "accuracy": isolate.call(f"zoo ddddocr {name}: evaluate the default INT8",
                                     byo.evaluate, default, args)}
    models = {"fp32": fp32, **({} if held else {byo.ORT_DEFAULT: default}),
              **{q: Path(out["runs"][q]["lineage"]["candidate"]) / "model.onnx" for q in done}}
    out["timing"] = isolate.call(f"zoo ddddocr {name}: timing side by side", byo.timed, models,
                                 args, tuple(done))
    return out


def measure(cli, quick: bool = False) -> dict:
    from benchmarks.zoo.fetch import fetch

    package = fetch(REQUIREMENT)
    calibration, evaluation = QUICK if quick else (CALIBRATION, EVALUATION)
    folder = ROOT / "lines"
    labels = write_lines(folder, calibration + evaluation)
    out: dict = {"requirement": REQUIREMENT, "lines": calibration + evaluation,
                 "data_args": DATA_ARGS, "models": {}}
    for name in MODELS:
        try:
            out["models"][name] = measure_model(cli, package, name, folder, labels, calibration,
                                                evaluation)
        except Exception as e:  # noqa: BLE001 - recorded; the other model still runs
            import traceback

            out["models"][name] = {"error": f"{type(e).__name__}: {e}",
                                   "trace": traceback.format_exc()}
    out["summary"] = [summary(name, m) for name, m in out["models"].items() if "error" not in m]
    out["targets"] = targets(out)
    return out


def summary(name: str, m: dict) -> dict:
    """The results page's row of one model (``benchmarks.zoo`` describes the keys)."""
    from benchmarks.byo import ORT_DEFAULT
    from benchmarks.zoo import run_rows

    runs, acc, verdict = run_rows(m["runs"], "sequence_accuracy")
    if "accuracy" in m.get("ort_default", {}):
        acc["onnxruntime quantize_static"] = m["ort_default"]["accuracy"]["sequence_accuracy"]
    speedup = {}
    for b, tb in (m.get("timing") or {}).items():
        for q in runs:
            for other in ("fp32", ORT_DEFAULT):
                key = f"{q} vs {other}"
                if key in tb["speedup"]:
                    speedup[f"{q} vs {'FP32' if other == 'fp32' else 'quantize_static'} b{b}"] = \
                        tb["speedup"][key]
    return {"model": f"ddddocr {name}.onnx", "metric": "sequence accuracy %",
            "parity_percent": max((p["agree_percent"] for p in m.get("parity", {}).values()),
                                  default=None),
            "verdict": verdict, "accuracy": acc, "speedup": speedup}


def targets(out: dict) -> dict:
    from benchmarks.zoo import ocr_run_targets

    t: dict = {}
    for name, m in out["models"].items():
        if "error" in m:
            t[f"{name}: measured"] = [m["error"], False]
            continue
        for label, par in m.get("parity", {}).items():
            p = par["agree_percent"]
            # the target is parity as the reference reads (one line per call, as the runs
            # evaluate); padded batches are shown for what batching costs this model, not judged
            one = label == "batch 1"
            t[f"{name}: FP32 parity with DdddOcr().classification, {label} (% of lines)"
              + ("" if one else ", shown, not a target")] = [p, p >= 99.0 if one else None]
        t.update(ocr_run_targets(m["runs"], f"{name} "))
        for b, tb in (m.get("timing") or {}).items():
            for key, sp in tb["speedup"].items():
                if key.endswith("vs fp32") or " vs ort_default" in key:
                    t[f"{name} batch {b}: {key} (speedup, CI)"] = [sp, None]
        if "accuracy" in m.get("ort_default", {}):
            a = m["ort_default"]["accuracy"]
            t[f"{name}: onnxruntime default quantize_static sequence accuracy / CER"] = [
                [a["sequence_accuracy"], a["cer"]], None]
    return t
