"""Float regions, not float nodes: which whole blocks of an INT8 model should stay float.

In: the ``Quantizer`` (runner, stages, calibration), the nodes already kept float, the INT8 model
the search starts from and its ``explain`` profile. Out: the model to keep, the nodes it keeps
float and a record for the report: each region tried, its nodes, and what keeping it float cost
or saved end to end, against the starting INT8 model and against FP32.

Why regions: choosing nodes one by one from a per-node profile misses the Quantize/Dequantize
pair each float node adds at its border, and a float node between INT8 neighbours often costs
more in conversions than its kernel saved. A region is a contiguous run of nodes (graph order)
that belong to one module of the network (``blocks.2``, ``cnn.4``, ``rnn``: the node names'
module path, two levels deep when the second is an index); a run without a weighted op (a
ReLU, a pool) joins the region before it. Trials float whole regions or a prefix of the network,
so the borders are few. They are chosen from the profile (the regions that lost most in INT8
first, their union, prefixes of the network) and judged only by an interleaved end-to-end
timing of all trials together on the target (``stages/regions.py``); at most
``quant.region_trials`` of them. A trial is kept only if the lower bound of its speedup over the
starting model is above 1.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import onnx

from pipeline.core.json_record import to_json

WEIGHTED = ("Conv", "ConvTranspose", "MatMul", "Gemm", "LSTM", "GRU", "RNN")
NODE_TRIAL = "nodes profiled slower in INT8 (per node)"
SEQUENCE = ("LSTM", "GRU", "RNN", "MatMul", "Gemm")  # where the convolutional trunk ends


@dataclass(frozen=True)
class Region:
    """A contiguous run of nodes of one module, in graph order."""
    name: str                 # its module path, or ``first..last`` when runs were joined
    nodes: tuple[str, ...]    # the prepared float model's node names
    weighted: bool            # holds a Conv, MatMul, LSTM ...: something INT8 computes
    sequence: bool            # a recurrent or fully connected op: the trunk ends before it


@dataclass
class _Run:
    """A region while it is being grown: its module keys, nodes and op types."""
    keys: list
    nodes: list
    weighted: bool
    ops: set

    def join(self, other: _Run) -> None:
        self.nodes += other.nodes
        self.ops |= other.ops
        self.weighted |= other.weighted
        self.keys += [k for k in other.keys if k not in self.keys]


def module_key(name: str) -> str | None:
    """``blocks.2.dw.0/HardSigmoid`` -> ``blocks.2``; ``rnn`` -> ``rnn``; unnamed -> None."""
    if not name or name.startswith("node_"):
        return None
    parts = name.split("/")[0].split(".")
    return ".".join(parts[:2]) if len(parts) > 1 and parts[1].isdigit() else parts[0]


def regions(model) -> list[Region]:
    """The regions of a model in graph order (the prepared float model's node names)."""
    graph = onnx.load(str(model), load_external_data=False).graph
    groups: list[_Run] = []
    for n in graph.node:
        key = module_key(n.name)
        run = _Run([key or n.name], [n.name], n.op_type in WEIGHTED, {n.op_type})
        if groups and (key is None or key == groups[-1].keys[-1]):
            run.keys = []
            groups[-1].join(run)
        else:
            groups.append(run)
    merged: list[_Run] = []
    for g in groups:  # a run without weights (ReLU, pool, residual Add) joins the one before it
        if merged and not g.weighted:
            merged[-1].join(_Run(g.keys, g.nodes, False, g.ops))
        else:
            merged.append(g)
    if len(merged) > 1 and not merged[0].weighted:
        first = merged.pop(0)
        merged[0].nodes = first.nodes + merged[0].nodes
        merged[0].ops |= first.ops
    return [Region(g.keys[0] if len(g.keys) == 1 else f"{g.keys[0]}..{g.keys[-1]}",
                   tuple(n for n in g.nodes if n), g.weighted, bool(g.ops & set(SEQUENCE)))
            for g in merged]


def _span(names: list[str]) -> str:
    """``stem.0..stem.2`` + ``blocks.0`` -> ``stem.0..blocks.0``: a run of regions by its ends."""
    return f"{names[0].split('..')[0]}..{names[-1].split('..')[-1]}"


def plan(regs: list[Region], gains: dict, quantized: set, limit: int) -> list[tuple[str, list[str]]]:
    """Up to ``limit`` trials: (name, region names), most promising first.

    ``gains``: per node, FP32 ms minus INT8 ms from the profile (negative: slower in INT8).
    Regions with nothing quantized in them are no choice. Trials: the union of the regions that
    lost in INT8, the convolutional trunk (every region before the first recurrent or fully
    connected one), those regions one by one (most lost first), then prefixes of the network."""
    live = [r for r in regs if any(n in quantized for n in r.nodes)]
    if not live or limit <= 0:
        return []
    gain = {r.name: sum(gains.get(n, 0.0) for n in r.nodes) for r in live}
    losing = sorted((r.name for r in live if gain[r.name] < 0), key=lambda k: gain[k])
    names = [r.name for r in live]
    trials: list[tuple[str, list[str]]] = []

    def add(label: str, members: list[str]) -> None:
        key = sorted(members)
        if members and len(members) < len(names) and all(sorted(m) != key for _, m in trials):
            trials.append((label, list(members)))

    if len(losing) > 1:
        add("every region slower in INT8", losing)
    trunk = []
    for r in live:
        if r.sequence:
            break
        trunk.append(r.name)
    if 0 < len(trunk) < len(names):
        add(f"prefix {_span(trunk)} (the convolutional trunk)", trunk)
    for k in losing:
        add(k, [k])
    n = len(names)
    for length in sorted({max(1, math.ceil(n * f)) for f in (0.25, 0.5, 0.75)}):
        if length < n:
            add(f"prefix {_span(names[:length])}", names[:length])
    return trials[:limit]


def search(qz, method: str, exclude: set, art, expl_meta: dict, node_trial=None):
    """(model to keep, the nodes it adds float, the record's JSON): what ``QuantInfo.regions``
    holds until it keeps the typed record that ``search_regions`` returns."""
    keep, kept, record = search_regions(qz, method, exclude, art, expl_meta, node_trial)
    return keep, kept, to_json(record)


def search_regions(qz, method: str, exclude: set, art, expl_meta: dict, node_trial=None):
    """(model to keep, the nodes it adds float, ``FloatRegions``). ``art`` is the INT8 model the
    trials start from; ``node_trial``, when given, is (artifact, float nodes) of the per-node
    latency-aware trial, timed with the regions so the best of all of them is kept."""
    from pipeline.recipes.regions_record import FloatRegions, RegionGain

    q = qz.job.quant
    regs = regions(qz.prepared.model)
    gains = {r["node"]: r["gain_ms"] for r in expl_meta["nodes"]}
    gained = [RegionGain(r.name, len(r.nodes), sum(gains.get(n, 0.0) for n in r.nodes))
              for r in regs]
    built = _trials(qz, method, exclude, art, regs, gains, node_trial)
    if not built:
        return art, [], FloatRegions(gained, [], None, q.region_trials, None,
                                     summary="no region could be made float")
    return _judge(qz, art, built, gained, node_trial is not None)


def _trials(qz, method, exclude, art, regs, gains, node_trial) -> list[tuple]:
    """The trial models: (name, regions, float nodes, artifact), the per-node trial first."""
    by_name = {r.name: r for r in regs}
    quantized = {n for n, p in art.meta["precision"].items() if p.startswith("int8")}
    built = []
    if node_trial is not None:
        built.append((NODE_TRIAL, [], sorted(node_trial[1]), node_trial[0]))
    for label, members in plan(regs, gains, quantized, qz.job.quant.region_trials):
        nodes = {n for k in members for n in by_name[k].nodes}
        trial = qz.quantize(method, exclude | nodes, label=f"quantize[float {label}]")
        floated = sorted(n for n in nodes if trial.meta["precision"].get(n) == "float"
                         and art.meta["precision"].get(n, "float").startswith("int8"))
        if floated:
            built.append((label, members, floated, trial))
    return built


def _judge(qz, art, built, gained, with_node_trial: bool):
    """Every trial timed end to end together (``stages/regions.py``); the fastest over the
    all-INT8 model is kept when the lower bound of its interval is above 1."""
    from pipeline.recipes.regions_record import FloatRegions, RegionsTimed, Trial
    from pipeline.stages.regions import BASE, FP32, RegionTrials

    q, job = qz.job.quant, qz.job
    timed = RegionsTimed.of(qz.runner.run(
        RegionTrials(qz.evaluation, job.gate.speedup_batch_size,
                     qz.hw, tuple(name for name, *_ in built),
                     # bounded like the benchmark: at most 100 rounds and 30 s
                     min(100, job.bench.min_rounds), min(30.0, job.bench.max_seconds)),
        art, label="regions", fp32=qz.fp32,
        **{f"t{i}": b[3] for i, b in enumerate(built)}).meta)
    trials = [Trial(name, members, floated, **vars(timed.trials[name]))
              for name, members, floated, _ in built]
    arts = {t.name: b[3] for t, b in zip(trials, built)}
    beat_fp32 = [t.name for t in trials if t.speedup_over_fp32.low > 1.0]
    best = max(trials, key=lambda t: t.speedup_over_fp32.median)
    fp32_line = (f"{len(beat_fp32)} of {len(trials)} trials beat FP32" if beat_fp32 else
                 f"none of the {len(trials)} trials was faster than FP32 (best: {best.name}, "
                 f"{best.speedup_over_fp32.median:.2f}x FP32, 95 % CI "
                 f"{best.speedup_over_fp32.low:.2f}-{best.speedup_over_fp32.high:.2f})")
    paid = [t for t in trials if t.speedup_over_all_int8.low > 1.0]
    keep = max(paid, key=lambda t: t.speedup_over_all_int8.median) if paid else None
    if keep is None:
        summary = (f"no float region paid: every trial's speedup over the all-INT8 "
                   f"model had a 95 % CI reaching 1.0 or below; {fp32_line}")
    else:
        sp = keep.speedup_over_all_int8
        summary = (f"kept {keep.name} float ({len(keep.float_nodes)} nodes): "
                   f"{sp.median:.2f}x the all-INT8 model (95 % CI {sp.low:.2f}-"
                   f"{sp.high:.2f}), {keep.speedup_over_fp32.median:.2f}x FP32; {fp32_line}")
    record = FloatRegions(
        gained, trials, None if keep is None else keep.name, q.region_trials,
        trials[0].speedup_over_all_int8 if with_node_trial else None,
        batch_size=timed.batch_size, rounds=timed.rounds,
        all_int8_over_fp32=timed.all_int8_over_fp32,
        p50_ms={BASE: timed.p50_ms[BASE], FP32: timed.p50_ms[FP32]},
        faster_than_fp32=beat_fp32, summary=summary)
    if keep is None:
        return art, [], record
    return arts[keep.name], keep.float_nodes, record
