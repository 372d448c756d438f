"""What a finished run becomes: the report's body and figures, the manifest that ships with the
candidate, and publishing it.

In: the run's ``Config``, the recipe's ``Outcome`` and the runner's record. Out: the typed body
of ``report.json`` (``pipeline.report.body.RunReport``: rows, checks, timing, the bill, lineage,
and each optional section as its capability gives it), built once here, its figures,
the version name (the quant mode, ``fp32`` when INT8 could not pay and the FP32 model is the
candidate, plus the ``quant=auto`` winner and a non-default deployed runtime), the manifest (config, lineage, verdict, metrics, latency, environment, data sets, the
quantization and runtime that were gated), handed to the one publish flow
(``pipeline.report.publish``) as a ``Shipment``.
"""
from __future__ import annotations

from pipeline.core.errors import PipelineError
from pipeline.core.json_record import to_json
from pipeline.measure.bench_record import BenchRecord, LoadRecord
from pipeline.measure.results import Role
from pipeline.report.body import DataSets, RunReport


def body(cfg, out, record: list) -> RunReport:
    """report.json's body, typed, built once from the Outcome and the runner's record."""
    from pipeline.core.artifact import plain
    from pipeline.core.env import environment
    from pipeline.metrics.outputs import Rule
    from pipeline.report import body as b
    from pipeline.report import quant as quant_report

    mode, t = cfg.quant.mode.value, out.run.task
    bench = BenchRecord.of(out.bench)
    lineage = {role: b.LineageEntry.of(a) for role, a in
               {"source": out.source, **out.models}.items()}
    pruning = None
    if out.pruning is not None:
        from pipeline.prune import report as pruning_report

        pruning = pruning_report.section(out)
        unpruned = out.pruning.load  # the network before pruning (recipes.main)
        lineage = {**lineage, "unpruned": b.LineageEntry(unpruned.digest, "load", None,
                                                          str(unpruned.path))}
    outside = getattr(t, "outside_charset", None)
    return RunReport(
        model=cfg.model.name, quant=mode, config=plain(cfg),
        environment=b.environment(environment(cfg.hardware)), metrics=b.metric_specs(t),
        verdict=out.verdict, rows=b.rows(out, mode, Rule.of(cfg.gate)),
        aa_check=b.aa_checks(bench), timing=b.timing(bench, out), bill=_bill(out, cfg),
        stages=b.stages(record), lineage=lineage, runtimes=out.runtimes,
        # what the terminal warned about before any stage ran belongs to the evidence too
        warnings=tuple(getattr(t, "warnings", ())),
        labels_outside_charset=plain(outside) if outside is not None else None,
        fusion=b.fusion(out),  # a transformer's fuse stage
        quantization=quant_report.as_dict(out.quant) if out.quant is not None else None,
        pruning=pruning, load=LoadRecord.of(out.load) if out.load is not None else None,
        # what the evaluation fed the model: a server reproduces it
        serving=t.serving_spec() if hasattr(t, "serving_spec") else None,
        auto=out.auto)


def _bill(out, cfg):
    """The report's bill section: informational, so a model it cannot read is noted, not fatal."""
    from pipeline.bill.artifact import run_bill
    from pipeline.bill.record import BillError

    contract = BenchRecord.of(out.bench).input_contract
    try:
        return run_bill(out, cfg, contract.constant_axes() if contract is not None else ())
    except PipelineError as e:
        line = str(e)
        if "bill.input_shape" in line:  # a key of the bill's own command, not of this one
            line += ": python -m pipeline.bill with this run's overrides and that key"
        print(f"bill: not computed ({line})")
        return BillError(line)


def figures(cfg, out, report: RunReport) -> dict:
    """File name -> a function that draws it at a path."""
    from pipeline.report import quant as quant_report
    from pipeline.report import plots

    figs = [("latency_cdf.png", lambda p: plots.latency_cdf(out.bench.path / "times.json", p))]
    if out.load is not None and cfg.bench.mode.value == "load":
        figs.append(("load_curve.png", lambda p: plots.load_curve(report.load, p)))
    if out.quant is not None:
        figs.append(("sensitivity.png",
                     lambda p: quant_report.sensitivity_chart(report.quantization, p)))
        if out.quant.search:
            figs.append(("mixed_search.png",
                         lambda p: quant_report.search_chart(report.quantization, p)))
    return dict(figs)


def version_mode(cfg, out) -> str:
    """The mode part of the published version: it says what it holds and where it runs."""
    mode = cfg.quant.mode.value
    fallback = getattr(out.quant, "versus_fp32", None) or {}
    if fallback.get("candidate") == "fp32":  # INT8 could not pay: the FP32 model is what passed
        mode = "fp32"
    if out.auto is not None:  # quant=auto: the version says which candidate won
        mode = f"{mode}.{out.auto.winner.candidate}"
    deployed = out.runtimes.deployed
    if (deployed.runtime, deployed.precision) != ("onnxruntime", "fp32"):
        mode = f"{mode}.{deployed.runtime}-{deployed.precision}"  # the version says so
    return mode


def manifest(out, report: RunReport) -> dict:
    """The evidence that ships with the candidate."""
    cand = report.row(Role.candidate)
    plan = out.runtimes
    sets = DataSets.of(out.evals[Role.candidate]), DataSets.of(out.models[Role.candidate])
    return {"config": report.config, "lineage": to_json(report.lineage),
            "verdict": out.verdict.as_dict(),
            "metrics": {**{m.name: cand.metrics.get(m.name) for m in report.metrics},
                        "agreement_with_fp16": cand.agreement_with_fp16,
                        "output_sha256": cand.output_sha256},
            "latency": to_json(cand.latency), "environment": to_json(report.environment),
            "input_contract": to_json(report.timing.input_contract),
            "evaluation_set": sets[0].evaluation_set, "calibration_set": sets[1].calibration_set,
            "serving": to_json(report.serving),
            "quantization": {k: report.quantization[k] for k in
                             ("settings", "calibration", "latency_exclusions", "float_outputs")}
            if out.quant is not None else None,
            # what ships is the pruned network; unpruned manifests stay as they were
            **({"pruning": to_json(report.pruning)} if report.pruning is not None else {}),
            # what was gated is what ships: engine, precision, threads, executed kernels
            "runtime": {"deployed": to_json(plan.deployed), "mode": plan.mode,
                        "choice": {b: to_json(c.picked()) for b, c in plan.choice.items()}}}


def shipment(cfg, out, report: RunReport):
    """What an encoder's run publishes (``pipeline.report.publish``): its report, figures,
    version and manifest."""
    from pipeline.report.publish import Shipment

    # what a server reads requests with (a tokenizer's files) travels with the model
    t = out.run.task
    files = t.serving_files() if hasattr(t, "serving_files") else None
    return Shipment(report, version_mode(cfg, out), lambda: manifest(out, report),
                    figures=figures(cfg, out, report), files=files)
