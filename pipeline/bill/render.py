"""Bills as people read them: aligned text tables for the terminal, Markdown for the run report.

In: the records of ``pipeline.bill.llm``, ``pipeline.bill.artifact`` and
``pipeline.bill.capacity``. Out: strings (or lists of Markdown lines). Only formatting
lives here: every number is computed elsewhere, so the JSON output and the tables always agree.
Side-by-side comparisons share one row layout per kind of bill; each column is one bill.
"""
from __future__ import annotations

from pipeline.bill.capacity import CapacityPlan
from pipeline.bill.record import ArtifactBill, BillError, LlmBill, RunBill

MB = 1e6


def table(header: list[str], rows: list[list[str]]) -> str:
    """Plain text, first column left-aligned, the others right-aligned."""
    widths = [max(len(str(r[k])) for r in [header, *rows]) for k in range(len(header))]
    fmt = lambda r: "  ".join(str(c).ljust(w) if k == 0 else str(c).rjust(w)  # noqa: E731
                              for k, (c, w) in enumerate(zip(r, widths))).rstrip()
    return "\n".join([fmt(header), "  ".join("-" * w for w in widths), *map(fmt, rows)])


def md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(str(c) for c in r) + " |" for r in rows)]


def _n(x, digits: int = 2) -> str:
    return "—" if x is None else f"{x:,.{digits}f}"


def fmt_ms(x) -> str:
    """Milliseconds with three significant digits: GPU bounds are microseconds, CPU ones not."""
    return "—" if x is None else f"{x:.3g}"


# --- LLM ---------------------------------------------------------------------------------------

def llm_rows(b: LlmBill) -> list[tuple[str, str]]:
    m, s, g = b.memory, b.setting, b.gqa
    rows = [("weights GB", f"{m.weights_gb:.2f}"),
            ("KV cache GB (GiB)", f"{m.kv_cache_gb:.2f} ({m.kv_cache_gib:.2f})"),
            ("KV heads of query heads", f"{g.kv_heads} of {g.attention_heads}"),
            ("KV saving vs multi-head", "none (multi-head)" if g.kv_saving_factor == 1 else
             f"{g.kv_saving_factor:.1f}x, {g.kv_saving_gb:.2f} GB"),
            ("margin GB", f"{m.margin_gb:.2f}"),
            ("total GB", f"{m.total_gb:.2f}")]
    fit = b.fit
    if fit:
        rows += [("device GB", f"{fit.device_gb:.4g}" + (f" ({fit.usable_gb:.2f} usable)"
                                                       if s.keep_free else "")),
                 ("fits", f"yes, {fit.headroom_gb:.2f} GB free" if fit.fits
                  else f"NO, {-fit.headroom_gb:.2f} GB short"),
                 ("devices to hold it (split)", str(fit.devices_needed)),
                 (f"largest batch at {s.seq} tokens", str(fit.max_batch)),
                 (f"longest context at batch {s.batch}", f"{fit.max_seq_at_batch:,}")]
    cp = b.compile  # the host's memory to compile it here (docs/llm.md: larger than memory)
    rows.append(("compile peak GB, FP32 path / streaming",
                 f"{cp.fp32_path_peak_gb:.1f} / {cp.streaming_peak_gb:.1f}"))
    c = b.compute
    rows += [("GFLOPs per token", f"{c.flops_per_token / 1e9:.1f}"),
             (f"TFLOP/s for {c.target_tokens_per_s:g} tokens/s", f"{c.tflops_for_target:.2f}")]
    d = b.decode
    if d is not None and d.tokens_per_s_single_stream is not None:
        rows.append(("decode tokens/s, 1 stream (bandwidth)",
                     f"{d.tokens_per_s_single_stream:.1f}"))
    if d is not None and d.tokens_per_s_at_batch is not None:
        rows.append((f"decode tokens/s, batch {s.batch} (all)", f"{d.tokens_per_s_at_batch:.1f}"))
        rows.append(("decode bound by", d.bound_by))
    p = b.prefill
    if p:
        rows.append((f"prefill floor ms, {s.batch} x {s.seq} tokens",
                     f"{1e3 * p.seconds_bound:,.0f}"))
        rows.append(("prefill peak used", f"{p.peak_precision} {p.peak_tflops:g} TFLOP/s"))
    return rows


