"""``make bench``, section ``auto``: ``quant=auto`` on both OCR networks, next to the peers.

In: the bench's base overrides and its CLI runner. Out: per network (``ocr``, ``ocr_mobile``) the
command, its exit code and wall time, the winner (candidate, runtime, accuracy, speedup over the
fastest float baseline with its 95 % CI, gate verdict) and the whole table, the float-region
trials of the INT8 candidate, and the winner timed against the peers of the ``runtimes`` section
(``benchmarks/peers.py``: onnxruntime's default ``quantize_static``, NNCF INT8 on OpenVINO,
OpenVINO's default compile of FP32) in one process, with its A/A check. Targets: the winner at
least as fast as the fastest float baseline (lower CI bound >= 1.0) within the gate's accuracy
budget, not slower than any peer (upper CI bound of the winner's speedup over it >= 1.0), and, on
a network where INT8 lost to FP32, the region search's answer (a faster mix, or none).
"""
from __future__ import annotations

from pathlib import Path

NETWORKS = ("ocr", "ocr_mobile")
# Blocks of 20 runs (runtimes mix) leave few rounds in the default minute: the one benchmark
# that decides between all candidates gets two.
EXTRA = ["bench.max_seconds=120"]


def _winner(rep: dict) -> dict:
    w = rep["auto"]["winner"]
    return {k: w.get(k) for k in ("candidate", "target", "sequence_accuracy", "accuracy_drop",
                                  "agreement_with_fp16", "p50", "latency_ms",
                                  "speedup_vs_fastest_float", "passed", "failed")}


def network(base: list[str], model: str, cli) -> dict:
    from pipeline.engine.compose import compose
    from benchmarks.peers import PEERS, compare

    args = [a for a in base if not a.startswith(("model=", "quant="))] + [
        f"model={model}", "quant=auto", *EXTRA]
    code, seconds, rep = cli(args)
    if not rep or "auto" not in rep:
        raise RuntimeError(f"quant=auto on {model} wrote no auto table (exit {code})")
    cfg = compose(args)
    g = cfg.gate
    from pipeline.metrics import SPECS
    from pipeline.metrics.limits import limits

    budget = limits(g.max_accuracy_drop, SPECS["sequence_accuracy"])["sequence_accuracy"]
    winner = _winner(rep)
    regions = rep["auto"]["int8"].get("regions") or {}
    int8_rows = [r for r in rep["auto"]["table"] if r["role"] == "candidate"]
    out = {"command": "python -m pipeline " + " ".join(args), "exit_code": code,
           "seconds": round(seconds, 1), "verdict": rep["verdict"]["summary"],
           "published": rep.get("published"), "winner": winner, "why": rep["auto"]["why"],
           "table": [{k: r.get(k) for k in ("candidate", "target", "sequence_accuracy",
                                            "accuracy_drop", "latency_ms",
                                            "speedup_vs_fastest_float", "passed", "failed")}
                     for r in rep["auto"]["table"]],
           "regions": {k: regions.get(k) for k in ("summary", "kept", "faster_than_fp32",
                                                  "all_int8_over_fp32", "trials")},
           "environment": rep["environment"]}
    peers = compare(rep, cfg, Path(cfg.workdir) / f"bench-peers-auto-{model}")
    out["peers"] = peers
    sp = winner["speedup_vs_fastest_float"] or {"median": None, "ci95": [None, None]}
    targets = {
        f"{model}: winner >= fastest float baseline (CI low >= 1.0) at batch "
        f"{g.speedup_batch_size}": [sp, sp["ci95"][0] is not None and sp["ci95"][0] >= 1.0],
        f"{model}: winner within the accuracy budget ({budget} points)":
            [winner["accuracy_drop"], winner["accuracy_drop"] is not None
             and winner["accuracy_drop"] <= budget + 1e-9],
        f"{model}: gate passed and published": [code, code == 0]}
    for b, at in peers["batches"].items():
        for key, peer in PEERS.items():
            p = at["pipeline_speedup"][peer]
            targets[f"{model} batch {b}: winner not slower than ({key}) {peer}"] = \
                [p, p["ci95"][1] >= 1.0]
        aa = at["aa_check"]["median"]
        targets[f"{model} batch {b}: A/A of the winner within 3 %"] = [aa, abs(aa - 1) <= 0.03]
    slower = [r for r in int8_rows if r["target"] == "onnxruntime fp32"
              and (r.get("speedup_vs_fastest_float") or {}).get("median", 2) < 1.0]
    if slower:  # INT8 lost to FP32 here: did the region search find a faster mix?
        targets[f"{model}: INT8 slower than FP32 here; region search found a mix faster than "
                "FP32, or the report shows none of its trials was"] = [
            regions.get("summary"), bool(regions.get("trials"))]
    out["targets"] = targets
    return out


def section(base: list[str], cli) -> dict:
    out, targets = {}, {}
    for model in NETWORKS:
        try:
            out[model] = network(base, model, cli)
            targets.update(out[model]["targets"])
        except Exception as e:  # noqa: BLE001 - one network's failure must not hide the other's
            out[model] = {"error": f"{type(e).__name__}: {e}"}
            targets[f"{model}: section ran"] = [str(e), False]
    out["targets"] = targets
    return out
