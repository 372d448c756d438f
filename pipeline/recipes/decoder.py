"""The decoder recipe: a causal LM exported with a KV cache, weight-only quantized, gated on text.

decoder_export (FP32, the reference) -> text_reference (FP32 scored once on the evaluation
text; every candidate is scored against its summary) -> the candidate(s): quant=none: FP32;
int8 / dynamic: every MatMul at ``quant.decoder.bits``; mixed: per-layer widths searched under
the gate's accuracy limits; auto: FP32, INT8 (at the configured block and at ``WIDE_BLOCK``),
INT4 and the mixed one (where it can win), every candidate scored and all timed side by side,
the fastest that passes every gate ships -> time decode against FP32 -> gate. Search candidates
are scored sequentially (``quant.decoder.score``: each stops once its verdict is clear); the
candidate the gate judges is scored on every sequence.

The mixed search, in groups (each transformer block's MatMuls, and the output layer alone):
1. everything at 4 bits; if it passes the accuracy gate, it is the answer;
2. otherwise the groups are ordered by a proxy computed once (``pipeline.quant.sensitivity``:
   each MatMul's 4-bit rounding error weighted by its input channels' energy on a few
   calibration sequences, relative to its output; no model rebuilt). The output layer comes
   first whatever it scores (it is the largest and the most exposed weight), then the blocks,
   most sensitive first;
3. the shortest prefix of that order moved to 8 bits that passes (bisection over the prefix
   length: the loss falls as more groups widen); if all-8-bit still fails, the shortest prefix
   kept float on top of 8 bits. In auto, the 8-bit nodes take the block that won for all-INT8,
   and the search is not started, or stops, once it cannot beat a candidate that passes.
Latency-aware: when INT4 everywhere is not faster than INT8 everywhere on this machine (the
lower bound of their speed ratio at or under 1), the search starts from 8 bits and 4 bits are
not used at all: a narrower layer that is not faster only costs accuracy.

In: the ``Config``, the ``Runner`` and the ``Decoder``. Out: the one ``Outcome`` every recipe
returns (artifacts by role, their text scores as evaluations, the decode timing as the
benchmark, the verdict of the one gate, ``WeightOnlyInfo``: the settings, the search's trials
and what scoring cost; quant=auto's ``DecoderAuto``: ``pipeline.recipes.decoder_record``).
"""
from __future__ import annotations

import re
from dataclasses import replace

from pipeline import gate
from pipeline.config import Config, QuantMode
from pipeline.core.env import effective_flags, environment
from pipeline.core.errors import ConfigError
from pipeline.gate.outcome import Outcome
from pipeline.metrics import generation
from pipeline.measure.decoder_meta import ReferenceText
from pipeline.measure.results import ONE, DecodeResult, Role, Speedup, TextScores
from pipeline.metrics import limits as metric_limits
from pipeline.task.contract import MetricsSpec
from pipeline.models.decoder import Decoder, context, enough_text, text_sets
from pipeline.recipes import decoder_memory
from pipeline.recipes.decoder_record import (AutoCandidate, DecoderAuto, DecoderSettings, PeakRss,
                                             ReferenceCost, ScoringCost, Trial, WeightOnlyInfo,
                                             Widths)
from pipeline.stages.decode_speed import DecodeSpeed
from pipeline.stages.decoder_export import DecoderExport
from pipeline.stages.decoder_stream import DecoderExportStream, WeightOnlyStream
from pipeline.stages.score_text import ScoreText
from pipeline.stages.text_reference import TextReference
from pipeline.stages.weight_only import WeightOnly, matmul_weights, matmuls

METRICS = MetricsSpec(tuple(generation.SPECS.values()), "perplexity_rise")
# MatMulNBits' int8-activation kernels (accuracy level 4): x86 from AVX2 up (VNNI and AMX make
# them faster still), Arm with the dot-product extension. Without them level 4 would fall back.
LEVEL4_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8", "asimddp")
OUTPUT_LAYER = "lm_head"
MODES = (QuantMode.none, QuantMode.int8, QuantMode.dynamic, QuantMode.mixed, QuantMode.auto)


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


