"""The run report's body, typed: what ``report.json`` holds and ``report.md`` shows.

In: the recipe's ``Outcome`` (typed evaluations, benchmark, verdict) and the run's facts. Out: a
frozen ``RunReport`` built once (``pipeline.report.manifest.body``): one ``Row`` per step's
model with its per-batch ``LatencyCell``s, the metric specs, the A/A checks, how the batches were
timed, the fusions, the load test, the environment, the stages and the lineage; the other
capabilities' sections (bill, runtimes, pruning, quantization, auto) ride along as those
capabilities give them. ``InterruptedReport`` is the body of a run stopped in a stage. What
happens after the body is written (figures, publishing, a signal) is the ``RunEnd``, which the
publish flow updates. ``as_json`` writes either with ``pipeline.core.json_record``: field names
are the JSON's keys, so report.json keeps the keys every earlier run wrote.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.core.json_record import from_json, omitted, rest, to_json
from pipeline.gate.verdict import Verdict
from pipeline.measure.bench_record import (BatchRecord, BenchRecord, ColdStart, CoreState,
                                           InputContract, LoadRecord, Ratio, ShapeOutlier,
                                           SizeAxis, SizeP50)
from pipeline.measure.fusion_record import FuseRecord, Parity
from pipeline.measure.results import Evaluation, Role
from pipeline.metrics.outputs import Rule, agreement
from pipeline.prune.report import PruningSection
from pipeline.runtimes.record import Deployed, RuntimePlan
from pipeline.task.serving import Serving

ROWS = ((Role.export, "export (torch -> ONNX, FP32)"), (Role.fp32, "optimize (FP32 baseline)"),
        (Role.fp16, "fp16 (baseline)"), (Role.candidate, "candidate"))


@dataclass(frozen=True)
class LatencyCell:
    """One model at one batch size. The candidate's speedup is the median of per-round ratios,
    with its interval; a baseline's is a p50 ratio."""
    p50: float
    p99: float
    p999: float | None
    throughput: float | None
    speedup_vs_fastest_float: float
    speedup_ci95: tuple[float, float] | None = omitted()


@dataclass(frozen=True)
class Row:
    """One step's model: its size, nodes, the task's metrics, agreement with FP16, latency."""
    role: Role
    step: str
    digest: str
    size_mb: float
    nodes: int
    agreement_with_fp16: float | None
    output_sha256: str | None
    latency: dict[str, LatencyCell]  # batch size as the JSON writes it -> its cell
    metrics: dict = rest()           # metric name -> value, beside the fields in the JSON


@dataclass(frozen=True)
class MetricSpec:
    """A task metric as the report records it. ``against``: what rows are scored against:
    ``labels``, ``fp16_outputs`` (label-free) or ``gold_scores`` (a label-free task's metric
    that needs labels)."""
    name: str
    unit: str
    higher_is_better: bool
    primary: bool
    against: str


@dataclass(frozen=True)
class LineageEntry:
    """Where one model of the run came from (an encoder's report and a decoder's alike)."""
    digest: str
    stage: str
    parent: str | None
    path: str

    @classmethod
    def of(cls, art) -> LineageEntry:
        return cls(art.digest, art.stage, art.parent, str(art.path))


@dataclass(frozen=True)
class BatchTiming:
    """How one batch size was timed (the candidate's per-size medians)."""
    rounds: int
    seconds: float
    noisy: bool
    core_state: CoreState | None
    per_size: tuple[SizeP50, ...]
    size_axis: SizeAxis | None
    shape_outliers: tuple[ShapeOutlier, ...]


@dataclass(frozen=True)
class TimingReport:
    batches: dict[str, BatchTiming]
    cold_start_ms: dict[str, ColdStart]
    input_contract: InputContract | None


@dataclass(frozen=True)
class FusionReport:
    """A transformer's fuse stage: each fusion and its count, node counts, parity."""
    model_type: str
    num_heads: int
    hidden_size: int
    fusions: dict[str, int]
    nodes_before: int
    nodes_after: int
    parity_vs_export: Parity
    attention_blocks: int | None = None  # the export's Softmax nodes, one per attention block
    attention_fused: int = 0             # of them, fused (Attention or MultiHeadAttention)


@dataclass(frozen=True)
class Cpu:
    model: str
    logical_cores: int
    flags: tuple[str, ...]
    rest: dict = rest()


