"""A decoder run's report, evidence and publication.

In: the config, the ``Outcome`` and the run record. Out: ``report.json`` / ``report.md``
(one row per model: size of its weights, MatMul widths, perplexity, its rise over FP32, top-1
agreement and KL against FP32 at accuracy level 0, decode tokens/s and per-token p50/p99, time
to first token, speedup with its interval; the gate; the mixed search's trials; quant=auto's
candidates), and the evidence published with the candidate: the whole folder onnxruntime-genai
loads (``model.onnx``, its external data, ``genai_config.json``, the tokenizer files) as one
registry version. The body is a ``DecoderReport`` (``pipeline.report.decoder_body``), built once
from the ``Outcome``; report.md reads its fields, whether it is given the typed report or
report.json's body as the publish flow updates it (status, what was published).
"""
from __future__ import annotations

from pathlib import Path

from pipeline.core.json_record import to_json
from pipeline.measure.decode_summary import NOT_TIMED
from pipeline.measure.results import Role
from pipeline.recipes.decoder_record import (DecoderAuto, PeakRss, ReferenceCost, ScoringCost,
                                             Trial)
from pipeline.report.decoder_body import DecoderReport, EvaluatedText, ModelRow
from pipeline.report.run import interruption


def report(cfg, out, record: list) -> DecoderReport:
    """The run's report, built once from the recipe's ``Outcome``."""
    return DecoderReport.of(cfg, out, record)


def _f(v, fmt: str = ".2f") -> str:
    return "-" if v is None else format(v, fmt)


def _rows(sequences, total, stopped) -> str:
    """Sequences scored of the text, and why a sequential scoring stopped where it did."""
    if sequences is None:
        return "-"
    if total in (None, sequences):
        return str(sequences)
    return f"{sequences}/{total} ({stopped})"


def _trial_verdict(t: Trial) -> str:
    return "stopped" if t.search_stopped else "ranking only" if t.ranking else str(t.passed)


