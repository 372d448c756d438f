"""The run report: ``report.json`` and ``report.md``, one row per stage's model.

In: the typed body (``pipeline.report.body.RunReport``, built by ``pipeline.report.manifest``)
or a decoder's dict body with its own renderer, and the run's end (figures, publishing, a
signal). Out: a run folder under ``<workdir>/runs/`` written atomically, and the path of its
``report.md``. Each row shows one step's model (size, nodes, the task's metrics as its contract
names them, agreement with FP16, p50/p99 per batch size, speedup against the fastest float
baseline), so the effect of each step is visible on its own line.
"""
from __future__ import annotations

import contextlib
import json
import shutil
import time
import uuid
from pathlib import Path

from pipeline.core import numbers
from pipeline.core.leftovers import temp_name
from pipeline.measure.bench_record import LoadRecord
from pipeline.measure.results import Role
from pipeline.report.body import (Environment, FusionReport, InterruptedReport, Interruption,
                                  MetricSpec, NotJudged, Publication, RunEnd, RunReport,
                                  TimingReport, as_json, stages)


def markdown(report: RunReport | InterruptedReport, end: RunEnd | None = None) -> str:
    """report.md: the rows, the gate, then each section the run has, in reading order."""
    end = end or RunEnd()
    if isinstance(report, InterruptedReport):  # stopped in a stage
        return _interrupted_markdown(report)
    metrics = report.metrics
    bs = list(report.row(Role.candidate).latency)
    primary = report.primary
    head = ("| step | size | nodes | "
            + "".join(f"{m.name} {m.unit}".rstrip() + " | " for m in metrics)
            + "agree fp16 | "
            + " | ".join(f"p50 / p99 b{b} | speedup b{b}" for b in bs) + " |")
    lines = [f"# {report.model} — quant={report.quant}", "",
             f"**Gate: {report.verdict.summary}**", "", *_interruption(end),
             *(line for w in report.warnings for line in (f"**Warning:** {w}", "")),
             head,
             "|" + "---|" * (4 + len(metrics) + 2 * len(bs))]
    lines += _rows(report, bs) + _notes(report) + _gate(report)
    lines += _timing(report.timing)
    lines += _sections(report, primary.name if primary else None,
                       primary.unit if primary else "%")
    lines += _load(report.load)
    for fname, status in end.figures.items():
        lines += ["", f"![{fname}]({fname})" if status == "ok" else f"{fname}: {status}"]
    lines += _fusion(report.fusion) + _stages(report.stages)
    lines += _environment(report.environment) + _published(end)
    return "\n".join(lines) + "\n"


def _rows(report: RunReport, bs: list) -> list[str]:
    """One table row per artifact: size, nodes, each metric, agreement, latency and speedup per batch."""
    lines = []
    for r in report.rows:
        values = (r.metrics.get(m.name) for m in report.metrics)
        cells = [r.step, numbers.megabytes(r.size_mb), numbers.count(r.nodes),
                 *(numbers.number(v, 2 if m.unit == "%" else 4)
                   if isinstance(v, (int, float)) else numbers.NONE
                   for m, v in zip(report.metrics, values)),
                 numbers.percent(r.agreement_with_fp16, fraction=True)]
        for b in bs:
            lat = r.latency.get(b)
            cells += [f"{numbers.number(lat.p50)} / {numbers.ms(lat.p99)}",
                      numbers.ratio(lat.speedup_vs_fastest_float,
                                    list(lat.speedup_ci95) if lat.speedup_ci95 else None)] \
                if lat else ["not timed", numbers.NONE]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _notes(report: RunReport) -> list[str]:
    """What the speedups are against, what label-free metrics measure, the A/A checks."""
    lines = []
    lines += ["", "Speedup is against the fastest float baseline at that batch size (p50 ratio; the "
              "candidate's is the median of per-round ratios, with its 95 % CI)."]
    if any(m.against == "fp16_outputs" for m in report.metrics):
        gold = [m.name for m in report.metrics if m.against == "gold_scores"]
        lines.append("No labels: every row's metrics measure agreement with the FP16 baseline's "
                     "outputs on the same inputs (the FP16 row agrees with itself by construction)"
                     + (f", except {', '.join(gold)}: against the data's gold scores." if gold
                        else "."))
    for b, aa in report.aa_check.items():
        lines.append(f"A/A check at batch {b} (FP32 against a second copy of itself): "
                     f"{numbers.ratio(aa.median, list(aa.ci95))}.")
    return lines


