"""``make bench`` section ``transformer``: a BERT encoder from a local folder, through ``model=hf``.

The project builds the folder itself (``build``): a 6-layer, 384-hidden, 12-head BERT with random
weights and a WordPiece tokenizer trained on generated sentences, saved with ``save_pretrained``,
plus a JSONL text set of at least 1,000 generated sentences of varied length. Nothing is
downloaded. Then ``python -m pipeline model=hf ... metric=agreement quant=dynamic`` runs on it, and
the section records: the fusions and node counts before and after; the fused FP32 against the
unfused export and INT8 against the fused FP32 (from the run's own interleaved benchmark); mean
and 1st-percentile cosine of INT8 against the model as given and against FP16; and, timed side by
side in one process on the same real batches, the pipeline's INT8 against OpenVINO's default
compile of the exported ONNX model and against Optimum's default dynamic INT8 of the same export,
at batch 1 and 8. Optimum's model is made by Optimum itself: ``ORTQuantizer`` with
``AutoQuantizationConfig.<arch>(is_static=False)`` for this CPU, run by ``optimum_peer.py`` in
``.venv-optimum`` (``make bench`` builds it: ``optimum-onnx`` requires transformers < 4.58, the
``hf`` extra has 5), which has the same onnxruntime as ``.venv``; both INT8 models are then timed
here by one runtime. The section records Optimum's version, the config and the onnxruntime
version, or, when that venv is missing or Optimum fails, the error, and times the other peers.
A benchmark, not a test: nothing here asserts.
"""
from __future__ import annotations

import json
import os
import random
import subprocess
import time
from pathlib import Path

import numpy as np

BERT = {"layers": 6, "hidden": 384, "heads": 12}
SENTENCES = 1200
TARGETS = {"int8_vs_fused_fp32_b8_vnni": 1.8, "int8_vs_fused_fp32_b8_no_vnni": 1.3,
           "cosine_mean_vs_fp16": 0.99}
WORDS = ("model data search query result vector index user page text language system fast slow "
         "small large network layer token embedding answer question document review product "
         "price store city river market school music movie team game player story news world "
         "the a of to and in is for on with as by at from that this it be are was not").split()
# Optimum's venv (Makefile: OPTIMUM_VENV), in the repository root; OPTIMUM_PYTHON names another.
OPTIMUM_PYTHON = Path(__file__).resolve().parents[1] / ".venv-optimum" / "bin" / "python"
OPTIMUM = "optimum default dynamic int8"


def sentences(n: int, seed: int = 0) -> list[str]:
    """Generated sentences of 3 to 120 words: long tails matter to a length-bucketed timing."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        length = min(120, max(3, int(rng.lognormvariate(2.8, 0.7))))
        out.append(" ".join(rng.choice(WORDS) for _ in range(length)))
    return out


def wordpiece(folder: Path, text: list[str], vocab_size: int):
    """A BERT-style WordPiece tokenizer trained on ``text`` with ``tokenizers`` and saved to
    ``folder`` (what a local BERT folder holds; nothing downloaded)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(text, trainers.WordPieceTrainer(
        vocab_size=vocab_size, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]))
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[(s, tok.token_to_id(s)) for s in ("[CLS]", "[SEP]")])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]",
                                   cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]",
                                   model_input_names=["input_ids", "token_type_ids",
                                                      "attention_mask"])
    fast.save_pretrained(str(folder))
    return fast


def build(folder: Path, layers: int, hidden: int, heads: int, n: int, seed: int = 0) -> Path:
    """The BERT folder and ``text.jsonl`` next to it; returns the JSONL path."""
    import torch
    from transformers import BertConfig, BertModel

    folder.mkdir(parents=True, exist_ok=True)
    text = sentences(n, seed)
    fast = wordpiece(folder, text, vocab_size=2000)
    torch.manual_seed(seed)
    BertModel(BertConfig(vocab_size=len(fast.get_vocab()), hidden_size=hidden,
                         num_hidden_layers=layers, num_attention_heads=heads,
                         intermediate_size=4 * hidden, max_position_embeddings=512)
              ).eval().save_pretrained(str(folder))
    data = folder.parent / "text.jsonl"
    data.write_text("".join(json.dumps({"text": s}) + "\n" for s in text))
    return data


