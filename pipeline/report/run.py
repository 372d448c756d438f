"""The run report: ``report.json`` and ``report.md``, one row per stage's model.

In: the recipe's ``Outcome``, the run record and the environment. Out: a run folder under
``<workdir>/runs/`` written atomically, and the path of its ``report.md``. Each row shows one
step's model (size, nodes, the task's metrics as its contract names them, agreement with FP16,
p50/p99 per batch size, speedup against the fastest float baseline), so the effect of each step is visible on its own line.
"""
from __future__ import annotations

import contextlib
import json
import shutil
import time
import uuid
from pathlib import Path

from pipeline.core.leftovers import temp_name
from pipeline.metrics.outputs import RTOL, agreement
from pipeline.core import numbers
from pipeline.measure.results import Evaluation, Role

ROWS = ((Role.export, "export (torch -> ONNX, FP32)"), (Role.fp32, "optimize (FP32 baseline)"),
        (Role.fp16, "fp16 (baseline)"), (Role.candidate, "candidate"))


def rows(outcome, mode: str, rtol: float = RTOL) -> list[dict]:
    """``rtol``: how close a continuous output must be to FP16's to agree (``gate.output_rtol``)."""
    out = []
    batches = outcome.timings().batches  # from the shipped candidate's seat (runtime=auto, quant=auto)
    for role, title in ROWS:
        art = outcome.models[role]
        if role == Role.fp32 and art.stage == "fuse":
            title = "fuse (transformer fusions, FP32 baseline)"
        if role == Role.candidate:
            title = f"{art.stage} ({mode}, candidate)"
            dep = (getattr(outcome, "runtimes", None) or {}).get("deployed")
            if dep and (dep["runtime"], dep["precision"]) != ("onnxruntime", "fp32"):
                title += f" on {dep['runtime']} {dep['precision']}"
        ev = Evaluation.of(outcome.evals[role])
        row = {"role": role, "step": title, "digest": art.digest,
               "size_mb": art.model.stat().st_size / 1e6,
               "nodes": sum(art.meta.get("nodes", {}).values()), **ev.metrics,
               "agreement_with_fp16": agreement(outcome.evals[role], outcome.evals[Role.fp16],
                                                rtol),
               "output_sha256": ev.output_sha256, "latency": {}}
        for b, t in batches.items():
            lat = t.latencies.get(t.label if role == Role.candidate else role)
            if lat is None:
                continue  # quant=auto times only the models that compete (and FP32)
            entry = {"p50": lat.p50, "p99": lat.p99, "p999": lat.p999,
                     "throughput": lat.throughput,
                     "speedup_vs_fastest_float": t.latencies[t.fastest_float].p50 / lat.p50}
            if role == Role.candidate:  # the gated number: median of per-round ratios, with its CI
                entry.update(speedup_vs_fastest_float=t.overall.median,
                             speedup_ci95=[t.overall.low, t.overall.high])
            row["latency"][str(b)] = entry
        out.append(row)
    return out


def fusion(outcome) -> dict | None:
    """A transformer's fuse stage (``stages.fuse``): each fusion and its count, node counts."""
    art = outcome.models[Role.fp32]
    if art.stage != "fuse":
        return None
    m = art.meta
    return {"model_type": m["model_type"], "num_heads": m["num_heads"],
            "hidden_size": m["hidden_size"], "fusions": m["fusions"],
            "nodes_before": sum(m["nodes_before"].values()), "nodes_after": sum(m["nodes"].values()),
            "parity_vs_export": m["parity_vs_export"]}


def metric_specs(t) -> list[dict]:
    """The task's metrics as the report records them (primary first). ``against``: what each
    row is scored against: the data's labels, or (label-free) the FP16 baseline's outputs, except
    a label-free metric that needs labels (Spearman's rho of sentence pairs: the gold scores)."""
    specs = sorted(t.metrics.specs, key=lambda s: s.name != t.metrics.primary)

    def against(s) -> str:
        if not t.label_free:
            return "labels"
        return "gold_scores" if s.needs_labels else "fp16_outputs"

    return [{"name": s.name, "unit": s.unit, "higher_is_better": s.higher_is_better,
             "primary": s.name == t.metrics.primary, "against": against(s)} for s in specs]


