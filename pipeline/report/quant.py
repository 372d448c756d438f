"""The quantization part of the report: settings, explanation, per-layer table, search trace.

In: the ``QuantInfo`` the INT8 sub-recipe filled (``pipeline.recipes.int8``; the record and its
sub-records: ``pipeline.quant.int8_info``). Out: the JSON-ready dict for report.json
(``as_dict``: the record's fields are its keys), Markdown lines for report.md and two pictures
(a bar chart of per-node sensitivity and the mixed search's accuracy-versus-latency trace).
Every function here also takes the section as report.json holds it (a dict), read back into the
record once (``QuantInfo.from_json``), for callers that still hand the JSON on.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from pipeline.core import numbers
from pipeline.core.json_record import to_json
from pipeline.quant.int8_info import QuantInfo


def as_dict(info: QuantInfo) -> dict:
    return to_json(info)


def _record(q: QuantInfo | dict) -> QuantInfo:
    return q if isinstance(q, QuantInfo) else QuantInfo.from_json(q)


@dataclass(frozen=True)
class LayerRow:
    """One row of the per-layer table."""
    module: str
    node: str
    op: str
    int8_kernel: str
    precision: str
    sqnr_db: float | None
    metric_effect: float | None
    fp32_ms: float
    int8_ms: float
    gain_ms: float


def layer_rows(q: QuantInfo | dict) -> list[LayerRow]:
    """One row per node of the final model: module, ops, precision, SQNR, effect, times. The
    module is the source module's path where explain found one (else the node name); two nodes of
    one module (an attention's two MatMuls) add their node's own last name in brackets."""
    q = _record(q)
    sens = {r.node: r for r in q.sensitivity}
    kept = [r for r in (q.explain.nodes if q.explain else ())
            if r.precision != "float" or r.node in sens]
    shared = Counter(r.module for r in kept)
    rows = []
    for r in kept:
        s = sens.get(r.node)
        module = r.module or r.node
        if r.module and shared[r.module] > 1:
            module = f"{module} [{r.node.rstrip('/').rpartition('/')[2]}]"
        rows.append(LayerRow(module, r.node, r.fp32_op, r.int8_op, r.precision,
                             s.sqnr_db if s else None, s.metric_effect if s else None,
                             r.fp32_ms, r.int8_ms, r.gain_ms))
    return rows


def _fmt(v, spec):
    return "–" if v is None else format(v, spec)


def _ratio(sp) -> str:
    return numbers.ratio(None) if sp is None else numbers.ratio(sp.median, (sp.low, sp.high))


def markdown(q: QuantInfo | dict) -> list[str]:
    """The report.md section, top to bottom: how it was quantized, what the target made of it,
    what the latency steps kept float, the per-layer table and the mixed search."""
    q = _record(q)
    s = q.settings
    lines = ["", "## Quantization", "",
             f"- settings: activations {s.activation_type}, weights {s.weight_type}, "
             f"reduce_range {s.reduce_range}, format {s.format} ({s.reason})",
             f"- calibration: {q.calibration}"
             + ("; ranked on the hardest lines: " + ", ".join(
                 f"{k} {v:.2f}" for k, v in q.calibration_ranking.items())
                if q.calibration_ranking else "")]
    lines += _smoothing(q) + _source(q) + _explanation(q) + _latency(q)
    lines += _layer_table(q) + _search(q)
    return lines


def _smoothing(q: QuantInfo) -> list[str]:
    """SmoothQuant-style migration: which strength won on the hardest samples."""
    sm = q.smoothing
    if not sm:
        return []
    return [f"- outlier smoothing: {sm.activations} MatMul inputs, largest channel up "
            f"to {sm.largest_outlier_ratio:.0f}x the median one; {sm.metric} on "
            "the hardest samples, all INT8: " + ", ".join(
                f"{'no smoothing' if k == 'off' else 'alpha ' + k} {v:.4f}"
                for k, v in sm.scores.items())
            + f"; kept: {'none' if sm.chosen == 'off' else 'alpha ' + str(sm.chosen)}"]


def _source(q: QuantInfo) -> list[str]:
    """Dynamic INT8 of a fused transformer: which graph was quantized, and why."""
    src = q.source
    if not src:
        return []
    if src.ms is None:  # one graph only
        return [f"- dynamic INT8 of the {src.chosen} graph ({src.why})"]
    return [f"- dynamic INT8 of the fused graph {src.ms.fused:.2f} ms, of the "
            f"unfused export {src.ms.export:.2f} ms at batch {src.batch_size} (the export ran "
            f"{_ratio(src.export_over_fused_speedup)} the fused one): kept the {src.chosen} one"]


def _explanation(q: QuantInfo) -> list[str]:
    ex = q.explain
    if not ex:
        return []
    return [f"- on this target: {ex.unfused_quantize} QuantizeLinear and "
            f"{ex.unfused_dequantize} DequantizeLinear left unfused; INT8 kernels "
            f"{', '.join(ex.int8_kernels) or 'none'}; still float: "
            f"{', '.join(ex.float_compute) or 'nothing'}",
            f"- profile at batch {ex.batch_size}: FP32 {ex.fp32_total_ms:.2f} ms, "
            f"INT8 {ex.int8_total_ms:.2f} ms (Q/DQ {ex.qdq_overhead_ms:.2f} ms)"]


def _latency(q: QuantInfo) -> list[str]:
    """What the latency steps tried float: the node trial, the regions, the check against FP32,
    the outputs."""
    lines = []
    trial = q.node_trial
    if trial:
        if trial.float_nodes:
            lines.append(f"- profiled slower in INT8: {', '.join(trial.float_nodes)}; keeping them "
                         f"float ran {_ratio(trial.speedup_over_all_int8)} "
                         f"the all-INT8 model end to end: "
                         + ("kept float" if q.latency_exclusions else "left INT8"))
        if trial.stayed_int8:
            lines.append(f"- profiled slower in INT8 but left INT8: {', '.join(trial.stayed_int8)} "
                         "(between INT8 neighbours onnxruntime keeps the Q/DQ pair and the INT8 "
                         "kernel)")
    if q.regions:  # quant.region_trials: whole blocks tried float, timed end to end
        from pipeline.report.auto import regions_markdown

        lines += regions_markdown(q.regions)
    vs = q.versus
    if vs and vs.slower_at_batch:
        lines.append("- INT8 cannot pay here: the final INT8 model ran " + ", ".join(
            f"{_ratio(sp)} at batch {b}" for b, sp in vs.speedup.items())
            + " against FP32 end to end; the candidate is the FP32 model (`quant=auto` picks the "
            "fastest artifact that passes every gate)")
    if q.float_outputs:
        lines.append(f"- model outputs kept float: {', '.join(q.float_outputs)} (no weights: INT8 "
                     "there gains microseconds and rounds the model's output to 8 bits)")
    return lines


def _layer_table(q: QuantInfo) -> list[str]:
    rows = layer_rows(q)
    if not rows:
        return []
    lines = ["", "| module | op | precision | SQNR dB | accuracy effect | FP32 ms | INT8 ms | gain ms |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.module} | {r.op} → {r.int8_kernel} | {r.precision} | "
                     f"{_fmt(r.sqnr_db, '.1f')} | {_fmt(r.metric_effect, '+.2f')} | "
                     f"{r.fp32_ms:.3f} | {r.int8_ms:.3f} | {r.gain_ms:+.3f} |")
    return lines


def _search(q: QuantInfo) -> list[str]:
    """The mixed search: its verdict, what it cost, and each full evaluation."""
    if not q.search:
        return []
    v, t = q.search.verdict, q.search.verdict.trials
    lines = ["", f"**Mixed precision: {v.summary}** ({v.full_evaluations} full evaluations, "
             f"limit {v.evaluation_limit:.1f} for {v.quantizable_nodes} nodes)", "",
             f"- ranked by {v.ranked_by}: {v.units} units, {t.ranking_trials} "
             f"ranking trials and {t.hand_back_trials} hand-back trials on the hardest "
             f"lines ({t.edited} models made by editing the INT8 graph, "
             f"{t.requantized} quantized), {v.seconds:.0f} s of a "
             f"{v.time_budget_s:g} s budget"
             + (f"; **stopped by the time budget during the {v.stopped_by_budget}**"
                if v.stopped_by_budget else ""), "",
             "| step | float nodes | accuracy | drop | within budget | est. ms |",
             "|---|---|---|---|---|---|"]
    for r in q.search.trace:
        shown = ", ".join(r.float_nodes[:6]) + (f" (+{len(r.float_nodes) - 6})"
                                                if len(r.float_nodes) > 6 else "")
        lines.append(f"| {r.step} | {shown or '(none)'} | {r.accuracy:.2f} | "
                     f"{r.drop:.2f} | {'yes' if r.within_budget else 'no'} | "
                     f"{r.estimated_ms:.2f} |")
    return lines


def sensitivity_chart(q: QuantInfo | dict, out: Path) -> None:
    from pipeline.report.plots import _plt

    plt = _plt()
    rows = [r for r in layer_rows(q) if r.sqnr_db is not None]
    # a user's ONNX file names its nodes by path ("/_model/decoder/rnn/LSTM"): long names keep
    # their ends, and the figure widens for them, so no label is cut (nor does matplotlib warn
    # on the terminal that it could not lay them out)
    labels = [r.module if len(r.module) <= 48 else "…" + r.module[-47:] for r in rows]
    width = 7 + 0.07 * max((len(x) for x in labels), default=0)
    fig, ax = plt.subplots(figsize=(width, 0.35 * max(len(rows), 3) + 1))
    ax.barh(range(len(rows)), [r.sqnr_db for r in rows], color="tab:blue")
    ax.set_yticks(range(len(rows)), labels)  # by position: two shortened names stay two bars
    ax.set_xlabel("output SQNR (dB, higher = less quantization error)")
    ax.invert_yaxis()
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def search_chart(q: QuantInfo | dict, out: Path) -> None:
    from pipeline.report.plots import _plt

    plt = _plt()
    search = _record(q).search
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([r.estimated_ms for r in search.trace], [r.drop for r in search.trace], "o-")
    for k, r in enumerate(search.trace):
        ax.annotate(str(k + 1), (r.estimated_ms, r.drop), fontsize=8)
    ax.axhline(search.verdict.budget_points, color="red", lw=1, label="budget")
    ax.set_xlabel("estimated latency (ms, from the per-node profile)")
    ax.set_ylabel("accuracy drop vs FP16 (points)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