def markdown(report: DecoderReport | dict) -> str:
    """report.md, from the typed report or from report.json's body (the publish flow renders
    the body it updates: the status, what was published)."""
    body = report if isinstance(report, dict) else to_json(report)
    r = DecoderReport.read(body)
    lines = [f"# {r.model} — decoder, quant={r.quant}", "",
             f"**Gate: {'PASS' if r.verdict.passed else 'FAIL'}**", "", *interruption(body)]
    s = r.settings
    lines += [f"MatMulNBits accuracy level {s.accuracy_level} "
              f"({s.accuracy_level_reason}); block {s.block_size}, "
              f"{'symmetric' if s.symmetric else 'asymmetric'}, 4-bit algorithm "
              f"{s.algorithm}; {s.matmuls} MatMuls. Scores against FP32 at "
              "accuracy level 0 (KL over FP32's top-k tokens and the rest as one outcome: a "
              "lower bound of the full KL).", ""]
    if s.reference not in (None, "FP32"):  # past the memory budget (decoder_memory)
        lines += [f"Reference (the rows' fp32): {s.reference}.", ""]
    ev = r.evaluation or EvaluatedText()
    lines += [f"Scored on {_f(ev.sequences, 'd')} evaluation sequences, "
              f"{_f(ev.tokens_scored, 'd')} predicted tokens.", ""]
    lines += _scoring(r.scoring)
    lines += ["| model | weights MB | MatMuls 4/8/float | perplexity | rise % | top-1 agree % "
              "| KL nats | sequences scored | tok/s | token ms p50/p99 | TTFT ms p50 "
              "| speedup (95% CI) |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    lines += [_row(row) for row in r.rows]
    lines += ["", "## Gate", "", "| check | value | limit | verdict | detail |",
              "|---|---|---|---|---|"]
    for c in r.verdict.checks:
        lines.append(f"| {c.check} | {_f(c.value, '.3f')} | {c.limit} | "
                     f"{'pass' if c.passed else 'FAIL'} | {c.detail} |")
    lines += _auto(r.auto) + _search(r.search)
    if r.published:
        lines += ["", f"Published: {r.published}"]
    return "\n".join(lines) + "\n"


def _scoring(c: ScoringCost | None) -> list[str]:
    if not c or c == ScoringCost():  # a body without the tally (an empty one) shows none
        return []
    ref, peak = c.reference or ReferenceCost(), c.peak_rss or PeakRss()
    return [f"Scoring: FP32 once on {ref.sequences} sequences ({ref.tokens} "
            f"tokens, top {ref.top_k}, mean mass outside them "
            f"{_f(ref.tail_mass_mean, '.4f')}); {c.candidate_scorings} candidate "
            f"scorings, {c.stopped_early} stopped early, {c.sequences} sequences and "
            f"{c.tokens} tokens in all ({c.full_passes} full passes). Peak resident "
            f"memory: {peak.stage_mb} MB ({peak.stage}), the pipeline's own "
            f"process {peak.pipeline_mb} MB.", ""]


def _row(r: ModelRow) -> str:
    bits = r.matmul_bits or {}
    widths = f"{bits.get(4, 0)}/{bits.get(8, 0)}/{r.matmul_float}" if bits else "float"
    d, sp, agree = r.decode or NOT_TIMED, r.speedup_vs_fp32, r.top1_agreement
    return (f"| {r.role} | {r.weights_mb:.2f} | {widths} | {_f(r.perplexity, '.3f')} "
            f"| {_f(r.perplexity_rise_pct)} | {_f(None if agree is None else 100 * agree)} "
            f"| {_f(r.kl_mean, '.4f')} | {_rows(r.sequences, r.sequences_total, r.stopped)} "
            f"| {_f(d.tokens_per_s, '.1f')} "
            f"| {_f(d.token_ms_p50)} / {_f(d.token_ms_p99)} "
            f"| {_f(d.ttft_ms_p50)} | "
            + (f"{sp.median:.2f}x ({sp.low:.2f}-{sp.high:.2f})" if sp else "1.00x") + " |")


def _auto(a: DecoderAuto | None) -> list[str]:
    if not a or a == DecoderAuto():
        return []
    lines = ["", "## quant=auto", "", a.why]
    if a.mixed:
        lines += ["", f"Mixed search {a.mixed}."]
    lines += ["", "| candidate | passed | speedup | sequences scored |", "|---|---|---|---|"]
    for role, c in a.candidates.items():
        lines.append(f"| {role} | {c.passed} | {c.speedup:.2f}x | "
                     f"{c.sequences or '-'} ({c.stopped or 'reference'}) |")
    return lines


def _search(trials: list[Trial]) -> list[str]:
    if not trials:
        return []
    lines = ["", "## Mixed search", "", "| trial | 4/8/float | perplexity rise % | "
             "top-1 agree % | KL nats | sequences scored | passes |",
             "|---|---|---|---|---|---|---|"]
    for t in trials:
        w, s = t.widths, t.scores
        agree = s.top1_agreement if s else None
        widths = "-" if not w else f"{w.four}/{w.eight}/{w.float_}"
        scored = _rows(s.sequences, s.sequences_total, s.stopped) if s else \
            _f(t.proxy_sequences, "d")
        lines.append(f"| {t.trial} | {widths} "
                     f"| {_f(s.perplexity_rise_pct if s else None)} "
                     f"| {_f(None if agree is None else 100 * agree)} "
                     f"| {_f(s.kl_mean if s else None, '.4f')} | {scored} | "
                     f"{_trial_verdict(t)} |")
    return lines


def evidence(out, report: DecoderReport) -> dict:
    """The manifest published with the candidate."""
    cand = report.row(Role.candidate)
    return {"config": report.config, "lineage": to_json(report.lineage),
            "verdict": out.verdict.as_dict(),
            "metrics": {"perplexity": cand.perplexity,
                        "perplexity_rise_pct": cand.perplexity_rise_pct,
                        "top1_agreement": cand.top1_agreement, "kl_mean": cand.kl_mean},
            "latency": to_json(cand.decode), "environment": report.environment,
            "evaluation_set": {"data": out.evals[Role.candidate].config.get("data"),
                               **to_json(report.evaluation)},
            "quantization": {"settings": to_json(report.settings),
                             "matmul_bits": to_json(cand.matmul_bits)}}


def files(candidate) -> dict[str, Path]:
    """The folder's files other than model.onnx, by name: what onnxruntime-genai loads."""
    return {name: Path(candidate.path) / name for name in sorted(candidate.files)
            if name != "model.onnx"}


def shipment(cfg, out, report: DecoderReport):
    """What a decoder's run publishes (``pipeline.report.publish``): its report's body with its
    own renderer, the evidence, and the whole folder onnxruntime-genai loads."""
    from pipeline.report.publish import Shipment

    cand = out.models[Role.candidate]
    return Shipment(to_json(report), cfg.quant.mode.value, lambda: evidence(out, report),
                    render=markdown, files=files(cand))