def llm_text(bills: dict[str, LlmBill], title: str) -> str:
    """One bill, or several side by side (columns: precisions or hardware profiles)."""
    first = next(iter(bills.values()))
    m, s = first.model, first.setting
    head = (f"{title}\n{m.params_b:g} B parameters, {m.layers} layers, "
            f"{m.attention_heads} query / {m.kv_heads} KV heads x {m.head_dim}, "
            f"context {m.max_context:,}; "
            f"batch {s.batch} x {s.seq} tokens, KV cache {s.kv_precision}, "
            f"margin {s.margin_gb:g} GB")
    columns = {name: dict(llm_rows(b)) for name, b in bills.items()}
    labels = list(dict.fromkeys(label for b in bills.values() for label, _ in llm_rows(b)))
    rows = [[label, *(columns[n].get(label, "—") for n in bills)] for label in labels]
    return head + "\n\n" + table(["", *bills], rows)


# --- ONNX artifacts ----------------------------------------------------------------------------

ARTIFACT_HEADER = ["model", "parameters", "weights MB (by type)", "GFLOPs", "GMACs",
                   "activations MB peak / all", "FLOP/byte", "roofline ms (bound)",
                   "measured p50 ms", "measured / roofline"]


def artifact_row(name: str, b: ArtifactBill) -> list[str]:
    by_type = ", ".join(f"{t} {v / MB:.2f}" for t, v in b.parameter_bytes_by_dtype.items())
    r, a, ratio = b.roofline, b.activations, b.measured_over_bound
    return [name, f"{b.parameters:,}", by_type or "0", f"{b.flops / 1e9:.3f}",
            f"{b.macs / 1e9:.3f}", f"{a.peak_bytes / MB:.2f} / {a.total_bytes / MB:.2f}",
            _n(r.intensity_flop_per_byte, 1), f"{fmt_ms(r.bound_ms)} ({r.bound_by})",
            _n(b.measured_p50_ms, 2), "—" if ratio is None else f"{ratio:.1f}x"]


def artifact_text(bills: dict[str, ArtifactBill]) -> str:
    first = next(iter(bills.values()))
    shape = next(iter(first.inputs.values()))
    lines = [f"ONNX bill at input {shape} on {first.hardware}", "",
             table(ARTIFACT_HEADER, [artifact_row(n, b) for n, b in bills.items()])]
    shown = "candidate" if "candidate" in bills else next(iter(bills))
    lines += ["", f"FLOPs by op type ({shown}): " + op_shares(bills[shown])]
    return "\n".join(lines)


def op_shares(b: ArtifactBill, top: int = 5) -> str:
    total = b.flops or 1.0
    parts = [f"{op} {100 * v['flops'] / total:.1f} %" for op, v in b.by_op.items() if v["flops"]]
    return ", ".join(parts[:top]) or "none"