# Decode timing's floor of interleaved rounds. A round is one whole generation per model (seconds
# at 0.5 B, not an encoder's milliseconds), so bench.min_rounds (200, sized for batches) is capped:
# 10 paired ratios give the median's interval, and timing goes on past them while that interval is
# wider than bench.rel_ci, up to bench.max_seconds. (A floor of 30 made decode timing the largest
# stage of a 0.5 B quant=auto run: 120 generations of FP32 and three candidates.)
DECODE_MIN_ROUNDS = 10

class _Run:
    """One decoder run's shared state: the stages' settings and the FP32 reference."""

    def __init__(self, cfg: Config, runner, decoder: Decoder):
        self.cfg, self.runner, self.decoder = cfg, runner, decoder
        self.q = cfg.quant.decoder
        self.hw = cfg.hardware.target()
        # the path, before any stage: FP32 past the memory budget streams (decoder_memory)
        self.memory = decoder_memory.plan(decoder, self.q)
        decoder_memory.check_streaming(cfg, self.memory)
        self.sets = text_sets(decoder, cfg.data, cfg.model.params, context(decoder), cfg.workdir,
                              self.q.ranking_sequences)
        enough_text(self.sets.evaluation, metric_limits.limits(
            cfg.gate.max_accuracy_drop, METRICS).get("top1_agreement"),
            f"data.evaluation_samples={cfg.data.evaluation_samples}")
        self.level, self.level_reason = accuracy_level(self.q)
        self.used: list[tuple[str, object]] = []  # (label, artifact) of every stage called
        if self.memory.streaming:  # self.fp32 is then the INT8 reference, self.source FP32
            self.source = self.run(DecoderExportStream(decoder=decoder), None,
                                   "decoder_export_stream")
            ref = decoder_memory.reference_plan(matmuls(self.source.path))
            self.fp32 = self.run(WeightOnlyStream(
                plan=tuple(sorted(ref.items())), block_size=decoder_memory.REFERENCE_BLOCK,
                symmetric=True, accuracy_level=self.level), self.source,
                "weight_only_stream[reference]")
        else:
            self.fp32 = self.source = self.run(DecoderExport(decoder=decoder,
                                                             data=self.sets.evaluation),
                                               None, "decoder_export")
        # the reference scored once on the text: its perplexity, and what every candidate is
        # scored against
        self.reference = self.run(TextReference(data=self.sets.evaluation,
                                                threads=self.hw.intra_op_threads),
                                  self.fp32, "text_reference[fp32]")
        self.scores = {Role.fp32: self.reference}
        self.limits = tuple(metric_limits.limits(cfg.gate.max_accuracy_drop, METRICS).items())
        self.names = matmuls(self.source.path)
        self.groups = groups(self.names)
        self.trials: list[Trial] = []
        self.scored: dict[str, object] = {}  # digest -> every score_text of this run

    def build(self, plan: dict[str, int], label: str, block_size: int | None = None,
              block_size_8: int | None = None, full: bool = False, scored: bool = True):
        """The quantized folder for ``plan`` (node -> bits) and its scores against FP32, at
        ``block_size`` weights per scale (None: ``quant.decoder.block_size``; the 8-bit nodes at
        ``block_size_8`` when given); scored in full or as ``quant.decoder.score`` says (not
        at all when not ``scored``: built only to be timed)."""
        block = block_size or self.q.block_size
        if block_size_8 and set(plan.values()) == {8}:  # all 8 bits: all-INT8 at that block
            block, block_size_8 = block_size_8, None
        if self.memory.streaming:  # one weight at a time, round to nearest (check_streaming)
            stage = WeightOnlyStream(plan=tuple(sorted(plan.items())), block_size=block,
                                     symmetric=self.q.symmetric, accuracy_level=self.level)
            art = self.run(stage, self.source, f"weight_only_stream[{label}]")
            return art, (self.score(art, label, full) if scored else None)
        stage = WeightOnly(plan=tuple(sorted(plan.items())), block_size=block,
                           symmetric=self.q.symmetric, algorithm=self.q.algorithm,
                           accuracy_level=self.level,
                           calibration=self.sets.calibration if self.q.algorithm == "gptq"
                           and 4 in plan.values() else None,
                           # a plan without 8-bit nodes is the same model at any 8-bit block
                           block_size_8=block_size_8 if block_size_8 not in (None, block)
                           and 8 in plan.values() else None)
        art = self.run(stage, self.fp32, f"weight_only[{label}]")
        return art, (self.score(art, label, full) if scored else None)

    def score(self, art, label: str, full: bool = False):
        """``art`` scored against the reference: every sequence when ``full`` (what the gate
        judges) or ``quant.decoder.score=full``, else sequentially under the gate's limits."""
        seq = not full and self.q.score == "sequential"
        stage = ScoreText(data=self.sets.evaluation, threads=self.hw.intra_op_threads,
                          mode="sequential" if seq else "full",
                          limits=self.limits if seq else (),
                          min_sequences=self.q.score_min_sequences if seq else 0)
        scored = self.run(stage, art, f"score_text[{label}{'' if seq else ', full'}]",
                          reference=self.reference)
        self.scored[scored.digest] = scored
        return scored

    def run(self, stage, parent, label: str, **refs):
        art = self.runner.run(stage, parent, label=label, **refs)
        self.used.append((label, art))
        return art

    def peak_rss(self) -> PeakRss:
        """The largest peak resident memory of a stage this run used (each stage runs in a child
        of its own and records its peak; a reused one, that of the run that built it), and the
        pipeline's own process."""
        from pipeline.core.env import peak_rss_mb

        label, mb = max(((lb, a.meta.get("peak_rss_mb") or 0.0) for lb, a in self.used),
                        key=lambda x: x[1], default=("-", 0.0))
        return PeakRss(round(mb, 1), label, round(peak_rss_mb(), 1))

    def tally(self) -> ScoringCost:
        """What scoring cost this run, against one full pass of the text (the reference's)."""
        scores = [TextScores.of(a) for a in self.scored.values()]
        ref, top = TextScores.of(self.reference), ReferenceText.of(self.reference)
        tokens = sum(x.tokens_scored or 0 for x in scores)
        return ScoringCost(
            ReferenceCost(ref.sequences, ref.tokens_scored, top.top_k, top.tail_mass_mean),
            candidate_scorings=len(scores),
            stopped_early=sum(x.sequences != x.sequences_total for x in scores),
            sequences=sum(x.sequences or 0 for x in scores), tokens=tokens,
            full_passes=round(tokens / (ref.tokens_scored or 1), 2), peak_rss=self.peak_rss())

    def matmul_weights(self) -> dict[str, int]:
        return matmul_weights(self.fp32.path)

    def passes(self, scored) -> bool:
        return metric_limits.within(generation.REFERENCE, generation.gated(scored.meta),
                                    self.cfg.gate.max_accuracy_drop, METRICS)

    def uniform(self, bits: int) -> dict[str, int]:
        return {n: bits for n in self.names}

    def speed(self, candidates: dict):
        b = self.cfg.bench
        return self.run(DecodeSpeed(
            data=self.sets.evaluation, prompts=self.q.prompts,
            prompt_tokens=self.q.prompt_tokens, new_tokens=self.q.new_tokens,
            streams=self.q.streams, threads=self.hw.intra_op_threads,
            max_seconds=b.max_seconds, rel_ci=b.rel_ci,
            min_rounds=min(b.min_rounds, DECODE_MIN_ROUNDS),
            hardware=self.hw, nonce=b.nonce,
            # past the memory budget the reference and a candidate do not fit together
            one_at_a_time=self.memory.streaming), self.fp32, "decode_speed", **candidates)

    # -- the mixed search ------------------------------------------------------------------------
    def mixed(self, int4_faster: bool = True, block_size_8: int | None = None, hopeless=None):
        """The narrowest per-group plan that passes (``search``), built, its trials scored as
        ``quant.decoder.score`` says, the answer scored in full for the gate. The 8-bit nodes at
        ``block_size_8`` (None: ``quant.decoder.block_size``). ``hopeless(plan)``: a reason to
        stop before building ``plan`` (auto: it cannot beat a candidate that already passes);
        then the answer is None when no trial passed before the stop."""
        built, stopped = {}, []

        def trial(plan: dict, what: str) -> bool:
            art, scored = self.build(plan, what.replace(" ", "_"), block_size_8=block_size_8)
            self._note(what, plan, scored)
            built[what] = art, scored
            return self.passes(scored)

        def stop(plan: dict):
            why = hopeless(plan) if hopeless else None
            if why:
                stopped.append(why)
                self.trials.append(Trial(f"stopped: {why}", ranking=True, search_stopped=True))
            return bool(why)

        found = search(self.groups, 4 if int4_faster else 8, trial, self.sensitivity, stop)
        if found is None and stopped:
            return None
        # nothing passes, not even everything float at this accuracy level: the widest trial
        # goes to the gate, which says so
        art, _ = built[found or list(built)[-1]]
        return art, self.score(art, (found or list(built)[-1]).replace(" ", "_"), full=True)

    def sensitivity(self) -> dict[str, float]:
        """Each group's proxy sensitivity to 4 bits, from the first ``ranking_sequences``
        calibration sequences (the evaluation's when there are none: a ranking, not a score)."""
        from pipeline.quant.sensitivity import group_scores, node_scores

        ids = self.sets.calibration.token_ids()[:self.q.ranking_sequences] or \
            self.sets.ranking.token_ids()
        scores = group_scores(node_scores(self.fp32.path, ids, self.q.block_size,
                                          self.hw.intra_op_threads), self.groups)
        top = sorted((g for g in scores if g != OUTPUT_LAYER), key=lambda g: -scores[g])[:3]
        self.trials.append(Trial(f"sensitivity proxy on {len(ids)} calibration sequences "
                                 f"(most sensitive: {', '.join(top)})", ranking=True,
                                 proxy_sequences=len(ids),
                                 sensitivity={g: round(v, 6) for g, v in scores.items()}))
        return scores

    def _note(self, what: str, plan, scored, ranking: bool = False) -> None:
        widths = None
        if plan is not None:
            widths = Widths(sum(b == 4 for b in plan.values()), sum(b == 8 for b in plan.values()),
                            len(self.names) - len(plan))
        self.trials.append(Trial(what, widths, ranking, TextScores.of(scored),
                                 None if ranking else self.passes(scored)))


