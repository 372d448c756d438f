"""Decode timed as users feel it: time to first token, per-token latency and tokens/s.

In: an onnxruntime-genai model folder (``genai_config.json`` beside the ONNX file), prompts as
token ids, the number of tokens to generate and how many sequences decode together. Out: a
``DecodeTiming`` per model (every time to first token, every decode step, tokens/s). The
Generator API of onnxruntime-genai does the work; nothing here re-implements the KV cache.

What is timed, and why so (onnxruntime-genai 0.18):
- ``append_tokens`` runs the prompt through the model (prefill) and ``generate_next_token`` then
  only samples from its logits; the time to first token is the two together.
- Every later ``generate_next_token`` runs one step over the last token with the KV cache, then
  samples: one decode step, ``token_ms``. All streams of a batch advance together, so a step yields
  ``streams`` tokens and tokens/s = streams x 1000 / mean step.
- ``min_length`` is set to the full length: a random or small model that emits its end token
  early would otherwise time a shorter run than asked.
- Several streams are one batch in one generator (the weights are read once per step for all of
  them, which is what batching buys at decode). A batch's prompts are cut to the shortest one's
  length, keeping their ends: padding would add tokens the prefill time then counts.
- Between models the runs are interleaved round by round (``timing.interleaved``: rotated order,
  rounds until the ratio of whole-generation times is known within ``rel_ci``), so the host's
  drift lands on every model alike; the ratio decided on is the one of whole generations, and
  the steps inside each are kept for their percentiles.
The thread count is the one ONNX Runtime gets everywhere else in the pipeline
(``hardware.intra_op_threads``), set through the config overlay, so the folder is never edited.
``greedy`` is one sequence's generation yielded token by token: what the model server streams.
Deliberately not handled: sampling (greedy only: sampling's cost is not the model's), speculative
decoding, continuous batching of streams that start at different times (``load`` runs those).
"""
from __future__ import annotations

import json
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from pipeline.core.json_record import to_json
from pipeline.measure import timing
from pipeline.measure.decode_summary import DecodeSummary


@dataclass(frozen=True)
class DecodeTiming:
    ttft_ms: tuple[float, ...]        # prompt in to first token out, one per generation
    token_ms: tuple[float, ...]       # every decode step after the first token (all streams)
    tokens_per_s: float               # streams x 1000 / mean decode step: decode alone
    streams: int                      # sequences decoded together (one batch)
    new_tokens: int                   # tokens generated per sequence
    prompt_tokens: tuple[int, ...] = ()  # each generation's prompt length (per stream), for
                                         # prefill latency by length

    def summary(self) -> dict:
        """Percentiles and rates, plain numbers for reports: a ``DecodeSummary``'s JSON, so
        the shape written here is the one the report reads back."""
        tok, ttft = np.asarray(self.token_ms), np.asarray(self.ttft_ms)

        def pct(a: np.ndarray, q: int) -> float | None:  # None: nothing timed, no key
            return float(np.percentile(a, q)) if a.size else None

        return to_json(DecodeSummary(
            streams=self.streams, new_tokens=self.new_tokens, tokens_per_s=self.tokens_per_s,
            generations=int(ttft.size), steps=int(tok.size),
            token_ms_p50=pct(tok, 50), token_ms_p99=pct(tok, 99),
            ttft_ms_p50=pct(ttft, 50), ttft_ms_p99=pct(ttft, 99),
            ttft_ms_by_prompt_tokens=self._ttft_by_length() if self.prompt_tokens else None))

    def _ttft_by_length(self) -> dict[str, float]:
        """Prefill latency by prompt length: the median time to first token of each length."""
        by_len: dict[int, list[float]] = {}
        for n, ms in zip(self.prompt_tokens, self.ttft_ms):
            by_len.setdefault(int(n), []).append(ms)
        return {str(n): float(np.median(v)) for n, v in sorted(by_len.items())}


def load_model(folder, threads: int | None = None, overlay: str | None = None):
    """An ``og.Model`` for ``folder`` on the CPU with ``threads`` intra-op threads (None: the
    runtime's own choice), and ``overlay`` (JSON) over its config. Overlays change the loaded
    config only, never the folder."""
    import onnxruntime_genai as og

    cfg = og.Config(str(folder))
    if threads is not None:
        cfg.overlay(json.dumps({"model": {"decoder": {"session_options": {
            "intra_op_num_threads": int(threads), "inter_op_num_threads": 1}}}}))
    if overlay:
        cfg.overlay(overlay)
    model = og.Model(cfg)
    from pipeline.metrics.generation import local_window, model_file

    window = local_window(model_file(Path(folder)))
    if window:
        _LOCAL_WINDOW[model] = window
    return model


