"""Typed results: what an evaluation and a benchmark measured, read once from their stage's meta.

In: an evaluate artifact, a benchmark (or decode_speed) artifact. Out: ``Evaluation``,
``BenchResult`` (one ``Timing`` per batch size, seen from one label) and ``Speedup``, frozen
dataclasses that the gate, the recipes' shared tail and the reports read by field. The names of
the roles an artifact plays in a run are the ``Role`` enum. A measurement the stage did not
record (a batch that was not timed, an A/A check that did not run) is ``None`` here, and the
gate fails its check closed naming it; a meta that is not a stage's meta at all (a renamed key
inside a recorded measurement) raises, as the bug it is. The stages themselves still write
plain JSON (``artifact.json`` is the cache's record, read back by older runs too): this module
is the one place that knows its keys.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum


class Role(str, Enum):
    """What an artifact is to a run. A ``str`` enum: the JSON of reports and manifests, and
    the benchmark's labels, keep the plain names (``Role.candidate == "candidate"``)."""
    export = "export"        # the graph as exported (or the ONNX file as given)
    fp32 = "fp32"            # the optimized FP32 model: the float baseline, the decoder's reference
    fp16 = "fp16"            # the FP16 baseline: the encoders' accuracy reference
    candidate = "candidate"  # what the gate judges and the registry receives
    dynamic = "dynamic"      # quant=auto: dynamic INT8
    mixed = "mixed"          # quant=auto: the mixed-precision search's answer
    int8 = "int8"            # decoders' quant=auto: 8 bits everywhere
    int8_wide = "int8_wide"  # ... at the wide block
    int4 = "int4"            # ... 4 bits everywhere

    def __str__(self) -> str:  # f-strings and labels read the plain name
        return self.value


@dataclass(frozen=True)
class Speedup:
    """A speed ratio with its 95 % interval (``pipeline.measure.timing.ratio_ci``)."""
    median: float
    low: float
    high: float

    @classmethod
    def of(cls, d: dict | None) -> Speedup | None:
        """None when not measured (absent or empty)."""
        if not d:
            return None
        return cls(float(d["median"]), float(d["ci95"][0]), float(d["ci95"][1]))

    def text(self) -> str:
        return f"{self.median:.2f}x (95% CI {self.low:.2f}-{self.high:.2f})"

    # the shape every stage and report writes (``pipeline.core.json_record`` uses these)
    from_json = of

    def to_json(self) -> dict:
        return {"median": self.median, "ci95": [self.low, self.high]}


ONE = Speedup(1.0, 1.0, 1.0)  # a model against itself


@dataclass(frozen=True)
class Latency:
    """One label's latency at one batch size (``pipeline.measure.timing``), in ms."""
    p50: float | None
    p99: float | None
    p999: float | None = None
    throughput: float | None = None  # items per second at that batch

    @classmethod
    def of(cls, d: dict) -> Latency:
        return cls(d.get("p50"), d.get("p99"), d.get("p999"), d.get("throughput"))


@dataclass(frozen=True)
class Timing:
    """One batch size of a benchmark, for the label timed as the candidate."""
    speedup: Speedup | None          # over the fastest float baseline
    fastest_float: str | None
    noisy: bool = False
    worst_state_ns: float | None = None  # the host moved the vCPUs: the worst placement's round trip
    aa_median: float | None = None   # FP32 timed against itself
    aa_tolerance: float | None = None
    p50_ms: float | None = None
    p99_ms: float | None = None
    over: dict = field(default_factory=dict)  # label -> Speedup of the candidate over it
    problems: tuple[str, ...] = ()   # numbers no measurement produces (pipeline.measure.sanity)
    label: str | None = None         # the benchmark label timed as the candidate (quant=auto)
    latencies: dict = field(default_factory=dict)  # every timed label -> Latency
    overall: Speedup | None = None   # over the fastest float, over every core state

    @classmethod
    def of(cls, at: dict, label: str = "candidate") -> Timing:
        from pipeline.measure import sanity

        sp = overall = at.get("speedup_vs_fastest_float")
        worst = (at.get("core_state") or {}).get("worst")
        if worst:  # judge the placement the candidate fared worst in: production may land there
            sp = worst["speedup_vs_fastest_float"]
        aa = at.get("aa_check") or {}
        lat = (at.get("latency_ms") or {}).get(label) or {}
        return cls(speedup=Speedup.of(sp), fastest_float=at.get("fastest_float"),
                   noisy=bool(at.get("noisy")),
                   worst_state_ns=worst["round_trip_ns"] if worst else None,
                   aa_median=aa.get("median"), aa_tolerance=aa.get("tolerance"),
                   p50_ms=lat.get("p50"), p99_ms=lat.get("p99"),
                   over={k: Speedup.of(v) for k, v in (at.get("speedup") or {}).items()},
                   problems=tuple(sanity.problems(at)), label=at.get("candidate_label"),
                   overall=Speedup.of(overall),
                   latencies={k: Latency.of(v) for k, v in (at.get("latency_ms") or {}).items()
                              if isinstance(v, dict)})


