"""The decoder recipe: a causal LM exported with a KV cache, weight-only quantized, gated on text.

decoder_export (FP32, the reference) -> score FP32 on the evaluation text -> the candidate(s):
quant=none: FP32; int8 / dynamic: every MatMul at ``quant.decoder.bits``; mixed: per-layer
widths searched under the gate's accuracy limits; auto: FP32, INT8 (at the configured block and
at ``WIDE_BLOCK``), INT4 and the mixed one,
every candidate scored and all timed side by side, the fastest that passes every gate ships ->
score the candidate against FP32 at accuracy level 0 -> time decode against FP32 -> gate.

The mixed search, in groups (each transformer block's MatMuls, and the output layer alone):
1. everything at 4 bits; if it passes the accuracy gate, it is the answer;
2. otherwise the groups are ordered by a proxy computed once (``pipeline.quant.sensitivity``:
   each MatMul's 4-bit rounding error weighted by its input channels' energy on a few
   calibration sequences, relative to its output; no model rebuilt). The output layer comes
   first whatever it scores (it is the largest and the most exposed weight), then the blocks,
   most sensitive first;
3. the shortest prefix of that order moved to 8 bits that passes (bisection over the prefix
   length: the loss falls as more groups widen); if all-8-bit still fails, the shortest prefix
   kept float on top of 8 bits.
Latency-aware: when INT4 everywhere is not faster than INT8 everywhere on this machine (the
lower bound of their speed ratio at or under 1), the search starts from 8 bits and 4 bits are
not used at all: a narrower layer that is not faster only costs accuracy.

In: the ``Config``, the ``Runner`` and the ``Decoder``. Out: ``DecoderOutcome`` (artifacts by
role, scores, timing, the verdict, the search's trials).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from pipeline.config import Config, QuantMode
from pipeline.core.env import effective_flags, environment
from pipeline.core.errors import ConfigError
from pipeline.metrics import generation
from pipeline.metrics import limits as metric_limits
from pipeline.task.contract import MetricsSpec
from pipeline.models.decoder import Decoder, enough_text, text_sets
from pipeline.recipes import decoder_memory
from pipeline.stages.decode_speed import DecodeSpeed
from pipeline.stages.decoder_export import DecoderExport
from pipeline.stages.decoder_stream import DecoderExportStream, WeightOnlyStream
from pipeline.stages.score_text import ScoreText
from pipeline.stages.weight_only import WeightOnly, matmuls

METRICS = MetricsSpec(tuple(generation.SPECS.values()), "perplexity_rise")
# MatMulNBits' int8-activation kernels (accuracy level 4): x86 from AVX2 up (VNNI and AMX make
# them faster still), Arm with the dot-product extension. Without them level 4 would fall back.
LEVEL4_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8", "asimddp")
OUTPUT_LAYER = "lm_head"
MODES = (QuantMode.none, QuantMode.int8, QuantMode.dynamic, QuantMode.mixed, QuantMode.auto)


@dataclass
class DecoderOutcome:
    models: dict                  # role -> Artifact (fp32, candidate, and auto's others)
    scores: dict                  # role -> score_text Artifact
    speed: object                 # decode_speed Artifact
    verdict: dict
    decoder: Decoder
    settings: dict                # resolved quantization settings, with the reasons
    search: list = field(default_factory=list)   # mixed: every trial (plan summary, scores)
    auto: dict | None = None      # quant=auto: every candidate's verdict and the choice


def check_mode(cfg: Config) -> None:
    if cfg.quant.mode not in MODES:
        raise ConfigError(f"quant={cfg.quant.mode.value}: a decoder is quantized weight-only; "
                          f"valid choices: {', '.join(m.value for m in MODES)} (int8 with "
                          "quant.decoder.bits=4 is INT4 everywhere)")
    if cfg.prune.method.value != "none":
        raise ConfigError("prune: a decoder is not pruned; run with prune=none")


def accuracy_level(q, flags: list[str] | None = None) -> tuple[int, str]:
    """MatMulNBits' accuracy level and why: the configured one, else 4 where this CPU has the
    int8 kernels, else 0 (float)."""
    if q.accuracy_level is not None:
        return q.accuracy_level, "set by quant.decoder.accuracy_level"
    flags = effective_flags() if flags is None else flags
    have = [f for f in LEVEL4_FLAGS if f in flags]
    if have:
        return 4, f"{'/'.join(have)}: MatMulNBits' int8-activation kernels"
    return 0, "no AVX2 or Arm dot product: float activations"


def groups(names: list[str]) -> dict[str, list[str]]:
    """MatMul nodes by transformer block (``layers.<i>``) and the output layer, in order."""
    out: dict[str, list[str]] = {}
    for n in names:
        m = re.search(r"layers\.(\d+)", n)
        key = f"layers.{m.group(1)}" if m else (OUTPUT_LAYER if OUTPUT_LAYER in n else "other")
        out.setdefault(key, []).append(n)
    return out


class _Run:
    """One decoder run's shared state: the stages' settings and the FP32 reference."""

    def __init__(self, cfg: Config, runner, decoder: Decoder):
        self.cfg, self.runner, self.decoder = cfg, runner, decoder
        self.q = cfg.quant.decoder
        self.hw = cfg.hardware.target()
        import json
        from pathlib import Path

        # the path, before any stage: FP32 past the memory budget streams (decoder_memory)
        self.memory = decoder_memory.plan(decoder, self.q)
        decoder_memory.check_streaming(cfg, self.memory)
        context = int(json.loads((Path(decoder.folder) / "config.json").read_text()).get(
            "max_position_embeddings", 2048))
        self.sets = text_sets(decoder, cfg.data, cfg.model.params, context, cfg.workdir,
                              self.q.ranking_sequences)
        enough_text(self.sets["evaluation"], metric_limits.limits(
            cfg.gate.max_accuracy_drop, METRICS).get("top1_agreement"),
            f"data.evaluation_samples={cfg.data.evaluation_samples}")
        self.level, self.level_reason = accuracy_level(self.q)
        if self.memory.streaming:  # self.fp32 is then the INT8 reference, self.source FP32
            self.source = runner.run(DecoderExportStream(decoder=decoder))
            ref = decoder_memory.reference_plan(matmuls(self.source.path))
            self.fp32 = self.runner.run(WeightOnlyStream(
                plan=tuple(sorted(ref.items())), block_size=decoder_memory.REFERENCE_BLOCK,
                symmetric=True, accuracy_level=self.level), self.source,
                label="weight_only_stream[reference]")
        else:
            self.fp32 = self.source = runner.run(DecoderExport(decoder=decoder,
                                                               data=self.sets["evaluation"]))
        self.score_stage = ScoreText(data=self.sets["evaluation"],
                                     threads=self.hw.intra_op_threads)
        self.scores = {"fp32": runner.run(self.score_stage, self.fp32, label="score_text[fp32]")}
        self.names = matmuls(self.source.path)
        self.groups = groups(self.names)
        self.trials: list[dict] = []

    def build(self, plan: dict[str, int], label: str, block_size: int | None = None):
        """The quantized folder for ``plan`` (node -> bits) and its scores against FP32, at
        ``block_size`` weights per scale (None: ``quant.decoder.block_size``)."""
        if self.memory.streaming:  # one weight at a time, round to nearest (check_streaming)
            stage = WeightOnlyStream(plan=tuple(sorted(plan.items())),
                                     block_size=block_size or self.q.block_size,
                                     symmetric=self.q.symmetric, accuracy_level=self.level)
            art = self.runner.run(stage, self.source, label=f"weight_only_stream[{label}]")
            return art, self.runner.run(self.score_stage, art, label=f"score_text[{label}]",
                                        reference=self.fp32)
        stage = WeightOnly(plan=tuple(sorted(plan.items())),
                           block_size=block_size or self.q.block_size,
                           symmetric=self.q.symmetric, algorithm=self.q.algorithm,
                           accuracy_level=self.level,
                           calibration=self.sets["calibration"] if self.q.algorithm == "gptq"
                           and 4 in plan.values() else None)
        art = self.runner.run(stage, self.fp32, label=f"weight_only[{label}]")
        scored = self.runner.run(self.score_stage, art, label=f"score_text[{label}]",
                                 reference=self.fp32)
        return art, scored

    def passes(self, scored) -> bool:
        return metric_limits.within(generation.REFERENCE, generation.gated(scored.meta),
                                    self.cfg.gate.max_accuracy_drop, METRICS)

    def uniform(self, bits: int) -> dict[str, int]:
        return {n: bits for n in self.names}

    def speed(self, candidates: dict):
        b = self.cfg.bench
        return self.runner.run(DecodeSpeed(
            data=self.sets["evaluation"], prompts=self.q.prompts,
            prompt_tokens=self.q.prompt_tokens, new_tokens=self.q.new_tokens,
            streams=self.q.streams, threads=self.hw.intra_op_threads,
            max_seconds=b.max_seconds, rel_ci=b.rel_ci, min_rounds=min(b.min_rounds, 30),
            hardware=self.hw, nonce=b.nonce), self.fp32, **candidates)

    # -- the mixed search ------------------------------------------------------------------------
    def mixed(self, int4_faster: bool = True):
        """The narrowest per-group plan that passes (``search``), built and scored."""
        built = {}

        def trial(plan: dict, what: str) -> bool:
            art, scored = self.build(plan, what.replace(" ", "_"))
            self._note(what, plan, scored)
            built[what] = art, scored
            return self.passes(scored)

        found = search(self.groups, 4 if int4_faster else 8, trial, self.sensitivity)
        # nothing passes, not even everything float at this accuracy level: the widest trial
        # goes to the gate, which says so
        return built[found or list(built)[-1]]

    def sensitivity(self) -> dict[str, float]:
        """Each group's proxy sensitivity to 4 bits, from the first ``ranking_sequences``
        calibration sequences (the evaluation's when there are none: a ranking, not a score)."""
        from pipeline.quant.sensitivity import group_scores, node_scores

        ids = self.sets["calibration"].token_ids()[:self.q.ranking_sequences] or \
            self.sets["ranking"].token_ids()
        scores = group_scores(node_scores(self.fp32.path, ids, self.q.block_size,
                                          self.hw.intra_op_threads), self.groups)
        top = sorted((g for g in scores if g != OUTPUT_LAYER), key=lambda g: -scores[g])[:3]
        self.trials.append({"trial": f"sensitivity proxy on {len(ids)} calibration sequences "
                            f"(most sensitive: {', '.join(top)})",
                            "widths": None, "ranking": True, "sequences": len(ids),
                            "passed": None, "sensitivity": {g: round(v, 6)
                                                            for g, v in scores.items()}})
        return scores

    def _note(self, what: str, plan, scored, ranking: bool = False) -> None:
        widths = None
        if plan is not None:
            widths = {"4": sum(b == 4 for b in plan.values()),
                      "8": sum(b == 8 for b in plan.values()),
                      "float": len(self.names) - len(plan)}
        self.trials.append({"trial": what, "widths": widths, "ranking": ranking,
                            **{k: scored.meta.get(k) for k in
                               ("perplexity", "perplexity_rise_pct", "top1_agreement", "kl_mean",
                                "sequences")},
                            "passed": None if ranking else self.passes(scored)})


def search(groups: dict[str, list[str]], base: int, trial, sensitivity) -> str | None:
    """The mixed search over ``groups`` (name -> MatMul nodes) from ``base`` bits. ``trial(plan,
    what)`` builds and scores a plan (node -> bits; absent: float) and says whether it passes;
    ``sensitivity()`` (group -> proxy, higher widens first; called only when the first plan
    fails) orders the blocks: only whole plans are built, about log2(groups) of them per phase. The answer is the
    ``what`` of the narrowest passing trial, None when none passes."""
    plan = {n: base for nodes in groups.values() for n in nodes}
    what = f"all at {base} bits"
    if trial(plan, what):
        return what
    blocks, proxy = [g for g in groups if g != OUTPUT_LAYER], sensitivity()
    order = ([OUTPUT_LAYER] if OUTPUT_LAYER in groups else []) + sorted(
        blocks, key=lambda g: -proxy.get(g, 0.0))
    for wider in ([8, None] if base == 4 else [None]):
        def step(k, start=dict(plan), wider=wider):
            p = dict(start)
            for g in order[:k]:
                for n in groups[g]:
                    if wider is None:
                        p.pop(n, None)
                    else:
                        p[n] = wider
            return p
        width = "float" if wider is None else f"{wider} bits"
        lo, hi, best = 1, len(order), None
        while lo <= hi:  # the smallest prefix that passes: the loss falls as groups widen
            k = (lo + hi) // 2
            what = f"first {k} of {len(order)} groups at {width}"
            if trial(step(k), what):
                best, hi = what, k - 1
            else:
                lo = k + 1
        if best is not None:
            return best
        plan = step(len(order))  # every group this wide: the next phase starts from here
    return None


def judge(cfg: Config, scored, speed, role: str = "candidate") -> dict:
    """The verdict in the encoders' shape: each judged metric against FP32 at level 0, the
    lower bound of the decode speedup's interval against FP32, the timing environment."""
    checks = []
    # FP32 is the reference: it scores as the reference does (no rise, full agreement)
    got = generation.REFERENCE if role == "fp32" else generation.gated(scored.meta)
    for r in metric_limits.judged(generation.REFERENCE, got,
                                  cfg.gate.max_accuracy_drop, METRICS):
        value = r["drop"]
        ok = isinstance(value, float) and math.isfinite(value) and value <= r["limit"] + 1e-9
        checks.append({"check": f"{r['metric']}_drop", "value": value if math.isfinite(value)
                       else None, "limit": r["limit"], "passed": ok,
                       "detail": f"{r['metric']} {r['candidate']:.3f} vs FP32 {r['reference']:.3f}"
                       f" ({r['scale']})" if ok or math.isfinite(value) else
                       f"{r['metric']}: no valid measurement (fails closed)"})
    sp = (speed.meta.get("speedup_vs_fp32") or {}).get(role) if role != "fp32" else \
        {"median": 1.0, "ci95": [1.0, 1.0]}
    lo = sp["ci95"][0] if sp else float("nan")
    checks.append({"check": "speedup_ci_low", "value": lo if math.isfinite(lo) else None,
                   "limit": cfg.gate.min_speedup,
                   "passed": bool(math.isfinite(lo) and lo >= cfg.gate.min_speedup),
                   "detail": (f"decode {sp['median']:.2f}x (95% CI {sp['ci95'][0]:.2f}-"
                              f"{sp['ci95'][1]:.2f}) vs FP32"
                              + (" [noisy]" if speed.meta.get("noisy") else "")) if sp else
                   "speedup_ci_low: no valid measurement (fails closed)"})
    from pipeline.core.env import differences

    diffs = differences(speed.meta.get("environment") or {}, environment(cfg.hardware.target()))
    checks.append({"check": "same_environment", "value": float(len(diffs)), "limit": 0,
                   "passed": not diffs, "detail": "timings taken in this environment" if not diffs
                   else "timings taken elsewhere: " + "; ".join(diffs[:3])})
    passed = all(c["passed"] for c in checks)
    return {"passed": passed, "checks": checks,
            "summary": "PASS" if passed else
            "FAIL: " + "; ".join(c["detail"] for c in checks if not c["passed"])}


def recipe(cfg: Config, runner, decoder: Decoder) -> DecoderOutcome:
    check_mode(cfg)
    run = _Run(cfg, runner, decoder)
    q, mode = run.q, cfg.quant.mode
    settings = {"accuracy_level": run.level, "accuracy_level_reason": run.level_reason,
                "block_size": q.block_size, "symmetric": q.symmetric, "algorithm": q.algorithm,
                "matmuls": len(run.names), "groups": list(run.groups),
                "memory": run.memory.as_dict(), "reference": run.memory.reference}
    models, scores = {"fp32": run.fp32}, dict(run.scores)
    if mode == QuantMode.auto:
        return _auto(cfg, run, settings)
    if mode == QuantMode.none:
        cand, cand_scores = run.fp32, run.scores["fp32"]
    elif mode == QuantMode.mixed:
        cand, cand_scores = run.mixed(_int4_faster(run))
    else:
        settings["bits"] = q.bits
        cand, cand_scores = run.build(run.uniform(q.bits), f"all{q.bits}")
    models["candidate"], scores["candidate"] = cand, cand_scores
    speed = run.speed({"candidate": cand} if cand is not run.fp32 else {})
    verdict = judge(cfg, cand_scores, speed, "candidate" if cand is not run.fp32 else "fp32")
    return DecoderOutcome(models, scores, speed, verdict, decoder, settings, run.trials)


def _int4_faster(run: _Run) -> bool:
    """INT4 everywhere against INT8 everywhere, timed side by side with FP32."""
    a4, _ = run.build(run.uniform(4), "all4")
    a8, _ = run.build(run.uniform(8), "all8")
    return int4_wins(run.speed({"int4": a4, "int8": a8}).meta["speedup_vs_fp32"])


def int4_wins(speedups: dict) -> bool:
    """INT4 counts as faster than INT8 when the lower bound of its speedup over FP32 is above
    INT8's median speedup: not faster by noise alone."""
    return speedups["int4"]["ci95"][0] > speedups["int8"]["median"]


# INT8 at a wider block, a candidate of quant=auto: MatMulNBits at accuracy level 4 quantizes
# the activations per block too, so a wider block means fewer per-block scalings and sums per
# product (the INT8 kernels are compute-bound here, at 66-71 % of the bandwidth bound), for a
# coarser activation grid. Bytes need not fall: SmolLM2's K=576 pads to 640 at block 128, which
# adds as many code bytes as the fewer scales save. There (2 cores, AMX), 8 bits at block 128
# decoded 1.09x faster than block 32 at 1 stream and 1.17x at 4 streams, at a perplexity rise
# of 1.4 % instead of 0.6 %: a trade only the gate can judge, on the user's text.
WIDE_BLOCK = 128


def _auto(cfg: Config, run: _Run, settings: dict) -> DecoderOutcome:
    """Every candidate scored, all timed in one interleaved run against FP32; the fastest that
    passes every gate ships (FP32 when none does and FP32 itself passes, as for encoders)."""
    built = {"int8": run.build(run.uniform(8), "all8"), "int4": run.build(run.uniform(4), "all4")}
    if run.q.block_size < WIDE_BLOCK:
        built["int8_wide"] = run.build(run.uniform(8), f"all8_b{WIDE_BLOCK}", WIDE_BLOCK)
    speed = run.speed({r: a for r, (a, _) in built.items()})
    sp = speed.meta["speedup_vs_fp32"]
    int4_faster = int4_wins(sp)
    mixed = run.mixed(int4_faster)
    if all(mixed[0].digest != a.digest for a, _ in built.values()):
        built["mixed"] = mixed
        speed = run.speed({r: a for r, (a, _) in built.items()})
    verdicts = {r: judge(cfg, s, speed, r) for r, (_, s) in built.items()}
    verdicts["fp32"] = judge(cfg, run.scores["fp32"], speed, "fp32")
    speedup = {r: (speed.meta["speedup_vs_fp32"].get(r) or {"median": 1.0})["median"]
               for r in verdicts}
    passing = [r for r in verdicts if verdicts[r]["passed"]]
    winner = max(passing, key=lambda r: speedup[r]) if passing else "fp32"
    models = {"fp32": run.fp32, **{r: a for r, (a, _) in built.items()}}
    scores = {**run.scores, **{r: s for r, (_, s) in built.items()}}
    models["candidate"], scores["candidate"] = models[winner], scores[winner]
    settings = {**settings, "int4_faster_than_int8": int4_faster,
                "block_size": WIDE_BLOCK if winner == "int8_wide" else settings["block_size"]}
    auto = {"winner": winner, "candidates": {r: {"passed": v["passed"], "speedup": speedup[r],
                                                 "summary": v["summary"]}
                                             for r, v in verdicts.items()},
            "why": (f"{winner}: the fastest of {', '.join(passing)} (all pass every gate)"
                    if passing else "no candidate passes, FP32 included: its verdict ships")}
    return DecoderOutcome(models, scores, speed, verdicts[winner], run.decoder, settings,
                          run.trials, auto)
