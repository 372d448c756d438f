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

import onnx

WEIGHTED = ("Conv", "ConvTranspose", "MatMul", "Gemm", "LSTM", "GRU", "RNN")
NODE_TRIAL = "nodes profiled slower in INT8 (per node)"
SEQUENCE = ("LSTM", "GRU", "RNN", "MatMul", "Gemm")  # where the convolutional trunk ends


def module_key(name: str) -> str | None:
    """``blocks.2.dw.0/HardSigmoid`` -> ``blocks.2``; ``rnn`` -> ``rnn``; unnamed -> None."""
    if not name or name.startswith("node_"):
        return None
    parts = name.split("/")[0].split(".")
    return ".".join(parts[:2]) if len(parts) > 1 and parts[1].isdigit() else parts[0]


def regions(model) -> list[dict]:
    """[{"name", "nodes", "weighted", "sequence"}] in graph order (the prepared float model's node names)."""
    graph = onnx.load(str(model), load_external_data=False).graph
    groups: list[dict] = []
    for n in graph.node:
        key = module_key(n.name)
        if groups and (key is None or key == groups[-1]["keys"][-1]):
            groups[-1]["nodes"].append(n.name)
            groups[-1]["weighted"] |= n.op_type in WEIGHTED
            groups[-1]["ops"].add(n.op_type)
            continue
        groups.append({"keys": [key or n.name], "nodes": [n.name],
                       "weighted": n.op_type in WEIGHTED, "ops": {n.op_type}})
    merged: list[dict] = []
    for g in groups:  # a run without weights (ReLU, pool, residual Add) joins the one before it
        if merged and not g["weighted"]:
            merged[-1]["nodes"] += g["nodes"]
            merged[-1]["ops"] |= g["ops"]
            merged[-1]["keys"] += [k for k in g["keys"] if k not in merged[-1]["keys"]]
        else:
            merged.append(g)
    if len(merged) > 1 and not merged[0]["weighted"]:
        merged[1]["nodes"] = merged[0]["nodes"] + merged[1]["nodes"]
        merged[1]["ops"] |= merged[0]["ops"]
        merged.pop(0)
    out = []
    for g in merged:
        keys = g["keys"]
        out.append({"name": keys[0] if len(keys) == 1 else f"{keys[0]}..{keys[-1]}",
                    "nodes": [n for n in g["nodes"] if n], "weighted": g["weighted"],
                    "sequence": bool(g["ops"] & set(SEQUENCE))})
    return out


def _span(names: list[str]) -> str:
    """``stem.0..stem.2`` + ``blocks.0`` -> ``stem.0..blocks.0``: a run of regions by its ends."""
    return f"{names[0].split('..')[0]}..{names[-1].split('..')[-1]}"