# Models with local-attention layers (Gemma 2 and 3): onnxruntime's GroupQueryAttention refuses
# a KV cache (max_length) shorter than the window, however few tokens are generated. Weak keys:
# a model released (one at a time, a 7 B model after its turn) is not held here.
_LOCAL_WINDOW: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def kv_length(model, needed: int) -> int:
    """The KV cache length a generation of ``needed`` positions asks for: at least the model's
    local attention window, if it has one (only ``needed`` positions are generated either way)."""
    return max(needed, _LOCAL_WINDOW.get(model, 0))


def batches(prompts: Sequence[Sequence[int]], streams: int) -> list[np.ndarray]:
    """Groups of ``streams`` prompts (cycling through them), each cut to its shortest member's
    length, keeping the ends: one int32 array [streams, length] per generation."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    if streams < 1:
        raise ValueError(f"streams={streams}: must be >= 1")
    groups = max(1, len(prompts) // streams) if len(prompts) >= streams else 1
    out = []
    for g in range(groups):
        members = [prompts[(g * streams + k) % len(prompts)] for k in range(streams)]
        n = min(len(p) for p in members)
        out.append(np.asarray([list(p)[len(p) - n:] for p in members], dtype=np.int32))
    return out


def generate(model, batch: np.ndarray, new_tokens: int) -> tuple[float, list[float]]:
    """One greedy generation of ``new_tokens`` per sequence: (time to first token in ms,
    decode steps in ms)."""
    import onnxruntime_genai as og

    streams, n = batch.shape
    params = og.GeneratorParams(model)
    total = n + new_tokens
    params.set_search_options(max_length=kv_length(model, total), min_length=total,
                              batch_size=streams, do_sample=False)
    gen = og.Generator(model, params)
    t0 = time.perf_counter_ns()
    gen.append_tokens(batch)
    gen.generate_next_token()
    ttft = (time.perf_counter_ns() - t0) / 1e6
    steps = []
    for _ in range(new_tokens - 1):
        t = time.perf_counter_ns()
        gen.generate_next_token()
        steps.append((time.perf_counter_ns() - t) / 1e6)
    return ttft, steps


def greedy(model, prompt: Sequence[int], new_tokens: int):
    """One sequence's greedy generation, token by token as each is chosen (a server streams
    them): up to ``new_tokens`` after ``prompt``, ending early at the model's end token."""
    import onnxruntime_genai as og

    params = og.GeneratorParams(model)
    params.set_search_options(max_length=kv_length(model, len(prompt) + new_tokens),
                              do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens(np.asarray([list(prompt)], dtype=np.int32))
    for _ in range(new_tokens):
        if gen.is_done():
            break
        gen.generate_next_token()
        yield int(gen.get_next_tokens()[0])


def _timing(ttft: list[float], steps: list[float], lengths: list[int], streams: int,
            new_tokens: int) -> DecodeTiming:
    mean = float(np.mean(steps)) if steps else float("nan")
    return DecodeTiming(ttft_ms=tuple(ttft), token_ms=tuple(steps),
                        tokens_per_s=streams * 1000.0 / mean if steps else float("nan"),
                        streams=streams, new_tokens=new_tokens, prompt_tokens=tuple(lengths))


def time_generation(folder, prompts: Sequence[Sequence[int]], *, new_tokens: int,
                    streams: int = 1, repeats: int = 3, threads: int | None = None,
                    model=None) -> DecodeTiming:
    """One model: one warm-up generation, then ``repeats`` passes over the prompts (in groups
    of ``streams``). ``model``: an already loaded ``og.Model`` of ``folder`` (saves a load)."""
    if new_tokens < 2:
        raise ValueError(f"new_tokens={new_tokens}: at least 2 (a first token and one step)")
    model = model if model is not None else load_model(folder, threads)
    groups = batches(prompts, streams)
    generate(model, groups[0], min(new_tokens, 4))  # first run: allocation, kernel choice
    ttft, steps, lengths = [], [], []
    for _ in range(repeats):
        for b in groups:
            t, s = generate(model, b, new_tokens)
            ttft.append(t)
            steps.extend(s)
            lengths.append(b.shape[1])
    return _timing(ttft, steps, lengths, streams, new_tokens)


def compare_generation(folders: dict[str, Path], prompts: Sequence[Sequence[int]], *,
                       new_tokens: int, streams: int = 1, baseline: str | None = None,
                       threads: int | None = None, min_rounds: int = 6, max_seconds: float = 60.0,
                       rel_ci: float = 0.03, min_seconds: float = 0.0,
                       one_at_a_time: bool = False) -> tuple[dict[str, DecodeTiming], dict]:
    """Several models timed side by side: each round runs one whole generation per model on the
    same prompts, in a rotated order (``timing.interleaved``), until the ratio of each model's
    generation time to the ``baseline``'s (default: the first) is known within ``rel_ci``.
    Returns the timings by model and the rounds' info, with "speedup_vs_<baseline>": the median
    of per-round ratios (baseline time / model time) with its 95 % interval.

    ``one_at_a_time``: for models that do not fit in memory together (a 7 B INT8 reference and
    its INT4 candidate hold 13 GB): each model is loaded alone, timed for ``min_rounds`` passes
    over the prompts, and released before the next loads. Round i of every model runs the same
    prompts, so the ratios are still paired, but the machine's drift between the models' turns
    is not cancelled as interleaving cancels it; the info says so ("one_at_a_time")."""
    roles = list(folders)
    baseline = baseline or roles[0]
    if one_at_a_time:
        return _one_at_a_time(folders, prompts, new_tokens, streams, baseline, threads,
                              min_rounds, rel_ci)
    models = {r: load_model(f, threads) for r, f in folders.items()}
    groups = batches(prompts, streams)
    record: dict[str, dict[str, list]] = {r: {"ttft": [], "steps": [], "lengths": []} for r in roles}

    def runner(role):
        def run(b):
            t, s = generate(models[role], b, new_tokens)
            record[role]["ttft"].append(t)
            record[role]["steps"].extend(s)
            record[role]["lengths"].append(b.shape[1])
        return run

    fns = {r: runner(r) for r in roles}
    for r in roles:  # warm-up, not recorded
        generate(models[r], groups[0], min(new_tokens, 4))
        generate(models[r], groups[0], min(new_tokens, 4))
    pairs = [(baseline, r) for r in roles if r != baseline] or [(baseline, baseline)]
    times, info = timing.interleaved(fns, groups, pairs, min_rounds=min_rounds,
                                     max_seconds=max_seconds, rel_ci=rel_ci, check_every=1,
                                     min_seconds=min_seconds)
    info[f"speedup_vs_{baseline}"] = {r: timing.ratio_ci(times[baseline], times[r])
                                      for r in roles if r != baseline}
    out = {r: _timing(v["ttft"], v["steps"], v["lengths"], streams, new_tokens)
           for r, v in record.items()}
    return out, info


def _one_at_a_time(folders: dict[str, Path], prompts, new_tokens: int, streams: int,
                   baseline: str, threads: int | None, rounds: int, rel_ci: float
                   ) -> tuple[dict[str, DecodeTiming], dict]:
    """``compare_generation`` with one model in memory at a time (see there)."""
    import gc

    groups = batches(prompts, streams)
    t0 = time.perf_counter()
    timings, whole = {}, {}
    for role, folder in folders.items():
        model = load_model(folder, threads)
        for _ in range(2):  # warm-up, not recorded
            generate(model, groups[0], min(new_tokens, 4))
        ttft, steps, lengths, per_round = [], [], [], []
        for i in range(rounds):
            b = groups[i % len(groups)]
            start = time.perf_counter()
            t, s = generate(model, b, new_tokens)
            per_round.append((time.perf_counter() - start) * 1000.0)
            ttft.append(t)
            steps.extend(s)
            lengths.append(b.shape[1])
        timings[role] = _timing(ttft, steps, lengths, streams, new_tokens)
        whole[role] = np.asarray(per_round)
        del model
        gc.collect()  # the next model loads into what this one held
    ratios = {r: timing.ratio_ci(whole[baseline], whole[r]) for r in folders if r != baseline}
    widest = max((timing.rel_width(ci) for ci in ratios.values()), default=0.0)
    info = {"rounds": rounds, "seconds": round(time.perf_counter() - t0, 2),
            "noisy": bool(widest > rel_ci), "widest_rel_ci": widest, "one_at_a_time": True,
            f"speedup_vs_{baseline}": ratios}
    return timings, info