@dataclass(frozen=True)
class RuntimeVersions:
    name: str
    precision: str
    versions: dict[str, str]
    rest: dict = rest()


@dataclass(frozen=True)
class Environment:
    """Where the numbers were taken (``pipeline.core.env.environment``)."""
    cpu: Cpu
    provider: str
    threads: dict
    tools: dict[str, str]
    runtime: RuntimeVersions | None = omitted()
    rest: dict = rest()


@dataclass(frozen=True)
class StageRow:
    """One stage call as the runner recorded it (``engine.runner``)."""
    label: str
    reused: bool
    seconds: float
    digest: str
    rest: dict = rest()


@dataclass(frozen=True)
class RunReport:
    model: str
    quant: str
    config: dict
    environment: Environment
    metrics: tuple[MetricSpec, ...]  # primary first
    verdict: Verdict                 # written as the gate writes it (as_dict)
    rows: tuple[Row, ...]
    aa_check: dict[str, Ratio]
    timing: TimingReport
    bill: object                     # bill.record.RunBill (BillError: could not be computed)
    stages: tuple[StageRow, ...]
    lineage: dict[str, LineageEntry]
    runtimes: RuntimePlan | None     # what runtimes.plan measured and chose
    warnings: tuple[str, ...] = ()   # what the terminal warned about before any stage ran
    labels_outside_charset: object = omitted()
    fusion: FusionReport | None = omitted()
    quantization: dict | None = omitted()  # pipeline.report.quant.as_dict
    pruning: PruningSection | None = omitted()
    load: LoadRecord | None = omitted()
    serving: Serving | None = omitted()  # what the evaluation fed the model
    auto: object = omitted()         # quant=auto: every candidate, the winner and why

    def row(self, role: Role) -> Row:
        return next(r for r in self.rows if r.role == role)

    @property
    def primary(self) -> MetricSpec | None:
        return next((m for m in self.metrics if m.primary), None)


@dataclass(frozen=True)
class NotJudged:
    """The verdict of a run stopped before the gate."""
    summary: str
    passed: bool = False
    checks: tuple = ()

    def as_dict(self) -> dict:  # verdict.json's order, as every interrupted run wrote it
        return {"passed": self.passed, "checks": list(self.checks), "summary": self.summary}


@dataclass(frozen=True)
class InterruptedReport:
    """A run stopped by a signal in a stage: the config, the stages done, where it stopped."""
    model: str
    quant: str
    config: dict
    stages: tuple[StageRow, ...]
    verdict: NotJudged


@dataclass(frozen=True)
class Interruption:
    signal: str
    where: str
    exit_code: int


@dataclass
class Publication:
    """What publishing did: pending, published (``ref``), failed (``error``) or interrupted."""
    status: str
    backend: str | None = omitted()
    ref: str | None = omitted()
    error: str | None = omitted()


@dataclass
class RunEnd:
    """What happened after the body was built, updated by the publish flow as it goes."""
    status: str = "complete"
    figures: dict[str, str] = field(default_factory=dict)  # file name -> "ok" or why not
    publish: Publication | None = omitted()
    published: str | None = omitted()   # the registry's ref
    interrupted: Interruption | None = omitted()

    @classmethod
    def of(cls, report) -> RunEnd:
        """A dict body's end as it says it (a decoder's report), else a fresh one."""
        return from_json(cls, report, known_only=True) if isinstance(report, dict) else cls()


@dataclass(frozen=True)
class DataSets:
    """What a stage recorded of the data it read: an evaluate stage its evaluation set, a
    quantize stage its calibration set (absent elsewhere)."""
    evaluation_set: object = None
    calibration_set: object = None

    @classmethod
    def of(cls, art) -> DataSets:
        return from_json(cls, art.meta, known_only=True)


def as_json(report, end: RunEnd) -> dict:
    """report.json: the body (typed, or a decoder's dict) and its end."""
    return {**(report if isinstance(report, dict) else to_json(report)), **to_json(end)}


def rows(outcome, mode: str, rule: Rule = Rule()) -> tuple[Row, ...]:
    """``rule``: when an output agrees with FP16's (``pipeline.metrics.outputs.Rule.of`` the
    gate config)."""
    batches = outcome.timings().batches  # seen from the shipped candidate's seat (no relabelling)
    fp16 = outcome.evals[Role.fp16]
    return tuple(_row(outcome, role, _title(outcome, role, title, mode), batches,
                      agreement(outcome.evals[role], fp16, rule)) for role, title in ROWS)