def plan(regs: list[dict], gains: dict, quantized: set, limit: int) -> list[tuple[str, list[str]]]:
    """Up to ``limit`` trials: (name, region names), most promising first.

    ``gains``: per node, FP32 ms minus INT8 ms from the profile (negative: slower in INT8).
    Regions with nothing quantized in them are no choice. Trials: the union of the regions that
    lost in INT8, the convolutional trunk (every region before the first recurrent or fully
    connected one), those regions one by one (most lost first), then prefixes of the network."""
    live = [r for r in regs if any(n in quantized for n in r["nodes"])]
    if not live or limit <= 0:
        return []
    gain = {r["name"]: sum(gains.get(n, 0.0) for n in r["nodes"]) for r in live}
    losing = sorted((r["name"] for r in live if gain[r["name"]] < 0), key=lambda k: gain[k])
    names = [r["name"] for r in live]
    trials: list[tuple[str, list[str]]] = []

    def add(label: str, members: list[str]) -> None:
        key = sorted(members)
        if members and len(members) < len(names) and all(sorted(m) != key for _, m in trials):
            trials.append((label, list(members)))

    if len(losing) > 1:
        add("every region slower in INT8", losing)
    trunk = []
    for r in live:
        if r["sequence"]:
            break
        trunk.append(r["name"])
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
    """(model to keep, the nodes it adds float, record). ``art`` is the INT8 model the trials
    start from; ``node_trial``, when given, is (artifact, float nodes) of the per-node
    latency-aware trial, timed with the regions so the best of all of them is kept."""
    from pipeline.stages.regions import RegionTrials

    q = qz.job.quant
    regs = regions(qz.prepared.model)
    by_name = {r["name"]: r for r in regs}
    gains = {r["node"]: r["gain_ms"] for r in expl_meta["nodes"]}
    quantized = {n for n, p in art.meta["precision"].items() if p.startswith("int8")}
    record = {"regions": [{"name": r["name"], "nodes": len(r["nodes"]),
                           "profile_gain_ms": sum(gains.get(n, 0.0) for n in r["nodes"])}
                          for r in regs],
              "trials": [], "kept": None, "limit": q.region_trials, "node_trial": None}
    trials, arts = [], []
    if node_trial is not None:
        trials.append({"name": NODE_TRIAL, "regions": [], "float_nodes": sorted(node_trial[1])})
        arts.append(node_trial[0])
    for label, members in plan(regs, gains, quantized, q.region_trials):
        nodes = {n for k in members for n in by_name[k]["nodes"]}
        trial = qz.quantize(method, exclude | nodes, label=f"quantize[float {label}]")
        floated = sorted(n for n in nodes if trial.meta["precision"].get(n) == "float"
                         and art.meta["precision"].get(n, "float").startswith("int8"))
        if not floated:
            continue
        trials.append({"name": label, "regions": members, "float_nodes": floated})
        arts.append(trial)
    if not trials:
        record["summary"] = "no region could be made float"
        return art, [], record
    timed = qz.runner.run(
        RegionTrials(qz.evaluation, qz.job.gate.speedup_batch_size,
                     qz.hw, tuple(t["name"] for t in trials),
                     # bounded like the benchmark: at most 100 rounds and 30 s
                     min(100, qz.job.bench.min_rounds), min(30.0, qz.job.bench.max_seconds)),
        art, label="regions", fp32=qz.fp32, **{f"t{i}": a for i, a in enumerate(arts)}).meta
    for t in trials:
        t.update(timed["trials"][t["name"]])
    if node_trial is not None:
        record["node_trial"] = trials[0]["speedup_over_all_int8"]
    record.update(trials=trials, batch_size=timed["batch_size"], rounds=timed["rounds"],
                  all_int8_over_fp32=timed["all_int8_over_fp32"],
                  p50_ms={"all-int8": timed["p50_ms"]["all-int8"], "fp32": timed["p50_ms"]["fp32"]})
    paid = [(t, a) for t, a in zip(trials, arts) if t["speedup_over_all_int8"]["ci95"][0] > 1.0]
    beat_fp32 = [t["name"] for t in trials if t["speedup_over_fp32"]["ci95"][0] > 1.0]
    record["faster_than_fp32"] = beat_fp32
    best = max(trials, key=lambda t: t["speedup_over_fp32"]["median"])
    fp32_line = (f"{len(beat_fp32)} of {len(trials)} trials beat FP32" if beat_fp32 else
                 f"none of the {len(trials)} trials was faster than FP32 (best: {best['name']}, "
                 f"{best['speedup_over_fp32']['median']:.2f}x FP32, 95 % CI "
                 f"{best['speedup_over_fp32']['ci95'][0]:.2f}-"
                 f"{best['speedup_over_fp32']['ci95'][1]:.2f})")
    if not paid:
        record["summary"] = (f"no float region paid: every trial's speedup over the all-INT8 "
                             f"model had a 95 % CI reaching 1.0 or below; {fp32_line}")
        return art, [], record
    keep, keep_art = max(paid, key=lambda p: p[0]["speedup_over_all_int8"]["median"])
    record["kept"] = keep["name"]
    sp = keep["speedup_over_all_int8"]
    record["summary"] = (f"kept {keep['name']} float ({len(keep['float_nodes'])} nodes): "
                         f"{sp['median']:.2f}x the all-INT8 model (95 % CI {sp['ci95'][0]:.2f}-"
                         f"{sp['ci95'][1]:.2f}), {keep['speedup_over_fp32']['median']:.2f}x FP32; "
                         f"{fp32_line}")
    return keep_art, keep["float_nodes"], record
