"""The quantization part of the report: settings, explanation, per-layer table, search trace.

In: the ``QuantInfo`` the INT8 sub-recipe filled (``pipeline/recipes/int8.py``). Out: a JSON-ready dict
for report.json, Markdown lines for report.md and two pictures (a bar chart of per-node
sensitivity and the mixed search's accuracy-versus-latency trace).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import asdict
from pathlib import Path

from pipeline.core import numbers


def as_dict(info) -> dict:
    return asdict(info)


def layer_rows(q: dict) -> list[dict]:
    """One row per node of the final model: module, ops, precision, SQNR, effect, times. The
    module is the source module's path where explain found one (else the node name); two nodes of
    one module (an attention's two MatMuls) add their node's own last name in brackets."""
    sens = {r["node"]: r for r in q.get("sensitivity", [])}
    kept = [r for r in (q.get("explain") or {}).get("nodes", [])
            if r["precision"] != "float" or r["node"] in sens]
    shared = Counter(r.get("module") for r in kept)
    rows = []
    for r in kept:
        s = sens.get(r["node"], {})
        module = r.get("module") or r["node"]
        if r.get("module") and shared[r["module"]] > 1:
            module = f"{module} [{r['node'].rstrip('/').rpartition('/')[2]}]"
        rows.append({"module": module, "node": r["node"], "op": r["fp32_op"],
                     "int8_kernel": r["int8_op"], "precision": r["precision"],
                     "sqnr_db": s.get("sqnr_db"), "metric_effect": s.get("metric_effect"),
                     "fp32_ms": r["fp32_ms"], "int8_ms": r["int8_ms"], "gain_ms": r["gain_ms"]})
    return rows


def _fmt(v, spec):
    return "–" if v is None else format(v, spec)


def markdown(q: dict) -> list[str]:
    ex = q.get("explain") or {}
    s = q["settings"]
    lines = ["", "## Quantization", "",
             f"- settings: activations {s['activation_type']}, weights {s['weight_type']}, "
             f"reduce_range {s['reduce_range']}, format {s['format']} ({s['reason']})",
             f"- calibration: {q['calibration']}"
             + ("; ranked on the hardest lines: " + ", ".join(
                 f"{k} {v:.2f}" for k, v in q["calibration_ranking"].items())
                if q.get("calibration_ranking") else "")]
    sm = q.get("smoothing")
    if sm:  # SmoothQuant-style migration: which strength won on the hardest samples
        lines.append(f"- outlier smoothing: {sm['activations']} MatMul inputs, largest channel up "
                     f"to {sm['largest_outlier_ratio']:.0f}x the median one; {sm['metric']} on "
                     "the hardest samples, all INT8: " + ", ".join(
                         f"{'no smoothing' if k == 'off' else 'alpha ' + k} {v:.4f}"
                         for k, v in sm["scores"].items())
                     + f"; kept: {'none' if sm['chosen'] == 'off' else 'alpha ' + str(sm['chosen'])}")
    src = q.get("dynamic_source")
    if src:  # dynamic INT8 of a fused transformer: which graph was quantized, and why
        if "ms" not in src:  # one graph only
            lines.append(f"- dynamic INT8 of the {src['chosen']} graph ({src['why']})")
        else:
            sp = src["export_over_fused_speedup"]
            lines.append(f"- dynamic INT8 of the fused graph {src['ms']['fused']:.2f} ms, of the "
                         f"unfused export {src['ms']['export']:.2f} ms at batch "
                         f"{src['batch_size']} (the export ran {numbers.ratio(sp['median'], sp['ci95'])} "
                         f"the fused one): kept the {src['chosen']} one")
    if ex:
        lines.append(f"- on this target: {ex['unfused_quantize']} QuantizeLinear and "
                     f"{ex['unfused_dequantize']} DequantizeLinear left unfused; INT8 kernels "
                     f"{', '.join(ex['int8_kernels']) or 'none'}; still float: "
                     f"{', '.join(ex['float_compute']) or 'nothing'}")
        lines.append(f"- profile at batch {ex['batch_size']}: FP32 {ex['fp32_total_ms']:.2f} ms, "
                     f"INT8 {ex['int8_total_ms']:.2f} ms (Q/DQ {ex['qdq_overhead_ms']:.2f} ms)")
    trial = q.get("latency_trial")
    if trial:
        sp = trial["speedup_over_all_int8"]
        stayed = trial.get("stayed_int8") or []
        if trial["float_nodes"]:
            lines.append(f"- profiled slower in INT8: {', '.join(trial['float_nodes'])}; keeping them "
                         f"float ran {numbers.ratio(sp['median'], sp['ci95'])} "
                         f"the all-INT8 model end to end: "
                         + ("kept float" if q.get("latency_exclusions") else "left INT8"))
        if stayed:
            lines.append(f"- profiled slower in INT8 but left INT8: {', '.join(stayed)} (between "
                         "INT8 neighbours onnxruntime keeps the Q/DQ pair and the INT8 kernel)")
    if q.get("regions"):  # quant.region_trials: whole blocks tried float, timed end to end
        from pipeline.report.auto import regions_markdown

        lines += regions_markdown(q["regions"])
    vs = q.get("versus_fp32")
    if vs and vs["slower_at_batch"]:
        lines.append("- INT8 cannot pay here: the final INT8 model ran " + ", ".join(
            f"{numbers.ratio(sp['median'], sp['ci95'])} at batch {b}"
            for b, sp in vs["speedup"].items()) + " against FP32 end to end; the candidate is the "
            "FP32 model (`quant=auto` picks the fastest artifact that passes every gate)")
    if q.get("float_outputs"):
        lines.append(f"- model outputs kept float: {', '.join(q['float_outputs'])} (no weights: INT8 "
                     "there gains microseconds and rounds the model's output to 8 bits)")
    rows = layer_rows(q)
    if rows:
        lines += ["", "| module | op | precision | SQNR dB | accuracy effect | FP32 ms | INT8 ms | gain ms |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in rows:
            lines.append(f"| {r['module']} | {r['op']} → {r['int8_kernel']} | {r['precision']} | "
                         f"{_fmt(r['sqnr_db'], '.1f')} | {_fmt(r['metric_effect'], '+.2f')} | "
                         f"{r['fp32_ms']:.3f} | {r['int8_ms']:.3f} | {r['gain_ms']:+.3f} |")
    search = q.get("search")
    if search:
        v = search["verdict"]
        lines += ["", f"**Mixed precision: {v['summary']}** ({v['full_evaluations']} full evaluations, "
                  f"limit {v['evaluation_limit']:.1f} for {v['quantizable_nodes']} nodes)", ""]
        t = v.get("trials")
        if t:  # ranked by groups: what it cost
            lines += [f"- ranked by {v['ranked_by']}: {v['units']} units, {t['ranking_trials']} "
                      f"ranking trials and {t['hand_back_trials']} hand-back trials on the hardest "
                      f"lines ({t['edited']} models made by editing the INT8 graph, "
                      f"{t['requantized']} quantized), {v['seconds']:.0f} s of a "
                      f"{v['time_budget_s']:g} s budget"
                      + (f"; **stopped by the time budget during the {v['stopped_by_budget']}**"
                         if v.get("stopped_by_budget") else ""), ""]
        lines += ["| step | float nodes | accuracy | drop | within budget | est. ms |",
                  "|---|---|---|---|---|---|"]
        for r in search["trace"]:
            shown = ", ".join(r["float_nodes"][:6]) + (f" (+{len(r['float_nodes']) - 6})"
                                                       if len(r["float_nodes"]) > 6 else "")
            lines.append(f"| {r.get('step', '')} | {shown or '(none)'} | {r['accuracy']:.2f} | "
                         f"{r['drop']:.2f} | {'yes' if r['within_budget'] else 'no'} | "
                         f"{r['estimated_ms']:.2f} |")
    return lines


def sensitivity_chart(q: dict, out: Path) -> None:
    from pipeline.report.plots import _plt

    plt = _plt()
    rows = [r for r in layer_rows(q) if r["sqnr_db"] is not None]
    fig, ax = plt.subplots(figsize=(7, 0.35 * max(len(rows), 3) + 1))
    ax.barh([r["module"] for r in rows], [r["sqnr_db"] for r in rows], color="tab:blue")
    ax.set_xlabel("output SQNR (dB, higher = less quantization error)")
    ax.invert_yaxis()
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def search_chart(q: dict, out: Path) -> None:
    from pipeline.report.plots import _plt

    plt = _plt()
    trace = q["search"]["trace"]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([r["estimated_ms"] for r in trace], [r["drop"] for r in trace], "o-")
    for k, r in enumerate(trace):
        ax.annotate(str(k + 1), (r["estimated_ms"], r["drop"]), fontsize=8)
    ax.axhline(q["search"]["verdict"]["budget_points"], color="red", lw=1, label="budget")
    ax.set_xlabel("estimated latency (ms, from the per-node profile)")
    ax.set_ylabel("accuracy drop vs FP16 (points)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