def markdown(report: dict) -> str:
    """report.md: the rows, the gate, then each section the run has, in reading order."""
    if report.get("status") == "interrupted" and "rows" not in report:  # stopped in a stage
        return _interrupted_markdown(report)
    bs = list(next(r for r in report["rows"] if r["role"] == Role.candidate)["latency"])
    metrics = report.get("metrics") or []
    primary = next((m["name"] for m in metrics if m.get("primary")), None)
    unit = next((m["unit"] for m in metrics if m.get("primary")), "%")
    head = ("| step | size | nodes | "
            + "".join(f"{m['name']} {m['unit']}".rstrip() + " | " for m in metrics)
            + "agree fp16 | "
            + " | ".join(f"p50 / p99 b{b} | speedup b{b}" for b in bs) + " |")
    lines = [f"# {report['model']} — quant={report['quant']}", "",
             f"**Gate: {report['verdict']['summary']}**", "", *interruption(report),
             *(line for w in report.get("warnings") or () for line in (f"**Warning:** {w}", "")),
             head,
             "|" + "---|" * (4 + len(metrics) + 2 * len(bs))]
    lines += _rows(report, metrics, bs) + _notes(report, metrics) + _gate(report, metrics)
    lines += _timing(report.get("timing", {})) + _sections(report, metrics, primary, unit)
    lines += _load(report.get("load"))
    for fname, status in report.get("figures", {}).items():
        lines += ["", f"![{fname}]({fname})" if status == "ok" else f"{fname}: {status}"]
    lines += _fusion(report.get("fusion")) + _stages(report["stages"])
    lines += _environment(report["environment"]) + _published(report)
    return "\n".join(lines) + "\n"


def _rows(report: dict, metrics: list, bs: list) -> list[str]:
    """One table row per artifact: size, nodes, each metric, agreement, latency and speedup per batch."""
    lines = []
    for r in report["rows"]:
        cells = [r["step"], numbers.megabytes(r["size_mb"]), numbers.count(r["nodes"]),
                 *(numbers.number(r[m["name"]], 2 if m["unit"] == "%" else 4)
                   if isinstance(r.get(m["name"]), (int, float)) else numbers.NONE
                   for m in metrics),
                 numbers.percent(r["agreement_with_fp16"], fraction=True)]
        for b in bs:
            lat = r["latency"].get(b)
            cells += [f"{numbers.number(lat['p50'])} / {numbers.ms(lat['p99'])}",
                      numbers.ratio(lat["speedup_vs_fastest_float"], lat.get("speedup_ci95"))] \
                if lat else ["not timed", numbers.NONE]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _notes(report: dict, metrics: list) -> list[str]:
    """What the speedups are against, what label-free metrics measure, the A/A checks."""
    lines = []
    lines += ["", "Speedup is against the fastest float baseline at that batch size (p50 ratio; the "
              "candidate's is the median of per-round ratios, with its 95 % CI)."]
    if any(m.get("against") == "fp16_outputs" for m in metrics):
        gold = [m["name"] for m in metrics if m.get("against") == "gold_scores"]
        lines.append("No labels: every row's metrics measure agreement with the FP16 baseline's "
                     "outputs on the same inputs (the FP16 row agrees with itself by construction)"
                     + (f", except {', '.join(gold)}: against the data's gold scores." if gold
                        else "."))
    for b, aa in report["aa_check"].items():
        lines.append(f"A/A check at batch {b} (FP32 against a second copy of itself): "
                     f"{numbers.ratio(aa['median'], aa['ci95'])}.")
    return lines


def _gate(report: dict, metrics: list) -> list[str]:
    """The gate's checks, each value and limit in its own unit."""
    lines = []
    lines += ["", "## Gate", "", "| check | value | limit | verdict | detail |", "|---|---|---|---|---|"]
    for c in report["verdict"]["checks"]:
        fmt = _gate_format(c["check"], metrics)
        lines.append(f"| {c['check']} | {fmt(c['value'])} | {fmt(c['limit'])} | "
                     f"{'pass' if c['passed'] else '**FAIL**'} | {c['detail']} |")
    return lines


