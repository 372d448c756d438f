"""A decoder run's report, evidence and publication.

In: the config, the ``Outcome`` and the run record. Out: ``report.json`` / ``report.md``
(one row per model: size of its weights, MatMul widths, perplexity, its rise over FP32, top-1
agreement and KL against FP32 at accuracy level 0, decode tokens/s and per-token p50/p99, time
to first token, speedup with its interval; the gate; the mixed search's trials; quant=auto's
candidates), and the evidence published with the candidate: the whole folder onnxruntime-genai
loads (``model.onnx``, its external data, ``genai_config.json``, the tokenizer files) as one
registry version.
"""
from __future__ import annotations

from pathlib import Path

from pipeline.core.artifact import plain
from pipeline.core.env import environment
from pipeline.report.run import interruption
from pipeline.measure.results import NO_SCORES, Role, TextScores


def _bytes(art) -> int:
    return sum(f.stat().st_size for f in Path(art.path).iterdir()
               if f.name.startswith("model.onnx"))


def rows(out) -> list[dict]:
    timings = out.bench.meta.get("timings", {})
    speedups = out.bench.meta.get("speedup_vs_fp32", {})
    seen, table = set(), []
    for role, art in out.models.items():
        if role == Role.candidate and art.digest in seen:
            key = next(r for r, a in out.models.items() if a.digest == art.digest and r != role)
        else:
            key = role
        seen.add(art.digest)
        s = TextScores.of(out.evals[role]) if role in out.evals else NO_SCORES
        t = timings.get(role) or timings.get(key) or (timings.get(Role.fp32) if art is
                                                       out.models[Role.fp32] else {}) or {}
        row = {"role": role, "digest": art.digest, "weights_mb": _bytes(art) / 1e6,
               "matmul_bits": art.meta.get("matmul_bits"),
               "matmul_float": art.meta.get("matmul_float"), **s.as_dict()}
        del row["tokens_scored"]  # the evaluation section says how much text: the same for all
        table.append({**row, "decode": t,
                      "speedup_vs_fp32": speedups.get(role) or speedups.get(key)})
    return table


def evaluation(out) -> dict:
    """How much text the gate's scores rest on: every model is scored on the same sequences."""
    ref = TextScores.of(out.evals[Role.fp32])
    return {"sequences": ref.sequences, "tokens_scored": ref.tokens_scored}


def body(cfg, out, record: list) -> dict:
    return {"status": "complete", "kind": "decoder", "model": cfg.model.name,
            "quant": cfg.quant.mode.value, "config": plain(cfg),
            "environment": environment(cfg.hardware), "decoder": plain(out.run),
            "settings": out.quant.settings, "verdict": out.verdict.as_dict(), "rows": rows(out),
            "evaluation": evaluation(out),
            "export": {"nodes": out.models[Role.fp32].meta.get("nodes"),
                       "parity_vs_transformers": out.models[Role.fp32].meta.get(
                           "parity_vs_transformers")},
            "timing": {k: out.bench.meta.get(k) for k in ("rounds", "seconds", "noisy",
                                                           "one_at_a_time")},
            "search": out.quant.trials, "auto": out.auto, "scoring": out.quant.scoring,
            "stages": record,
            "lineage": {role: {"digest": a.digest, "stage": a.stage, "parent": a.parent,
                               "path": str(a.path)} for role, a in out.models.items()}}


def _f(v, fmt: str = ".2f") -> str:
    return "-" if v is None else format(v, fmt)


def _rows(r: dict) -> str:
    """Sequences scored of the text, and why a sequential scoring stopped where it did."""
    if r.get("sequences") is None:
        return "-"
    if r.get("sequences_total") in (None, r["sequences"]):
        return str(r["sequences"])
    return f"{r['sequences']}/{r['sequences_total']} ({r.get('stopped')})"


def _trial_verdict(t: dict) -> str:
    return "stopped" if t.get("search_stopped") else "ranking only" if t.get("ranking") else \
        str(t["passed"])