def _title(outcome, role: Role, title: str, mode: str) -> str:
    art = outcome.models[role]
    if role == Role.fp32 and art.stage == "fuse":
        return "fuse (transformer fusions, FP32 baseline)"
    if role == Role.export and art.stage == "import":  # a user's ONNX file: no torch, maybe INT8
        return "import (the file as given)"
    if role != Role.candidate:
        return title
    title = f"{art.stage} ({mode}, candidate)"
    deployed = _deployed(outcome)
    if deployed is not None and (deployed.runtime, deployed.precision) != ("onnxruntime", "fp32"):
        title += f" on {deployed.runtime} {deployed.precision}"
    return title


def _deployed(outcome) -> Deployed | None:
    plan = getattr(outcome, "runtimes", None)
    return plan.deployed if plan else None


@dataclass(frozen=True)
class _Nodes:
    """A stage's node counts by op type (absent: none recorded)."""
    nodes: dict[str, int] = field(default_factory=dict)  # op type -> count


def _row(outcome, role: Role, title: str, batches: dict, agree) -> Row:
    art, ev = outcome.models[role], Evaluation.of(outcome.evals[role])
    nodes = from_json(_Nodes, art.meta, known_only=True).nodes
    latency = {}
    for b, t in batches.items():
        lat = t.latencies.get(t.label if role == Role.candidate else role)
        if lat is None:
            continue  # quant=auto times only the models that compete (and FP32)
        if role == Role.candidate:  # the gated number: median of per-round ratios, with its CI
            speedup, ci = t.overall.median, (t.overall.low, t.overall.high)
        else:
            speedup, ci = t.latencies[t.fastest_float].p50 / lat.p50, None
        latency[str(b)] = LatencyCell(lat.p50, lat.p99, lat.p999, lat.throughput, speedup, ci)
    return Row(role, title, art.digest, art.model.stat().st_size / 1e6, sum(nodes.values()),
               agree, ev.output_sha256, latency, dict(ev.metrics))


def fusion(outcome) -> FusionReport | None:
    """A transformer's fuse stage (``stages.fuse``), None for any other FP32 baseline."""
    art = outcome.models[Role.fp32]
    if art.stage != "fuse":
        return None
    m = FuseRecord.of(art)
    return FusionReport(m.model_type, m.num_heads, m.hidden_size, m.fusions,
                        sum(m.nodes_before.values()), sum(m.nodes.values()), m.parity_vs_export,
                        m.attention_blocks, m.attention_fused)


def metric_specs(t) -> tuple[MetricSpec, ...]:
    """The task's metrics as the report records them (primary first)."""
    specs = sorted(t.metrics.specs, key=lambda s: s.name != t.metrics.primary)

    def against(s) -> str:
        if not t.label_free:
            return "labels"
        return "gold_scores" if s.needs_labels else "fp16_outputs"

    return tuple(MetricSpec(s.name, s.unit, s.higher_is_better, s.name == t.metrics.primary,
                            against(s)) for s in specs)


def timing(record: BenchRecord, outcome) -> TimingReport:
    """How the latencies were measured: rounds, noise, shapes, cold start, input contract; the
    noise, core states and per-size medians are the shipped candidate's own (its seat)."""
    seat = outcome.timings().batches

    def batch(b: str, at: BatchRecord) -> BatchTiming:
        label = outcome.label_at(b)
        state = (at.core_state_by_label or {}).get(label, at.core_state)
        return BatchTiming(at.rounds, at.seconds, seat[int(b)].noisy, state, at.per_size[label],
                           record.size_axis, at.shape_outliers)

    return TimingReport({b: batch(b, at) for b, at in record.batches.items()},
                        record.cold_start_ms or {}, record.input_contract)


def aa_checks(record: BenchRecord) -> dict[str, Ratio]:
    return {b: at.aa_check for b, at in record.batches.items()}


def stages(record: list) -> tuple[StageRow, ...]:
    return tuple(from_json(StageRow, s) for s in record)


def environment(env: dict) -> Environment:
    return from_json(Environment, env)