@dataclass(frozen=True)
class BenchResult:
    """A benchmark's timings by batch size, and the environment they were taken in."""
    batches: dict                    # batch size (int) -> Timing
    environment: dict | None

    @classmethod
    def of(cls, bench) -> BenchResult:
        meta = bench.meta
        return cls({int(b): Timing.of(at) for b, at in (meta.get("batches") or {}).items()},
                   meta.get("environment"))

    def at(self, batch: int) -> Timing | None:
        return self.batches.get(batch)


@dataclass(frozen=True)
class DecodeResult:
    """A decode_speed stage: each candidate's decode speedup over the reference it ran against,
    each model's decode timing, and how the rounds went."""
    speedups: dict                   # role -> Speedup
    noisy: bool
    environment: dict | None
    timings: dict = field(default_factory=dict)  # role -> DecodeSummary (the reference: "fp32")
    rounds: int | None = None
    seconds: float | None = None
    one_at_a_time: bool | None = None  # the models were timed in turn, not interleaved

    @classmethod
    def of(cls, speed) -> DecodeResult:
        from pipeline.core.json_record import from_json
        from pipeline.measure.decode_summary import DecodeSummary

        meta = speed.meta
        timings = meta.get("timings") or {}
        return cls({r: Speedup.of(s) for r, s in (meta.get("speedup_vs_fp32") or {}).items()},
                   bool(meta.get("noisy")), meta.get("environment"),
                   {r: from_json(DecodeSummary, t, known_only=True) for r, t in timings.items()},
                   meta.get("rounds"), meta.get("seconds"), meta.get("one_at_a_time"))


@dataclass(frozen=True)
class TextScores:
    """A score_text (or text_reference) stage: a decoder's text scored against its reference."""
    perplexity: float | None
    perplexity_rise_pct: float | None
    top1_agreement: float | None     # a fraction
    kl_mean: float | None
    sequences: int | None
    sequences_total: int | None
    tokens_scored: int | None
    stopped: object = None           # why sequential scoring stopped, if it did

    FIELDS = ("perplexity", "perplexity_rise_pct", "top1_agreement", "kl_mean", "sequences",
              "sequences_total", "tokens_scored", "stopped")

    @classmethod
    def of(cls, art) -> TextScores:
        return cls(*(art.meta.get(k) for k in cls.FIELDS))

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.FIELDS}


NO_SCORES = TextScores(None, None, None, None, None, None, None)


@dataclass(frozen=True)
class Evaluation:
    """An evaluate artifact: the task's metrics and where its predictions lie (for agreement)."""
    metrics: dict                    # metric name -> value
    output_sha256: str | None
    artifact: object                 # the evaluate Artifact: predictions.json for agreement
    samples: int | None = None       # samples scored
    non_finite: int | None = None    # of them, those whose outputs held NaN or inf

    @classmethod
    def of(cls, art) -> Evaluation:
        m = art.meta
        return cls(dict(m.get("metrics") or {}), m.get("output_sha256"), art,
                   m.get("samples"), m.get("non_finite"))

    def metric(self, name: str) -> float:
        """NaN when this evaluation does not report ``name`` (the gate fails that check)."""
        return float(self.metrics.get(name, math.nan))