def markdown(report: dict) -> str:
    lines = [f"# {report['model']} — decoder, quant={report['quant']}", "",
             f"**Gate: {'PASS' if report['verdict']['passed'] else 'FAIL'}**", "",
             *interruption(report)]
    s = report.get("settings") or {}
    lines += [f"MatMulNBits accuracy level {s.get('accuracy_level')} "
              f"({s.get('accuracy_level_reason')}); block {s.get('block_size')}, "
              f"{'symmetric' if s.get('symmetric') else 'asymmetric'}, 4-bit algorithm "
              f"{s.get('algorithm')}; {s.get('matmuls')} MatMuls. Scores against FP32 at "
              "accuracy level 0 (KL over FP32's top-k tokens and the rest as one outcome: a "
              "lower bound of the full KL).", ""]
    if s.get("reference", "FP32") != "FP32":  # past the memory budget (decoder_memory)
        lines += [f"Reference (the rows' fp32): {s['reference']}.", ""]
    ev = report.get("evaluation") or {}
    lines += [f"Scored on {_f(ev.get('sequences'), 'd')} evaluation sequences, "
              f"{_f(ev.get('tokens_scored'), 'd')} predicted tokens.", ""]
    c = report.get("scoring")
    if c:
        r, peak = c.get("reference") or {}, c.get("peak_rss") or {}
        lines += [f"Scoring: FP32 once on {r.get('sequences')} sequences ({r.get('tokens')} "
                  f"tokens, top {r.get('top_k')}, mean mass outside them "
                  f"{_f(r.get('tail_mass_mean'), '.4f')}); {c['candidate_scorings']} candidate "
                  f"scorings, {c['stopped_early']} stopped early, {c['sequences']} sequences and "
                  f"{c['tokens']} tokens in all ({c['full_passes']} full passes). Peak resident "
                  f"memory: {peak.get('stage_mb')} MB ({peak.get('stage')}), the pipeline's own "
                  f"process {peak.get('pipeline_mb')} MB.", ""]
    lines += ["| model | weights MB | MatMuls 4/8/float | perplexity | rise % | top-1 agree % "
              "| KL nats | sequences scored | tok/s | token ms p50/p99 | TTFT ms p50 "
              "| speedup (95% CI) |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in report.get("rows", []):
        bits = r.get("matmul_bits") or {}
        widths = (f"{bits.get('4', 0)}/{bits.get('8', 0)}/{r.get('matmul_float')}"
                  if bits else "float")
        d, sp = r.get("decode") or {}, r.get("speedup_vs_fp32")
        agree = r.get("top1_agreement")
        lines.append(
            f"| {r['role']} | {r['weights_mb']:.2f} | {widths} | {_f(r.get('perplexity'), '.3f')} "
            f"| {_f(r.get('perplexity_rise_pct'))} | {_f(None if agree is None else 100 * agree)} "
            f"| {_f(r.get('kl_mean'), '.4f')} | {_rows(r)} | {_f(d.get('tokens_per_s'), '.1f')} "
            f"| {_f(d.get('token_ms_p50'))} / {_f(d.get('token_ms_p99'))} "
            f"| {_f(d.get('ttft_ms_p50'))} | "
            + (f"{sp['median']:.2f}x ({sp['ci95'][0]:.2f}-{sp['ci95'][1]:.2f})" if sp else "1.00x")
            + " |")
    lines += ["", "## Gate", "", "| check | value | limit | verdict | detail |",
              "|---|---|---|---|---|"]
    for c in report["verdict"]["checks"]:
        lines.append(f"| {c['check']} | {_f(c['value'], '.3f')} | {c['limit']} | "
                     f"{'pass' if c['passed'] else 'FAIL'} | {c['detail']} |")
    if report.get("auto"):
        a = report["auto"]
        lines += ["", "## quant=auto", "", a["why"]]
        if a.get("mixed"):
            lines += ["", f"Mixed search {a['mixed']}."]
        lines += ["", "| candidate | passed | speedup | sequences scored |", "|---|---|---|---|"]
        for role, c in a["candidates"].items():
            lines.append(f"| {role} | {c['passed']} | {c['speedup']:.2f}x | "
                         f"{c.get('sequences') or '-'} ({c.get('stopped') or 'reference'}) |")
    if report.get("search"):
        lines += ["", "## Mixed search", "", "| trial | 4/8/float | perplexity rise % | "
                  "top-1 agree % | KL nats | sequences scored | passes |",
                  "|---|---|---|---|---|---|---|"]
        for t in report["search"]:
            w = t.get("widths")
            agree = t.get("top1_agreement")
            widths = "-" if not w else f"{w['4']}/{w['8']}/{w['float']}"
            lines.append(f"| {t['trial']} | {widths} "
                         f"| {_f(t.get('perplexity_rise_pct'))} "
                         f"| {_f(None if agree is None else 100 * agree)} "
                         f"| {_f(t.get('kl_mean'), '.4f')} | {_rows(t)} | "
                         f"{_trial_verdict(t)} |")
    if report.get("published"):
        lines += ["", f"Published: {report['published']}"]
    return "\n".join(lines) + "\n"


def evidence(out, report: dict) -> dict:
    cand = next(r for r in report["rows"] if r["role"] == Role.candidate)
    return {"config": report["config"], "lineage": report["lineage"], "verdict": out.verdict.as_dict(),
            "metrics": {k: cand.get(k) for k in ("perplexity", "perplexity_rise_pct",
                                                 "top1_agreement", "kl_mean")},
            "latency": cand.get("decode"), "environment": report["environment"],
            "evaluation_set": {"data": out.evals[Role.candidate].config.get("data"),
                               **report.get("evaluation", {})},
            "quantization": {"settings": report["settings"],
                             "matmul_bits": cand.get("matmul_bits")}}


def files(candidate) -> dict[str, Path]:
    """The folder's files other than model.onnx, by name: what onnxruntime-genai loads."""
    return {name: Path(candidate.path) / name for name in sorted(candidate.files)
            if name != "model.onnx"}


def shipment(cfg, out, report: dict):
    """What a decoder's run publishes (``pipeline.report.publish``): its report with its own
    renderer, the evidence, and the whole folder onnxruntime-genai loads."""
    from pipeline.report.publish import Shipment

    cand = out.models[Role.candidate]
    return Shipment(report, cfg.quant.mode.value, lambda: evidence(out, report),
                    render=markdown, files=files(cand))