def _timing(timing: dict) -> list[str]:
    """How each batch was timed: rounds, noise, core states, slow shapes, cold starts."""
    lines = []
    if timing:
        lines += ["", "## Timing", ""]
        for b, t in timing.get("batches", {}).items():
            cs = t.get("core_state") or {}
            noisy = ("the core state changed and the speedup with it" if cs.get("changed")
                     else "CI still wider than the bound")
            lines.append(f"- batch {b}: {t['rounds']} interleaved rounds in {t['seconds']} s"
                         f"{f' — **noisy**: {noisy}' if t['noisy'] else ''}; "
                         f"{t.get('size_axis', {}).get('meaning', 'size')}s timed: "
                         f"{', '.join(str(w['size']) for w in t['per_size'])}")
            if cs.get("states"):
                lines.append("  - core state (core-to-core round trip): " + "; ".join(
                    f"{st['round_trip_ns']:.0f} ns in {st['share']:.0%} of rounds, "
                    f"{st['speedup_vs_fastest_float']['median']:.2f}x" for st in cs["states"]))
            for o in t["shape_outliers"]:
                lines.append(f"  - slow shape: {o['model']} at size {o['size']}: p50 "
                             f"{o['p50']:.2f} ms where its other shapes predict "
                             f"{o['expected_p50']:.2f} ms")
        for role, cold in timing.get("cold_start_ms", {}).items():
            if "error" in cold:
                lines.append(f"- cold start {role}: failed ({cold['error']})")
            else:
                lines.append(f"- cold start {role}: {cold['total_ms']:.0f} ms to first result "
                             f"(import {cold['import_ms']:.0f}, session {cold['session_ms']:.0f}, "
                             f"first inference {cold['first_inference_ms']:.0f})")
        if timing.get("input_contract"):
            shape = timing["input_contract"]["shape"]
            lines.append("- input contract (measured): " + " x ".join(
                f"{d['min']}" if d["min"] == d["max"] else f"{d['min']}..{d['max']}" for d in shape))
    return lines


def _sections(report: dict, metrics: list, primary, unit) -> list[str]:
    """The optional sections each capability renders: auto, runtimes, bill, pruning, quantization."""
    lines = []
    if report.get("auto"):
        from pipeline.report.auto import markdown as auto_markdown

        lines += auto_markdown(report["auto"], primary, unit)
    if report.get("runtimes"):
        from pipeline.runtimes.render import markdown as runtimes_markdown

        lines += ["", *runtimes_markdown(report["runtimes"], primary, unit)]
    if report.get("bill"):
        from pipeline.bill.render import markdown as bill_markdown

        lines += ["", *bill_markdown(report["bill"])]
    if report.get("pruning"):
        from pipeline.prune.report import markdown as pruning_markdown

        lines += pruning_markdown(report["pruning"], {m["name"]: m["unit"] for m in metrics})
    if report.get("quantization"):
        from pipeline.report.quant import markdown as quant_markdown

        lines += quant_markdown(report["quantization"])
    return lines


def _load(load: dict | None) -> list[str]:
    """The load test (bench.mode=load or soak), one row per model and policy."""
    lines = []
    if load:
        lines += ["", f"## Load test (open-loop Poisson, p99 target {load['slo_p99_ms']} ms)", "",
                  "| model | policy | max QPS within target | throughput there | steps |",
                  "|---|---|---|---|---|"]
        for role, entry in load["models"].items():
            for policy in ("dynamic", "batch1"):
                if policy in entry:
                    e = entry[policy]
                    lines.append(f"| {role} | {policy} | {numbers.rate(e['max_qps_within_slo'])} | "
                                 f"{numbers.rate(e['throughput_at_max'])} | {len(e['steps'])} |")
            if "soak" in entry:
                mem = entry["soak"]["memory"]
                slope = mem.get("slope_mb_per_min")
                lines.append(f"| {role} | soak {entry['soak']['seconds']:.0f} s at "
                             f"{entry['soak']['qps']:.0f}/s | RSS slope "
                             f"{'n/a' if slope is None else f'{slope:.2f} MB/min'} | "
                             f"{'**LEAK**' if mem.get('leak') else 'no leak'} | |")
    return lines


