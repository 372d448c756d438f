"""What the decoder recipe records beside its artifacts, typed: the resolved quantization
settings, the mixed search's trials, what scoring cost, and quant=auto's choice.

In: the values ``pipeline.recipes.decoder`` computes. Out: frozen dataclasses that the recipe
returns in its ``Outcome`` (``quant``: ``WeightOnlyInfo`` with ``DecoderSettings``, ``Trial``
and ``ScoringCost``; ``auto``: ``DecoderAuto``) and that the decoder's report reads by field.
Their JSON (``pipeline.core.json_record``: a field's name is its key) is what report.json has
always held: keys that only some records carry (the INT8 width of quant=int8, auto's extra
settings, a trial's scores) are left out when absent.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.core.json_record import inline, key, omitted
from pipeline.measure.results import Role, TextScores
from pipeline.recipes.decoder_memory import MemoryPlan


@dataclass(frozen=True)
class DecoderSettings:
    accuracy_level: int | None = None     # MatMulNBits' compute type
    accuracy_level_reason: str | None = None
    block_size: int | None = None         # the candidate's: auto's winner's block
    symmetric: bool | None = None
    algorithm: str | None = None          # for the 4-bit nodes
    matmuls: int | None = None
    groups: list[str] = field(default_factory=list)  # the mixed search's groups, in order
    memory: MemoryPlan | None = None
    reference: str | None = None          # what candidates are scored and timed against
    bits: int | None = omitted()          # quant=int8 / dynamic: the one width everywhere
    int4_faster_than_int8: bool | None = omitted()  # quant=auto
    block_size_8_mixed: int | None = omitted()      # quant=auto: the mix's 8-bit block


@dataclass(frozen=True)
class Widths:
    """How many MatMuls a plan puts at each width."""
    four: int = key("4")
    eight: int = key("8")
    float_: int = key("float")


@dataclass(frozen=True)
class Trial:
    """One step of the mixed search: a plan built and scored, the proxy's ranking, or the
    search stopping."""
    trial: str                            # what was tried, in words
    widths: Widths | None = None          # None: not a plan
    ranking: bool = False                 # the proxy's ranking, or a stop: no verdict
    scores: TextScores | None = inline()  # the plan's scores against the reference
    passed: bool | None = None
    proxy_sequences: int | None = omitted(name="sequences")  # the calibration sequences read
    sensitivity: dict | None = omitted()  # the proxy: group -> score
    search_stopped: bool | None = omitted()


@dataclass(frozen=True)
class ReferenceCost:
    sequences: int | None = None
    tokens: int | None = None
    top_k: int | None = None
    tail_mass_mean: float | None = None


@dataclass(frozen=True)
class PeakRss:
    stage_mb: float | None = None         # the largest of the stages the run used
    stage: str | None = None              # which one
    pipeline_mb: float | None = None      # the pipeline's own process


@dataclass(frozen=True)
class ScoringCost:
    """What scoring cost a run, against one full pass of the text (the reference's)."""
    reference: ReferenceCost | None = None
    candidate_scorings: int | None = None
    stopped_early: int | None = None
    sequences: int | None = None
    tokens: int | None = None
    full_passes: float | None = None
    peak_rss: PeakRss | None = None


@dataclass(frozen=True)
class WeightOnlyInfo:
    """A decoder's quantization record (``Outcome.quant``)."""
    settings: DecoderSettings
    trials: list[Trial] = field(default_factory=list)
    scoring: ScoringCost | None = None


@dataclass(frozen=True)
class AutoCandidate:
    passed: bool | None = None
    speedup: float | None = None          # median decode speedup over the reference
    summary: str | None = None            # its verdict in one line
    sequences: int | None = None          # scored (fewer when its scoring stopped early)
    stopped: str | None = None            # why its scoring stopped


@dataclass(frozen=True)
class DecoderAuto:
    """quant=auto on a decoder: every candidate's verdict, the winner and why."""
    winner: Role | None = None
    candidates: dict[Role, AutoCandidate] = field(default_factory=dict)
    mixed: str | None = None              # why the mix was not started or stopped (None: ran)
    scored_in_full: list[Role] = field(default_factory=list)
    why: str | None = None