def search(groups: dict[str, list[str]], base: int, trial, sensitivity,
           hopeless=None) -> str | None:
    """The mixed search over ``groups`` (name -> MatMul nodes) from ``base`` bits. ``trial(plan,
    what)`` builds and scores a plan (node -> bits; absent: float) and says whether it passes;
    ``sensitivity()`` (group -> proxy, higher widens first; called only when the first plan
    fails) orders the blocks: only whole plans are built, about log2(groups) of them per phase.
    ``hopeless(plan)`` (optional) is asked before each bisection step about the narrowest plan
    still possible (the fastest answer left): true stops the search there. The answer is the
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
            if hopeless is not None and hopeless(step(lo)):
                return best
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


def judge(cfg: Config, scored, speed, role: str = Role.candidate, reference: str = "FP32"):
    """The one gate (``pipeline.gate.judge``) on a decoder's measures: each judged metric
    against the reference at level 0, the lower bound of the decode speedup's interval against
    it, the timing environment. ``reference``: what the text was scored and the decode timed
    against (FP32, or the INT8 reference on the streaming path), named in every detail."""
    got = {} if role == Role.fp32 else generation.gated(scored.meta)  # the reference: itself
    m = gate.decode_measures(got, DecodeResult.of(speed), role, cfg.gate, reference)
    return gate.judge(m, cfg.gate, METRICS, environment=environment(cfg.hardware.target()))


def recipe(cfg: Config, runner, decoder: Decoder) -> Outcome:
    check_mode(cfg)
    run = _Run(cfg, runner, decoder)
    q, mode = run.q, cfg.quant.mode
    settings = DecoderSettings(run.level, run.level_reason, q.block_size, q.symmetric,
                               q.algorithm, len(run.names), list(run.groups), run.memory,
                               run.memory.reference)
    models, scores = {Role.fp32: run.fp32}, dict(run.scores)
    if mode == QuantMode.auto:
        return _auto(cfg, run, settings)
    if mode == QuantMode.none:
        cand, cand_scores = run.fp32, run.scores[Role.fp32]
    elif mode == QuantMode.mixed:
        cand, cand_scores = run.mixed(_int4_faster(run))
    else:
        settings = replace(settings, bits=q.bits)
        cand, cand_scores = run.build(run.uniform(q.bits), f"all{q.bits}", full=True)
    models[Role.candidate], scores[Role.candidate] = cand, cand_scores
    speed = run.speed({Role.candidate: cand} if cand is not run.fp32 else {})
    verdict = judge(cfg, cand_scores, speed, Role.candidate if cand is not run.fp32 else Role.fp32,
                    run.memory.reference_name)
    return Outcome(decoder, models, scores, speed, verdict, run.source,
                   quant=WeightOnlyInfo(settings, run.trials, run.tally()))


def _int4_faster(run: _Run) -> bool:
    """INT4 everywhere against INT8 everywhere, timed side by side with FP32."""
    a4, _ = run.build(run.uniform(4), "all4", scored=False)
    a8, _ = run.build(run.uniform(8), "all8", scored=False)
    return int4_wins(DecodeResult.of(run.speed({Role.int4: a4, Role.int8: a8})).speedups)


def int4_wins(speedups: dict[str, Speedup]) -> bool:
    """INT4 counts as faster than INT8 when the lower bound of its speedup over FP32 is above
    INT8's median speedup: not faster by noise alone."""
    return speedups[Role.int4].low > speedups[Role.int8].median