def _gate(report: RunReport) -> list[str]:
    """The gate's checks, each value and limit in its own unit."""
    lines = []
    lines += ["", "## Gate", "", "| check | value | limit | verdict | detail |", "|---|---|---|---|---|"]
    for c in report.verdict.checks:
        fmt = _gate_format(c.name, report.metrics)
        lines.append(f"| {c.name} | {fmt(c.value)} | {fmt(c.limit)} | "
                     f"{'pass' if c.passed else '**FAIL**'} | {c.detail} |")
    return lines


def _timing(timing: TimingReport) -> list[str]:
    """How each batch was timed: rounds, noise, core states, slow shapes, cold starts."""
    lines = ["", "## Timing", ""]
    for b, t in timing.batches.items():
        cs = t.core_state
        noisy = ("the core state changed and the speedup with it" if cs and cs.changed
                 else "CI still wider than the bound")
        meaning = t.size_axis.meaning if t.size_axis else "size"
        # an input with no dynamic axis but the batch has no sizes of its own to list
        sizes = ("" if meaning == "batch" else f"; sizes timed along its {meaning} axis: "
                 f"{', '.join(str(w.size) for w in t.per_size)}")
        lines.append(f"- batch {b}: {t.rounds} interleaved rounds in {t.seconds} s"
                     f"{f' — **noisy**: {noisy}' if t.noisy else ''}{sizes}")
        if cs and cs.states:
            lines.append("  - core state (core-to-core round trip): " + "; ".join(
                f"{st.round_trip_ns:.0f} ns in {st.share:.0%} of rounds, "
                f"{st.speedup_vs_fastest_float.median:.2f}x" for st in cs.states))
        for o in t.shape_outliers:
            lines.append(f"  - slow shape: {o.model} at size {o.size}: p50 "
                         f"{o.p50:.2f} ms where its other shapes predict "
                         f"{o.expected_p50:.2f} ms")
    for role, cold in timing.cold_start_ms.items():
        if cold.error is not None:
            lines.append(f"- cold start {role}: failed ({cold.error})")
        else:
            lines.append(f"- cold start {role}: {cold.total_ms:.0f} ms to first result "
                         f"(import {cold.import_ms:.0f}, session {cold.session_ms:.0f}, "
                         f"first inference {cold.first_inference_ms:.0f})")
    if timing.input_contract:
        lines.append("- input contract (measured): " + " x ".join(
            f"{d.min}" if d.min == d.max else f"{d.min}..{d.max}"
            for d in timing.input_contract.shape))
    return lines


def _sections(report: RunReport, primary: str | None, unit: str) -> list[str]:
    """The optional sections each capability renders: auto, runtimes, bill, pruning,
    quantization. Each gets its section as its capability gave it to the body."""
    lines = []
    if report.auto:
        from pipeline.report.auto import markdown as auto_markdown

        lines += auto_markdown(report.auto, primary, unit)
    if report.runtimes:
        from pipeline.runtimes.render import markdown as runtimes_markdown

        lines += ["", *runtimes_markdown(report.runtimes, primary, unit)]
    if report.bill:
        from pipeline.bill.render import markdown as bill_markdown

        lines += ["", *bill_markdown(report.bill)]
    if report.pruning:
        from pipeline.prune.report import markdown as pruning_markdown

        lines += pruning_markdown(report.pruning, {m.name: m.unit for m in report.metrics})
    if report.quantization:
        from pipeline.report.quant import markdown as quant_markdown

        lines += quant_markdown(report.quantization)
    return lines


def _load(load: LoadRecord | None) -> list[str]:
    """The load test (bench.mode=load or soak), one row per model and policy."""
    lines = []
    if load:
        lines += ["", f"## Load test (open-loop Poisson, p99 target {load.slo_p99_ms} ms)", "",
                  "| model | policy | max QPS within target | throughput there | steps |",
                  "|---|---|---|---|---|"]
        for role, entry in load.models.items():
            for policy, e in entry.curves():
                lines.append(f"| {role} | {policy} | {numbers.rate(e.max_qps_within_slo)} | "
                             f"{numbers.rate(e.throughput_at_max)} | {len(e.steps)} |")
            if entry.soak:
                soak, mem = entry.soak, entry.soak.memory
                slope = mem.slope_mb_per_min
                lines.append(f"| {role} | soak {soak.seconds:.0f} s at "
                             f"{soak.qps:.0f}/s | RSS slope "
                             f"{'n/a' if slope is None else f'{slope:.2f} MB/min'} | "
                             f"{'**LEAK**' if mem.leak else 'no leak'} | |")
    return lines