def markdown(bill: RunBill | BillError | dict) -> list[str]:
    """The '## Bill' section of a run report (``pipeline.bill.artifact.run_bill``); ``bill``: the
    record, or report.json's bill read back."""
    if isinstance(bill, dict):
        bill = BillError(bill["error"]) if "error" in bill else RunBill.of(bill)
    if isinstance(bill, BillError):
        return ["## Bill", "", f"Not computed: {bill.error}"]
    hw, models = bill.hardware, bill.models
    peaks = ", ".join(f"{k} {v:g}" for k, v in hw.peak_tflops.items())
    lines = ["## Bill", "",
             f"One inference at batch {bill.batch}, input {bill.input_shape} (dynamic "
             f"axis: {bill.size_from}), on hardware "
             f"`{hw.name}`: memory bandwidth "
             f"{_n(hw.memory_bandwidth_gbs, 1)} GB/s, dense peak TFLOP/s {peaks or '—'} "
             f"({hw.source or 'no source given'}).", ""]
    src, export = bill.source_parameters, models.get("export")
    if src is not None and export is not None:
        lines += [_parameters_line(src, export.parameters,
                                   models.get("fp32", export).parameters), ""]
    lines += md_table(ARTIFACT_HEADER, [artifact_row(role, b) for role, b in models.items()])
    cand = models.get("candidate") or next(iter(models.values()))
    lines += ["", f"FLOPs by op type (candidate): {op_shares(cand)}. The roofline is a floor: "
              "max(compute at the dense peak of each op's precision, weights and I/O at full "
              "memory bandwidth); measured / roofline says how far from that limit the runtime "
              "runs. Activation peak: buffers freed after their last reader."]
    under = [f"{role} ({b.measured_over_bound:.2f}x)" for role, b in models.items()
             if (b.measured_over_bound or 1.0) < 1.0]
    if under:  # a floor the runtime beat: the peak figures, not the model, are wrong
        lines += ["", f"**Measured faster than the roofline:** {', '.join(under)}. The "
                      "hardware's peak figures are below what this machine reaches (a probe "
                      "taken while other processes kept it busy, or a datasheet that "
                      "understates it): the bounds here are not floors. Remove the cached probe "
                      "named above to measure the machine again."]
    return [*lines, *(["", *capacity_markdown(bill.capacity)] if bill.capacity else [])]


# --- capacity ----------------------------------------------------------------------------------

CAPACITY_HEADER = ["batch", "measured p99 ms", "throughput /s", "planned /s", "instances",
                   "batch fill ms", "p99 estimate ms", "meets p99"]


def capacity_rows(cap: CapacityPlan) -> list[list[str]]:
    return [[str(r.batch), f"{r.measured_p99_ms:.2f}", f"{r.throughput:,.1f}",
             f"{r.planned_throughput:,.1f}", str(r.instances), f"{r.batch_fill_ms:.1f}",
             f"{r.p99_estimate_ms:.1f}", "yes" if r.meets_p99 else "no"]
            for r in cap.options]


def capacity_summary(cap: CapacityPlan) -> list[str]:
    s = cap.slo
    lines = [f"Capacity for p99 <= {s.p99_ms:g} ms at {s.peak_qps:g} QPS peak, "
             f"{s.requests_per_day:,} requests/day, instances planned at "
             f"{100 * s.utilization:.0f} % of measured throughput: {cap.verdict}."]
    if cap.cost_per_million is not None:
        lines.append(f"Cost: {cap.cost_per_million:.4f} USD per million requests with the fleet "
                     f"sized for the peak all day ({cap.cost_per_day:.2f} USD/day at "
                     f"{cap.price_per_hour:g} USD/instance-hour); "
                     f"{cap.cost_per_million_autoscaled_floor:.4f} with perfect autoscaling.")
    elif cap.choice is not None:
        lines.append("Cost: no price for this hardware profile (set hardware.price_per_hour).")
    if cap.warning:
        lines.append(f"Warning: {cap.warning}.")
    return lines


def capacity_markdown(cap: CapacityPlan) -> list[str]:
    return ["### Capacity", "", *md_table(CAPACITY_HEADER, capacity_rows(cap)), "",
            *capacity_summary(cap)]


def capacity_text(cap: CapacityPlan, source: str) -> str:
    return "\n".join([f"Capacity plan from {source}", "",
                      table(CAPACITY_HEADER, capacity_rows(cap)), "", *capacity_summary(cap)])


def _parameters_line(network: int, export: int, optimized: int) -> str:
    """The parameter count through export and optimize, and why it moved where it did."""
    if export == network:
        same = "equal"
    elif export < network:  # the tracer keeps what the forward reads: an unused pooler is gone
        same = f"DIFFERENT: {network - export:,} the exported forward never reads"
    else:
        same = f"DIFFERENT: {export - network:,} more"
    if optimized < export:
        why = "each BatchNorm's scale and shift folded into its convolution, dead weights dropped"
    elif optimized > export:
        why = "fusions repack some weights, such as a fused attention's Q/K/V"
    else:
        why = "unchanged"
    return (f"Parameters: {network:,} in the network, {export:,} in the export ({same}); "
            f"{optimized:,} after optimize ({why}).")