def optimum_peer(export: Path, folder: Path, out: Path, timeout: float = 900) -> dict:
    """Optimum's default dynamic INT8 of ``export`` in ``out``, made by ``optimum_peer.py`` in
    Optimum's venv; returns its record (``optimum.json``). Raises ``RuntimeError`` with the
    reason when the venv is missing or Optimum fails."""
    python = Path(os.environ.get("OPTIMUM_PYTHON", OPTIMUM_PYTHON))
    if not python.exists():
        raise RuntimeError(f"{python}: no Optimum venv (make bench builds it: "
                           "make .venv-optimum/.installed)")
    # -I: the venv's own packages only, whatever PYTHONPATH the bench runs with; no hub access.
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run([str(python), "-I", str(Path(__file__).with_name("optimum_peer.py")),
                           str(export), str(folder), str(out)],
                          capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode:
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        raise RuntimeError(f"optimum_peer exited {proc.returncode}: "
                           f"{lines[-1] if lines else 'no message'}")
    return json.loads((out / "optimum.json").read_text())


def side_by_side(run_dir: Path, folder: Path, data: Path, workdir: Path, batches=(1, 8),
                 max_seconds: float = 20.0) -> dict:
    """The pipeline's INT8 against OpenVINO's default compile of the exported ONNX model and
    against Optimum's default dynamic INT8 of it, on the same real length-bucketed batches,
    interleaved in one process. Without Optimum's model (``optimum.error``) the others are
    still timed."""
    import onnxruntime

    from pipeline.config import HardwareConfig, ModelConfig
    from pipeline.data.real_batches import bucketed
    from pipeline.config.data import DataConfig
    from pipeline.measure import timing
    from pipeline.config.metrics import MetricConfig
    from pipeline.models import task
    from pipeline.models.sources import task_key
    from pipeline.runtimes import onnxruntime as ort
    from pipeline.runtimes.openvino import core

    rep = json.loads((run_dir / "report.json").read_text())
    lineage = rep["lineage"]
    hw = HardwareConfig().target()
    key = task_key(ModelConfig(name="hf", path=str(folder)),
                   DataConfig(**{k: v for k, v in rep["config"]["data"].items() if k != "image"}),
                   MetricConfig(name="agreement"), str(workdir / "data"))
    t = task(key)
    ds = t.dataset(t.split("evaluation", rep["config"]["data"]["evaluation_samples"],
                           str(workdir / "data")))
    export = Path(lineage["export"]["path"]) / "model.onnx"
    mine = ort.session(Path(lineage["candidate"]["path"]) / "model.onnx", hw)
    compiled = core().compile_model(str(export), "CPU", {"PERFORMANCE_HINT": "LATENCY"})
    request = compiled.create_infer_request()
    ov = "openvino default compile (fp32 export)"
    fns = {"pipeline": lambda x: ort.run(mine, x),
           ov: lambda x: request.infer(x, share_inputs=True)[0]}
    t0 = time.time()
    try:
        optimum = optimum_peer(export, folder, workdir / "optimum")
        theirs = ort.session(workdir / "optimum" / optimum["model"], hw)
        fns[OPTIMUM] = lambda x: ort.run(theirs, x)
        # Optimum quantized with its venv's onnxruntime (versions); both models run on this one
        optimum["onnxruntime_timed_with"] = onnxruntime.__version__
    except (RuntimeError, OSError, ValueError, subprocess.TimeoutExpired) as e:
        optimum = {"error": str(e)}
    optimum["seconds"] = round(time.time() - t0, 1)
    out = {"optimum": optimum}
    # cosine of each model against the FP16 baseline (the gate's reference) and the fused FP32
    refs = {r: ort.session(Path(lineage[r]["path"]) / "model.onnx", hw) for r in ("fp16", "fp32")}
    cos = {r: {k: [] for k in fns} for r in refs}
    for _, feeds, _ in t.batches(ds, 16):
        outs = {k: (request.infer(feeds)[0] if k == ov else fn(feeds)) for k, fn in fns.items()}
        for r, s in refs.items():
            ref = np.asarray(ort.run(s, feeds), dtype=np.float64)
            for k, y in outs.items():
                cos[r][k] += list((ref * y).sum(-1) / np.maximum(
                    np.linalg.norm(ref, axis=-1) * np.linalg.norm(y, axis=-1), 1e-30))
    out.update({f"cosine_mean_vs_{r}": {k: float(np.mean(v)) for k, v in c.items()}
                for r, c in cos.items()})
    out["cosine_p1_vs_fp16"] = {k: float(np.percentile(v, 1)) for k, v in cos["fp16"].items()}
    names = {ov: "pipeline_speedup_vs_openvino", OPTIMUM: "pipeline_speedup_vs_optimum"}
    for b in batches:
        inputs, _ = bucketed(t, ds, b, 4, 2, np.random.default_rng(0))
        pairs = [(k, "pipeline") for k in fns if k != "pipeline"]
        times, info = timing.head_to_head(fns, inputs, pairs, 30, max_seconds, 0.03)
        out[str(b)] = {"p50_ms": {k: float(np.median(v)) for k, v in times.items()},
                       **{names[k]: timing.ratio_ci(times[k], times["pipeline"]) for k, _ in pairs},
                       "rounds": info.get("rounds")}
    return out


def section(cli, quick: bool = False) -> dict:
    """``cli(args) -> (exit code, seconds, report)`` runs ``python -m pipeline`` (``run.py``)."""
    import tempfile

    from pipeline.core.env import cpu_info

    shape = {"layers": 2, "hidden": 64, "heads": 4} if quick else BERT
    n = 200 if quick else SENTENCES
    root = Path(tempfile.mkdtemp(prefix="bench-transformer-"))
    folder = root / "bert"
    t0 = time.time()
    data = build(folder, shape["layers"], shape["hidden"], shape["heads"], n)
    built_s = time.time() - t0
    workdir = root / "work"
    args = ["model=hf", f"model.path={folder}", "data=jsonl", f"data.path={data}",
            "data.input_column=text", f"data.calibration_samples={64 if quick else 200}",
            f"data.evaluation_samples={96 if quick else 800}", "metric=agreement",
            "quant=dynamic", "registry=null",  # the default gate: a cosine's own limits
            f"workdir={workdir}", f"data_dir={workdir / 'data'}", "bench.cold_start_repeats=0",
            f"bench.nonce={time.time()}"]
    if quick:
        args += ["bench.min_rounds=20", "bench.min_seconds=0", "bench.max_seconds=2",
                 "bench.warmup_max_runs=20", "bench.aa_tolerance=0.5"]
    code, seconds, _ = cli(args)  # cli reads ./artifacts; this run's report is in workdir
    latest = workdir / "runs" / "latest" / "report.json"
    rep = json.loads(latest.read_text()) if latest.exists() else {}
    if not rep:
        raise RuntimeError(f"the pipeline wrote no report (exit {code})")
    rows = {r["role"]: r for r in rep["rows"]}
    lat = {role: r["latency"] for role, r in rows.items()}
    ratio = {b: {"fused_fp32_vs_unfused_export": lat["export"][b]["p50"] / lat["fp32"][b]["p50"],
                 "int8_vs_fused_fp32": lat["fp32"][b]["p50"] / lat["candidate"][b]["p50"]}
             for b in lat["candidate"]}
    flags = set(cpu_info().get("flags", []))
    vnni = bool(flags & {"avx512_vnni", "avx_vnni", "amx_int8"})
    target = TARGETS["int8_vs_fused_fp32_b8_vnni" if vnni else "int8_vs_fused_fp32_b8_no_vnni"]
    b8 = ratio.get("8", {}).get("int8_vs_fused_fp32")
    cos = {"vs_model_as_given": {r: rows[r]["cosine_mean"] for r in rows},
           "candidate_p1": rows["candidate"]["cosine_p1"]}
    peers = side_by_side(workdir / "runs" / "latest", folder, data, workdir,
                         max_seconds=5 if quick else 20)
    fusion = rep.get("fusion") or {}
    return {
        "model": {**shape, "sentences": n, "quick": quick, "built_seconds": round(built_s, 1)},
        "cpu_has_vnni": vnni,  # run.py stamps the whole cpu_info() as "cpu"
        "command": "python -m pipeline " + " ".join(args), "exit_code": code,
        "seconds": round(seconds, 1), "verdict": rep["verdict"]["passed"],
        "fusion": fusion, "p50_ms": {role: {b: v["p50"] for b, v in l.items()}
                                      for role, l in lat.items()},
        "speedups_p50": ratio, "cosine": cos,
        "candidate_speedup_gate_b8": rows["candidate"]["latency"].get("8", {}).get(
            "speedup_vs_fastest_float"),
        "peers": peers,
        "targets": targets(fusion, ratio, b8, target, vnni, peers)}


def targets(fusion: dict, ratio: dict, b8, target: float, vnni: bool, peers: dict) -> dict:
    """The issue's targets as name -> [measured, met] (the results page's contract)."""
    unfused = ratio.get("8", {}).get("fused_fp32_vs_unfused_export")
    cosine = peers["cosine_mean_vs_fp16"]["pipeline"]
    out = {
        "fusions cut the node count (before, after)": [
            [fusion.get("nodes_before"), fusion.get("nodes_after")],
            bool(fusion) and fusion["nodes_after"] < fusion["nodes_before"]],
        "batch 8: fused FP32 faster than the unfused export (p50 ratio)": [unfused,
                                                                         (unfused or 0) > 1],
        f"batch 8: pipeline INT8 vs fused FP32 >= {target}x "
        f"({'VNNI' if vnni else 'no VNNI'} on this CPU)": [b8, b8 is not None and b8 >= target],
        # against the FP16 baseline's outputs (the run's own metric compares with the model as
        # given in torch, FP32: in "cosine")
        f"mean cosine vs FP16 >= {TARGETS['cosine_mean_vs_fp16']}": [
            cosine, cosine >= TARGETS["cosine_mean_vs_fp16"]],
    }
    optimum = peers.get("optimum", {})
    label = optimum.get("auto_quantization_config", "AutoQuantizationConfig")
    for b in ("1", "8"):
        for peer, key in (("OpenVINO's default compile", "pipeline_speedup_vs_openvino"),
                          (f"Optimum's default dynamic INT8 ({label})",
                           "pipeline_speedup_vs_optimum")):
            if b in peers and key in peers[b]:
                v = peers[b][key]["median"]
                out[f"batch {b}: pipeline faster than {peer}"] = [v, v > 1]
            elif key == "pipeline_speedup_vs_optimum":  # not timed: say why, claim nothing
                out[f"batch {b}: pipeline faster than {peer}"] = [
                    f"not measured: {optimum.get('error', 'no Optimum model')}", None]
    return out