def _fusion(fused: dict | None) -> list[str]:
    """A transformer's fusions (onnxruntime.transformers)."""
    lines = []
    if fused:
        lines += ["", "## Transformer fusions", "",
                  f"onnxruntime.transformers ({fused['model_type']}, {fused['num_heads']} heads, "
                  f"hidden {fused['hidden_size']}): {fused['nodes_before']} nodes before, "
                  f"{fused['nodes_after']} after; parity vs the export: max |diff| "
                  f"{fused['parity_vs_export']['max_abs_diff']:.2e}, agreement "
                  f"{fused['parity_vs_export']['decoded_agreement']:.1%}.", "",
                  "| fusion | count |", "|---|---|"]
        lines += [f"| {op} | {n} |" for op, n in fused["fusions"].items()]
    return lines


def _environment(env: dict) -> list[str]:
    """Where the numbers were taken."""
    lines = []
    lines += ["", "## Environment", "", f"- CPU: {env['cpu']['model']} "
              f"({env['cpu']['logical_cores']} logical cores; {', '.join(env['cpu']['flags'])})",
              f"- Provider: {env['provider']}, threads {env['threads']}"
              + (f"; runtime {env['runtime']['name']}, precision {env['runtime']['precision']} "
                 f"({', '.join(f'{k} {v}' for k, v in env['runtime']['versions'].items())})"
                 if env.get("runtime") else ""),
              "- Tools: " + ", ".join(f"{k} {v}" for k, v in env["tools"].items())]
    return lines


def _published(report: dict) -> list[str]:
    """What publishing did, or is doing."""
    lines = []
    publish = report.get("publish") or {}
    if report.get("published"):
        lines += ["", f"Published to `{report['published']}`."]
    elif publish.get("status") == "pending":  # written before publishing; updated after it
        lines += ["", f"Publishing to the {publish['backend']} registry (this report is updated "
                      "when it ends; if it still says so, the run was interrupted)."]
    elif publish.get("status") == "failed":
        lines += ["", f"**Publishing failed** (the gate passed; nothing was published): "
                      f"{publish['error']}"]
    return lines


def _gate_format(check: str, metrics: list[dict]):
    """How a gate check's value and limit read (``pipeline.gate`` names the checks): a drop in
    the unit of its metric (points of a percentage, else four decimals: a cosine's drops live in
    the third), an agreement or the A/A deviation as a percentage, a speedup as a ratio."""
    if check.endswith("_drop"):
        name = check[:-len("_drop")]
        metric = next((m for m in metrics if (m.get("primary") if name == "accuracy"
                                              else m["name"] == name)), {})
        return numbers.points if metric.get("unit", "%") == "%" else (
            lambda v: numbers.number(v, 4))
    kinds = {"output_agreement": lambda v: numbers.percent(v, fraction=True),
             "aa_check": lambda v: numbers.percent(v, fraction=True),
             "speedup_ci_low": numbers.ratio, "no_slower_than_given": numbers.ratio,
             "slo_p99_ms": numbers.ms,
             "model_mb": numbers.megabytes, "benchmark_sane": numbers.count,
             "same_environment": numbers.count}
    return kinds.get(check, numbers.number)


def _stages(record: list) -> list[str]:
    lines = ["", "## Stages", "", "| stage | status | time | digest |", "|---|---|---|---|"]
    for s in record:
        lines.append(f"| {s['label']} | {'reused' if s['reused'] else 'built'} | "
                     f"{numbers.seconds(s['seconds'])} | `{s['digest'][:16]}` |")
    return lines


def _interrupted_markdown(report: dict) -> str:
    lines = [f"# {report['model']} — quant={report['quant']}", "",
             f"**Gate: {report['verdict']['summary']}**", "",
             "The run was stopped by a signal; nothing was judged or published. "
             + ("The stages below are cached: the same command resumes from there."
                if report["stages"] else "No stage had finished.")]
    if report["stages"]:
        lines += _stages(report["stages"])
    return "\n".join(lines) + "\n"


def write_interrupted(cfg, record: list, e) -> str | None:
    """The report of a run stopped by a signal (``pipeline.core.interrupt``), from what is known: the
    config, the stages done and where it stopped; never judged, never published. Returns its
    path, or None when the disk refuses it (the run still ends with its one line)."""
    from pipeline.core.artifact import plain

    e.at(f"after stage {record[-1]['label']}" if record else "before the first stage")
    report = {"status": "interrupted", "model": cfg.model.name, "quant": cfg.quant.mode.value,
              "config": plain(cfg), "stages": record,
              "interrupted": {"signal": e.name, "where": e.where, "exit_code": e.exit_code},
              "verdict": {"passed": False, "checks": [],
                          "summary": f"not judged: interrupted {e.where} ({e.name})"}}
    try:
        return str(write(cfg.workdir, report))
    except OSError:
        return None