# INT8 at a wider block, a candidate of quant=auto: MatMulNBits at accuracy level 4 quantizes
# the activations per block too, so a wider block means fewer per-block scalings and sums per
# product (the INT8 kernels are compute-bound here, at 66-71 % of the bandwidth bound), for a
# coarser activation grid. Bytes need not fall: SmolLM2's K=576 pads to 640 at block 128, which
# adds as many code bytes as the fewer scales save. There (2 cores, AMX), 8 bits at block 128
# decoded 1.09x faster than block 32 at 1 stream and 1.17x at 4 streams, at a perplexity rise
# of 1.4 % instead of 0.6 %: a trade only the gate can judge, on the user's text.
WIDE_BLOCK = 128


def _auto(cfg: Config, run: _Run, settings: DecoderSettings) -> Outcome:
    """Every candidate scored (sequentially by default), all timed in one interleaved run
    against FP32; the fastest that passes every gate, scored again in full, ships (the next
    fastest when the full text fails it; FP32 when none passes and FP32 itself does, as for
    encoders). The mixed candidate's 8-bit part takes all-INT8's winning block, and the search
    is not started, or stops, once it cannot beat a candidate that already passes."""
    built = {Role.int8: run.build(run.uniform(8), "all8"),
             Role.int4: run.build(run.uniform(4), "all4")}
    if run.q.block_size < WIDE_BLOCK:
        built[Role.int8_wide] = run.build(run.uniform(8), f"all8_b{WIDE_BLOCK}", WIDE_BLOCK)
    speed = run.speed({r: a for r, (a, _) in built.items()})
    sp = DecodeResult.of(speed).speedups
    int4_faster = int4_wins(sp)

    def passing(verdicts):
        return sorted((r for r in verdicts if verdicts[r].passed and r != Role.fp32),
                      key=lambda r: -sp[r].median)

    verdicts = {r: judge(cfg, s, speed, r, run.memory.reference_name)
                for r, (_, s) in built.items()}
    eight = next((r for r in passing(verdicts) if r.startswith(Role.int8)), Role.int8)
    block_8 = WIDE_BLOCK if eight == Role.int8_wide else run.q.block_size
    best = next(iter(passing(verdicts)), None)
    mixed_note = None
    if best is not None:  # a blend of INT4 and all-INT8 at its block, at best the faster one
        int4_hi = sp[Role.int4].high
        if best == Role.int4:
            mixed_note = "not started: INT4 everywhere passes, no mix is narrower"
        elif not int4_faster:
            mixed_note = (f"not started: INT4 is not faster than INT8 here, so the mix would "
                          f"start from {eight} everywhere, which passes already")
        elif sp[best].median >= int4_hi:
            mixed_note = (f"not started: at best as fast as INT4 everywhere ({int4_hi:.2f}x, "
                          f"its upper bound), {best} already passes at {sp[best].median:.2f}x")
    if mixed_note is None:
        hopeless = _cannot_beat(run, sp, eight, best)
        mixed = run.mixed(int4_faster, block_8, hopeless)
        if mixed is None:  # stopped before any plan passed
            mixed_note = next(t.trial for t in reversed(run.trials) if t.search_stopped)
        elif all(mixed[0].digest != a.digest for a, _ in built.values()):
            built[Role.mixed] = mixed
            speed = run.speed({r: a for r, (a, _) in built.items()})
            sp = DecodeResult.of(speed).speedups
            verdicts = {r: judge(cfg, s, speed, r, run.memory.reference_name)
                for r, (_, s) in built.items()}
    scores = {**run.scores, **{r: s for r, (_, s) in built.items()}}
    verdicts[Role.fp32] = judge(cfg, run.scores[Role.fp32], speed, Role.fp32,
                                run.memory.reference_name)
    winner, rescored = Role.fp32, []
    for r in passing(verdicts):  # the fastest first: its verdict on the full text decides
        scores[r] = run.score(built[r][0], r, full=True)
        verdicts[r] = judge(cfg, scores[r], speed, r, run.memory.reference_name)
        rescored.append(r)
        if verdicts[r].passed:
            winner = r
            break
    models = {Role.fp32: run.fp32, **{r: a for r, (a, _) in built.items()}}
    models[Role.candidate], scores[Role.candidate] = models[winner], scores[winner]
    settings = replace(settings, int4_faster_than_int8=int4_faster, block_size_8_mixed=block_8,
                       block_size=WIDE_BLOCK if winner == Role.int8_wide else settings.block_size)
    ok = [r for r in verdicts if verdicts[r].passed]
    auto = DecoderAuto(
        winner, {r: _candidate(v, sp.get(r) or ONE, TextScores.of(scores[r]))
                 for r, v in verdicts.items()}, mixed_note, rescored,
        (f"{winner}: the fastest of {', '.join(ok)} (all pass every gate; "
         f"{winner} scored on every sequence)" if winner != Role.fp32 else
         "no candidate passes on the full text: FP32's verdict ships"))
    return Outcome(run.decoder, models, scores, speed, verdicts[winner], run.source,
                   quant=WeightOnlyInfo(settings, run.trials, run.tally()), auto=auto)


