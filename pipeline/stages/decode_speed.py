"""decode_speed: decoder candidates' generation timed against FP32's, side by side.

In: the FP32 folder (the parent), the candidates as references by role, prompts cut from the
evaluation text,
how many tokens to generate and how many streams decode together. Out: per model, time to first
token and per-token latency (p50/p99) and decode tokens/s (``pipeline.measure.decode``), and
each candidate's speedup over FP32 (median of per-round ratios of whole generations with its
95 % interval), measured in interleaved rounds until the interval is narrow or the time is up.
Timed: it runs alone on the machine (``pipeline.core.locks``).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class DecodeSpeed:
    data: object           # TextSet: the prompts come from the evaluation text
    prompts: int           # how many prompts (one generation each per round)
    prompt_tokens: int     # each prompt's length, at most
    new_tokens: int        # tokens generated per prompt
    streams: int           # sequences decoded together
    threads: int           # hardware.intra_op_threads
    max_seconds: float
    rel_ci: float
    min_rounds: int
    hardware: object       # HardwareRuntime: where it runs (its fingerprint keys the result)
    nonce: str = ""        # bench.nonce: a new measurement without a new model
    # models that do not fit in memory together (the streaming path) are timed one at a time
    one_at_a_time: bool = False
    name = "decode_speed"
    # 2: the order of models turns once per pass over the inputs (timing.interleaved)
    # 3: the stage's peak resident memory in its result
    # 4: one_at_a_time (models that do not fit together are timed in turn)
    version = 4
    hardware_dependent = True
    timed = True

    def run(self, parent, out_dir: Path, **candidates) -> dict:
        from pipeline.core.env import environment
        from pipeline.measure.decode import compare_generation
        from pipeline.core.env import peak_rss_mb

        prompts = [ids[:self.prompt_tokens] for ids in self.data.token_ids()[:self.prompts]]
        folders = {"fp32": parent.path, **{r: a.path for r, a in sorted(candidates.items())}}
        timings, info = compare_generation(folders, prompts, new_tokens=self.new_tokens,
                                           streams=self.streams, threads=self.threads,
                                           min_rounds=self.min_rounds,
                                           max_seconds=self.max_seconds, rel_ci=self.rel_ci,
                                           one_at_a_time=self.one_at_a_time)
        return {"timings": {r: t.summary() for r, t in timings.items()},
                "speedup_vs_fp32": info.get("speedup_vs_fp32", {}),
                "rounds": info.get("rounds"), "seconds": info.get("seconds"),
                "noisy": info.get("noisy"), "one_at_a_time": self.one_at_a_time,
                "environment": environment(self.hardware),
                "peak_rss_mb": peak_rss_mb()}