def _fusion(fused: FusionReport | None) -> list[str]:
    """A transformer's fusions (onnxruntime.transformers)."""
    lines = []
    if fused:
        lines += ["", "## Transformer fusions", "",
                  f"onnxruntime.transformers ({fused.model_type}, {fused.num_heads} heads, "
                  f"hidden {fused.hidden_size}): {fused.nodes_before} nodes before, "
                  f"{fused.nodes_after} after; parity vs the export: max |diff| "
                  f"{fused.parity_vs_export.max_abs_diff:.2e}, agreement "
                  f"{fused.parity_vs_export.decoded_agreement:.1%}.", "",
                  "| fusion | count |", "|---|---|"]
        lines += [f"| {op} | {n} |" for op, n in fused.fusions.items()]
        done = fused.attention_fused
        if fused.attention_blocks and 0 < done < fused.attention_blocks:
            lines += ["", f"Attention fused in {done} of the export's {fused.attention_blocks} "
                          f"attention blocks (a Softmax each): the other "
                          f"{fused.attention_blocks - done} run unfused, as the export wrote them "
                          "(onnxruntime.transformers' patterns did not match them)."]
    return lines


def _environment(env: Environment) -> list[str]:
    """Where the numbers were taken."""
    rt = env.runtime
    return ["", "## Environment", "", f"- CPU: {env.cpu.model} "
            f"({env.cpu.logical_cores} logical cores; {', '.join(env.cpu.flags)})",
            f"- Provider: {env.provider}, threads {env.threads}"
            + (f"; runtime {rt.name}, precision {rt.precision} "
               f"({', '.join(f'{k} {v}' for k, v in rt.versions.items())})" if rt else ""),
            "- Tools: " + ", ".join(f"{k} {v}" for k, v in env.tools.items())]


def _published(end: RunEnd) -> list[str]:
    """What publishing did, or is doing."""
    publish = end.publish
    if end.published:
        return ["", f"Published to `{end.published}`."]
    if publish and publish.status == "pending":  # written before publishing; updated after it
        return ["", f"Publishing to the {publish.backend} registry (this report is updated "
                    "when it ends; if it still says so, the run was interrupted)."]
    if publish and publish.status == "failed":
        return ["", f"**Publishing failed** (the gate passed; nothing was published): "
                    f"{publish.error}"]
    return []


def _gate_format(check: str, metrics: tuple[MetricSpec, ...]):
    """How a gate check's value and limit read (``pipeline.gate`` names the checks): a drop in
    the unit of its metric (points of a percentage, else four decimals: a cosine's drops live in
    the third), an agreement or the A/A deviation as a percentage, a speedup as a ratio."""
    if check.endswith("_drop"):
        name = check[:-len("_drop")]
        metric = next((m for m in metrics if (m.primary if name == "accuracy"
                                              else m.name == name)), None)
        return numbers.points if (metric.unit if metric else "%") == "%" else (
            lambda v: numbers.number(v, 4))
    kinds = {"output_agreement": lambda v: numbers.percent(v, fraction=True),
             "aa_check": lambda v: numbers.percent(v, fraction=True),
             "speedup_ci_low": numbers.ratio, "no_slower_than_given": numbers.ratio,
             "slo_p99_ms": numbers.ms,
             "model_mb": numbers.megabytes, "benchmark_sane": numbers.count,
             "same_environment": numbers.count, "finite_outputs": numbers.count}
    return kinds.get(check, numbers.number)


def _stages(record) -> list[str]:
    lines = ["", "## Stages", "", "| stage | status | time | digest |", "|---|---|---|---|"]
    for s in record:
        lines.append(f"| {s.label} | {'reused' if s.reused else 'built'} | "
                     f"{numbers.seconds(s.seconds)} | `{s.digest[:16]}` |")
    return lines


def _interrupted_markdown(report: InterruptedReport) -> str:
    lines = [f"# {report.model} — quant={report.quant}", "",
             f"**Gate: {report.verdict.summary}**", "",
             "The run was stopped by a signal; nothing was judged or published. "
             + ("The stages below are cached: the same command resumes from there."
                if report.stages else "No stage had finished.")]
    if report.stages:
        lines += _stages(report.stages)
    return "\n".join(lines) + "\n"


