"""A decoder run's report body, typed: what report.json holds and report.md shows.

In: the config, the decoder recipe's ``Outcome`` and the run record (``DecoderReport.of``), or
a report.json body read back (``DecoderReport.read``: the publish flow re-renders report.md
from the body it updates). Out: frozen dataclasses read by field; ``json_record.to_json`` of a
``DecoderReport`` is report.json's body, the keys and values every earlier decoder run wrote.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pipeline.core.artifact import plain
from pipeline.core.env import environment
from pipeline.core.json_record import from_json, omitted
from pipeline.measure.decode_summary import NOT_TIMED, DecodeSummary
from pipeline.measure.decoder_meta import DecoderFolder
from pipeline.measure.results import NO_SCORES, DecodeResult, Role, Speedup, TextScores
from pipeline.recipes.decoder_record import DecoderAuto, DecoderSettings, ScoringCost, Trial
from pipeline.report.body import LineageEntry


@dataclass(frozen=True)
class ModelRow:
    """One model of the run: its weights, its scores against the reference, its decode."""
    role: Role
    digest: str
    weights_mb: float
    matmul_bits: dict[int, int] | None = None  # bits -> MatMuls (None: float)
    matmul_float: int | None = None
    perplexity: float | None = None
    perplexity_rise_pct: float | None = None
    top1_agreement: float | None = None   # a fraction
    kl_mean: float | None = None
    sequences: int | None = None
    sequences_total: int | None = None
    stopped: object = None                # why its sequential scoring stopped
    decode: DecodeSummary = NOT_TIMED
    speedup_vs_fp32: Speedup | None = None  # None: the reference itself


@dataclass(frozen=True)
class EvaluatedText:
    """How much text the gate's scores rest on: every model is scored on the same sequences."""
    sequences: int | None = None
    tokens_scored: int | None = None


@dataclass(frozen=True)
class Export:
    nodes: dict | None = None
    parity_vs_transformers: dict | None = None  # None: not checked (the streaming path)


@dataclass(frozen=True)
class Rounds:
    """How the decode timing went."""
    rounds: int | None = None
    seconds: float | None = None
    noisy: bool | None = None
    one_at_a_time: bool | None = None


@dataclass(frozen=True)
class CheckRow:
    check: str
    value: float | None
    limit: object
    passed: bool
    detail: str


@dataclass(frozen=True)
class VerdictBody:
    """``Verdict.as_dict`` read by field."""
    passed: bool = False
    checks: list[CheckRow] = field(default_factory=list)
    summary: str | None = None
    reference: str | None = None
    hint: str | None = omitted()
    served: dict | None = omitted()


@dataclass(frozen=True)
class DecoderReport:
    model: str
    quant: str
    status: str = "complete"
    kind: str = "decoder"
    config: dict | None = None
    environment: dict | None = None
    decoder: dict | None = None
    settings: DecoderSettings = field(default_factory=DecoderSettings)
    verdict: VerdictBody = field(default_factory=VerdictBody)
    rows: list[ModelRow] = field(default_factory=list)
    evaluation: EvaluatedText = field(default_factory=EvaluatedText)
    export: Export = field(default_factory=Export)
    timing: Rounds = field(default_factory=Rounds)
    search: list[Trial] = field(default_factory=list)
    auto: DecoderAuto | None = None
    scoring: ScoringCost | None = None
    stages: list | None = None
    lineage: dict[str, LineageEntry] | None = None
    # what the publish flow adds (pipeline.report.publish, pipeline.report.run)
    figures: dict | None = omitted()
    publish: dict | None = omitted()
    published: str | None = omitted()
    interrupted: dict | None = omitted()

    @classmethod
    def of(cls, cfg, out, record: list) -> DecoderReport:
        decode, fp32 = DecodeResult.of(out.bench), out.models[Role.fp32]
        export = DecoderFolder.of(fp32)
        return cls(cfg.model.name, cfg.quant.mode.value, config=plain(cfg),
                   environment=environment(cfg.hardware), decoder=plain(out.run),
                   settings=out.quant.settings,
                   verdict=from_json(VerdictBody, out.verdict.as_dict(), known_only=True),
                   rows=rows(out, decode), evaluation=evaluation(out),
                   export=Export(export.nodes, export.parity_vs_transformers),
                   timing=Rounds(decode.rounds, decode.seconds, decode.noisy,
                                 decode.one_at_a_time),
                   search=out.quant.trials, auto=out.auto, scoring=out.quant.scoring,
                   stages=record,
                   lineage={role: LineageEntry.of(a) for role, a in out.models.items()})

    @classmethod
    def read(cls, body: dict) -> DecoderReport:
        """A report.json body (as written, or as the publish flow updated it)."""
        return from_json(cls, body, known_only=True)

    def row(self, role: Role) -> ModelRow:
        return next(r for r in self.rows if r.role == role)


def _bytes(art) -> int:
    return sum(f.stat().st_size for f in Path(art.path).iterdir()
               if f.name.startswith("model.onnx"))


def rows(out, decode: DecodeResult) -> list[ModelRow]:
    """A row per model; the candidate that is one of the others (quant=auto's winner, or FP32
    itself) takes that one's timing."""
    seen, table = set(), []
    for role, art in out.models.items():
        if role == Role.candidate and art.digest in seen:
            same = next(r for r, a in out.models.items() if a.digest == art.digest and r != role)
        else:
            same = role
        seen.add(art.digest)
        s = TextScores.of(out.evals[role]) if role in out.evals else NO_SCORES
        t = decode.timings.get(role) or decode.timings.get(same) or (
            decode.timings.get(Role.fp32) if art is out.models[Role.fp32] else None) or NOT_TIMED
        folder = DecoderFolder.of(art)
        table.append(ModelRow(role, art.digest, _bytes(art) / 1e6, folder.matmul_bits,
                              folder.matmul_float, s.perplexity, s.perplexity_rise_pct,
                              s.top1_agreement, s.kl_mean, s.sequences, s.sequences_total,
                              s.stopped, t, decode.speedups.get(role) or
                              decode.speedups.get(same)))
    return table


def evaluation(out) -> EvaluatedText:
    ref = TextScores.of(out.evals[Role.fp32])
    return EvaluatedText(ref.sequences, ref.tokens_scored)