def _candidate(verdict, speedup: Speedup, scores: TextScores) -> AutoCandidate:
    return AutoCandidate(verdict.passed, speedup.median, verdict.summary, scores.sequences,
                         scores.stopped)


def _cannot_beat(run: _Run, sp: dict[str, Speedup], eight: str, best: str | None):
    """``hopeless(plan)`` for the mixed search: the plan's decode speedup predicted from INT4's
    and all-INT8's (``eight``) upper bounds by its MatMuls' weight shares (decode reads every
    weight once a token, so its time is the FP32 remainder plus each width's share of the
    weights' time), against the best passing candidate's median; None when none passes yet."""
    if best is None:
        return None
    weights = run.matmul_weights()
    total = sum(weights.values()) or 1

    def hopeless(plan: dict) -> str | None:
        share = {b: sum(w for n, w in weights.items() if plan.get(n) == b) / total
                 for b in (4, 8)}
        time = (share[4] / sp[Role.int4].high + share[8] / sp[eight].high
                + (1 - share[4] - share[8]))  # in FP32's decode times; float parts at 1x
        if 1 / time <= sp[best].median:
            return (f"the narrowest plan left ({round(100 * share[4])} % of weights at 4 bits) "
                    f"decodes at most about {1 / time:.2f}x, {best} passes at "
                    f"{sp[best].median:.2f}x")
        return None
    return hopeless