def write_interrupted(cfg, record: list, e) -> str | None:
    """The report of a run stopped by a signal (``pipeline.core.interrupt``), from what is known: the
    config, the stages done and where it stopped; never judged, never published. Returns its
    path, or None when the disk refuses it (the run still ends with its one line)."""
    from pipeline.core.artifact import plain

    done = stages(record)
    e.at(f"after stage {done[-1].label}" if done else "before the first stage")
    report = InterruptedReport(cfg.model.name, cfg.quant.mode.value, plain(cfg), done,
                               NotJudged(f"not judged: interrupted {e.where} ({e.name})"))
    end = RunEnd("interrupted", interrupted=Interruption(e.name, e.where, e.exit_code))
    try:
        return str(write(cfg.workdir, report, end=end))
    except OSError:
        return None


def _texts(report, end: RunEnd, render) -> tuple[dict, str]:
    """report.json's content and report.md's text. A dict body (a decoder's) is rendered by
    its own ``render`` from the JSON it writes; a typed one from its fields and its end."""
    data = as_json(report, end)
    if isinstance(report, dict):
        if render is None:
            raise TypeError("a dict report body is written with its own renderer (render=)")
        return data, render(data)
    return data, (render or markdown)(report, end)


def write(workdir: str, report, figures: dict | None = None, render=None,
          end: RunEnd | None = None) -> Path:
    """Write report.json, report.md, verdict.json and the figures (name -> draw(path)) of a
    ``RunReport``, an ``InterruptedReport`` or a decoder's dict body; ``render``: the report.md
    writer (a decoder's report has its own); ``end``: what happened after the body was built
    (default: what a dict body says, else nothing yet)."""
    end = RunEnd.of(report) if end is None else end
    runs = Path(workdir) / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    name = time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + uuid.uuid4().hex[:6]
    tmp = runs / temp_name(name)  # its pid tells a later run whether it may be removed
    tmp.mkdir()
    try:
        end.figures = {}
        for fname, draw in (figures or {}).items():
            try:
                draw(tmp / fname)
                end.figures[fname] = "ok"
            except Exception as e:  # noqa: BLE001 - a picture must not cost the evidence
                end.figures[fname] = f"failed: {type(e).__name__}: {e}"
        data, text = _texts(report, end, render)
        (tmp / "report.json").write_text(json.dumps(data, indent=2, sort_keys=True, default=str))
        (tmp / "report.md").write_text(text)
        (tmp / "verdict.json").write_text(json.dumps(data["verdict"], indent=2))
        tmp.rename(runs / name)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    latest = runs / "latest"
    link = runs / f".latest-{name}"
    link.symlink_to(name)
    link.replace(latest)  # atomic switch of the 'latest' pointer
    return runs / name / "report.md"


@contextlib.contextmanager
def publishing(report_md: Path, report, render=None, end: RunEnd | None = None):
    """Around publishing, once the report is written with publish ``pending``: a signal there
    (``pipeline.core.interrupt``) rewrites it as interrupted (status, signal, where; publish
    ``interrupted``, nothing published) before the run ends with its one line naming it, so the
    report never says ``complete`` of a run that was stopped."""
    from pipeline.core.interrupt import Interrupted

    end = RunEnd.of(report) if end is None else end
    try:
        yield
    except Interrupted as e:
        e.at("while publishing")
        end.status = "interrupted"
        end.interrupted = Interruption(e.name, e.where, e.exit_code)
        if end.publish is None:
            end.publish = Publication("interrupted")
        elif end.publish.status != "published":  # stopped after it had published: it stands
            end.publish.status = "interrupted"
        try:
            update(report_md, report, render, end)
            e.report = str(report_md)
        except OSError:  # a full disk: the run still ends with its one line, without the report
            pass
        raise


def interruption(report: dict) -> list[str]:
    """report.md's line for a judged run stopped while publishing (empty otherwise), from a
    report's JSON (a decoder's renderer reads its dict)."""
    return _interruption(RunEnd.of(report))


def _interruption(end: RunEnd) -> list[str]:
    if end.status != "interrupted":
        return []
    i = end.interrupted
    done = (f"published as {end.published} before it" if end.published else
            "nothing was published")
    return [f"**Interrupted {i.where if i else None} ({i.signal if i else None}): {done}. The "
            "gate's verdict below stands; the stages are cached, rerun the same command to "
            "publish.**", ""]


def update(report_md: Path, report, render=None, end: RunEnd | None = None) -> None:
    """Rewrite a written run's report.json and report.md (after publishing), each atomically."""
    folder = Path(report_md).parent
    data, text = _texts(report, RunEnd.of(report) if end is None else end, render)
    for name, content in (("report.json", json.dumps(data, indent=2, sort_keys=True, default=str)),
                          ("report.md", text)):
        tmp = folder / f".tmp-{name}-{uuid.uuid4().hex[:6]}"
        try:
            tmp.write_text(content)
            tmp.replace(folder / name)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
