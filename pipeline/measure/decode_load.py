"""Concurrent generation streams against p99 targets, and memory against the bill, for a decoder.

In: an onnxruntime-genai folder, prompts as token ids, stream counts (or sequence lengths and
batch sizes), the p99 targets for time to first token and per-token latency. Out: per stream
count the p50/p99 of both latencies and the aggregate tokens/s, whether the targets are met and
the most streams that meet them; per (streams, length) point the resident memory measured against
the bill's estimate (stored weights + KV cache).

The load test: ``streams`` users each run their own generator on one shared model, started
together and each asking again as soon as its answer is done (closed loop, as a chat client
does), so the latencies include every wait for the cores the others cause. Unlike
``decode.compare_generation``'s batches, nothing here shares a step between streams:
onnxruntime-genai's ``Generator`` has no continuous batching across generators, so this is what
N users cost a server that runs one generator per request.

Memory: each point runs in a fresh child (``pipeline.core.isolate``: the allocator of an earlier
point would still hold its pages), loads the model, then fills a cache of ``seq`` positions for
``streams`` sequences (a prompt of ``seq - 1`` tokens and one decode step: the KV buffer
onnxruntime-genai allocates for ``max_length`` is only resident where written). Measured: the
resident memory the load added, and the peak (``VmHWM``) the generation added on top; the bill's
estimate is the weights as stored plus ``token_bytes.TokenBytes.kv_bytes``. Prefill also holds
the logits of every prompt position (streams x seq x vocab x 4 bytes) for a moment: the estimate
names it apart, as the bill's margin must cover it.
Deliberately not handled: open-loop arrivals (``serving`` does them for encoders), cancellation.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from pipeline.measure.decode import generate, kv_length, load_model


def concurrent_streams(folder, prompts: Sequence[Sequence[int]], *, new_tokens: int,
                       streams: Sequence[int], ttft_p99_ms: float, token_p99_ms: float,
                       generations: int = 2, threads: int | None = None, model=None) -> dict:
    """For each count in ``streams``: that many closed-loop users, ``generations`` answers each."""
    model = model if model is not None else load_model(folder, threads)
    generate(model, np.asarray([prompts[0]], np.int32), min(new_tokens, 4))  # warm-up
    steps = []
    for n in streams:
        ttft: list[float] = []
        token: list[float] = []
        lock, start = threading.Lock(), threading.Barrier(n)
        errors: list[BaseException] = []

        def user(k: int) -> None:
            try:
                start.wait()
                for g in range(generations):
                    p = prompts[(k + g * n) % len(prompts)]
                    t, s = generate(model, np.asarray([p], np.int32), new_tokens)
                    with lock:
                        ttft.append(t)
                        token.extend(s)
            except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
                errors.append(e)

        workers = [threading.Thread(target=user, args=(k,), daemon=True) for k in range(n)]
        t0 = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        wall = time.perf_counter() - t0
        if errors:
            raise errors[0]
        step = {"streams": n, "generations": len(ttft),
                "ttft_ms_p50": float(np.percentile(ttft, 50)),
                "ttft_ms_p99": float(np.percentile(ttft, 99)),
                "token_ms_p50": float(np.percentile(token, 50)),
                "token_ms_p99": float(np.percentile(token, 99)),
                "tokens_per_s": n * generations * new_tokens / wall, "seconds": round(wall, 2)}
        step["meets_slo"] = bool(step["ttft_ms_p99"] <= ttft_p99_ms
                                 and step["token_ms_p99"] <= token_p99_ms)
        steps.append(step)
    within = [s["streams"] for s in steps if s["meets_slo"]]
    return {"ttft_p99_ms_target": ttft_p99_ms, "token_p99_ms_target": token_p99_ms,
            "new_tokens": new_tokens, "steps": steps,
            "max_streams_within_slo": max(within) if within else 0}


def _status_mb(key: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _rss_point(folder: str, streams: int, seq: int, threads: int | None) -> dict:
    """In a child: resident MB before and after loading, and the peak after filling the cache."""
    import onnxruntime_genai as og

    before = _status_mb("VmRSS")
    model = load_model(folder, threads)
    loaded = _status_mb("VmRSS")
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=kv_length(model, seq), min_length=seq,
                              batch_size=streams, do_sample=False)
    gen = og.Generator(model, params)
    ids = (np.arange(streams * (seq - 1)).reshape(streams, seq - 1) % 50 + 10).astype(np.int32)
    gen.append_tokens(ids)
    gen.generate_next_token()
    return {"before_load_mb": before, "after_load_mb": loaded, "peak_mb": _status_mb("VmHWM"),
            "rss_mb": _status_mb("VmRSS")}


def memory_curve(folder, points: Sequence[tuple[int, int]], threads: int | None = None) -> dict:
    """Measured resident memory against the bill's estimate at each (streams, seq) point."""
    import json

    from pipeline.core import isolate
    from pipeline.bill.token_bytes import count
    from pipeline.metrics.generation import model_file

    folder = Path(folder)
    tb = count(model_file(folder))
    vocab = json.loads((folder / "genai_config.json").read_text())["model"]["vocab_size"]
    rows = []
    for streams, seq in points:
        m = isolate.call(f"memory at {streams} x {seq} tokens", _rss_point, str(folder), streams,
                         seq, threads)
        model_mb = m["after_load_mb"] - m["before_load_mb"]
        generation_mb = m["peak_mb"] - m["after_load_mb"]
        kv = tb.kv_bytes(seq, streams)
        logits = streams * (seq - 1) * vocab * 4
        rows.append({"streams": streams, "seq": seq, "model_mb": model_mb,
                     "generation_peak_mb": generation_mb, "total_mb": m["peak_mb"] - m["before_load_mb"],
                     "bill_weights_mb": tb.stored / 2 ** 20,
                     "bill_kv_mb": kv / 2 ** 20, "prefill_logits_mb": logits / 2 ** 20,
                     "bill_mb": (tb.stored + kv) / 2 ** 20,
                     "measured_over_bill": (m["peak_mb"] - m["before_load_mb"]) * 2 ** 20
                     / (tb.stored + kv)})
    return {"kv_bytes_per_position": tb.kv_per_position, "weights_bytes": tb.stored,
            "unit": "MiB", "points": rows}