def write(workdir: str, report: dict, figures: dict | None = None, render=None) -> Path:
    """Write report.json, report.md, verdict.json and the figures (name -> draw(path));
    ``render``: the report.md writer (a decoder's report has its own)."""
    runs = Path(workdir) / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    name = time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + uuid.uuid4().hex[:6]
    tmp = runs / temp_name(name)  # its pid tells a later run whether it may be removed
    tmp.mkdir()
    try:
        report["figures"] = {}
        for fname, draw in (figures or {}).items():
            try:
                draw(tmp / fname)
                report["figures"][fname] = "ok"
            except Exception as e:  # noqa: BLE001 - a picture must not cost the evidence
                report["figures"][fname] = f"failed: {type(e).__name__}: {e}"
        (tmp / "report.json").write_text(json.dumps(report, indent=2, sort_keys=True, default=str))
        (tmp / "report.md").write_text((render or markdown)(report))
        (tmp / "verdict.json").write_text(json.dumps(report["verdict"], indent=2))
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
def publishing(report_md: Path, report: dict, render=None):
    """Around publishing, once the report is written with publish ``pending``: a signal there
    (``pipeline.core.interrupt``) rewrites it as interrupted (status, signal, where; publish
    ``interrupted``, nothing published) before the run ends with its one line naming it, so the
    report never says ``complete`` of a run that was stopped."""
    from pipeline.core.interrupt import Interrupted

    try:
        yield
    except Interrupted as e:
        e.at("while publishing")
        report["status"] = "interrupted"
        report["interrupted"] = {"signal": e.name, "where": e.where, "exit_code": e.exit_code}
        publish = report.setdefault("publish", {})
        if publish.get("status") != "published":  # stopped after it had published: it stands
            publish["status"] = "interrupted"
        try:
            update(report_md, report, render)
            e.report = str(report_md)
        except OSError:  # a full disk: the run still ends with its one line, without the report
            pass
        raise


def interruption(report: dict) -> list[str]:
    """report.md's line for a judged run stopped while publishing (empty otherwise)."""
    if report.get("status") != "interrupted":
        return []
    i = report.get("interrupted") or {}
    done = (f"published as {report['published']} before it" if report.get("published") else
            "nothing was published")
    return [f"**Interrupted {i.get('where')} ({i.get('signal')}): {done}. The gate's verdict "
            "below stands; the stages are cached, rerun the same command to publish.**", ""]


def update(report_md: Path, report: dict, render=None) -> None:
    """Rewrite a written run's report.json and report.md (after publishing), each atomically."""
    folder = Path(report_md).parent
    for name, text in (("report.json", json.dumps(report, indent=2, sort_keys=True, default=str)),
                       ("report.md", (render or markdown)(report))):
        tmp = folder / f".tmp-{name}-{uuid.uuid4().hex[:6]}"
        try:
            tmp.write_text(text)
            tmp.replace(folder / name)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise


def aa_checks(outcome) -> dict:
    return {b: at["aa_check"] for b, at in outcome.bench.meta["batches"].items()}


def timing(outcome) -> dict:
    """How the latencies were measured: rounds, noise, shapes, cold start, input contract."""
    meta, seat = outcome.bench.meta, outcome.timings().batches
    return {"batches": {b: {"rounds": at["rounds"], "seconds": at["seconds"],
                            "noisy": seat[int(b)].noisy,
                            "core_state": (at.get("core_state_by_label") or {}).get(
                                outcome.label_at(b), at.get("core_state")),
                            "per_size": at["per_size"][outcome.label_at(b)],
                            "size_axis": meta.get("size_axis"),
                            "shape_outliers": at["shape_outliers"]}
                        for b, at in meta["batches"].items()},
            "cold_start_ms": meta.get("cold_start_ms", {}), "input_contract": meta.get("input_contract")}

