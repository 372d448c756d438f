"""What a finished run becomes: the report's body and figures, the manifest that ships with the
candidate, and publishing it.

In: the run's ``Config``, the recipe's ``Outcome`` and the runner's record. Out: the body of
``report.json`` (rows, checks, timing, the bill, lineage, and each optional section), its figures,
the version name (the quant mode, ``fp32`` when INT8 could not pay and the FP32 model is the
candidate, plus the ``quant=auto`` winner and a non-default deployed runtime), the manifest (config, lineage, verdict, metrics, latency, environment, data sets, the
quantization and runtime that were gated), handed to the one publish flow
(``pipeline.report.publish``) as a ``Shipment``.
"""
from __future__ import annotations

from pipeline.core.errors import PipelineError
from pipeline.measure.results import Role


def body(cfg, out, record: list) -> dict:
    from pipeline.core.env import environment
    from pipeline.report import quant as quant_report
    from pipeline.report import run as rep
    from pipeline.core.artifact import plain

    mode, t = cfg.quant.mode.value, out.run.task
    report = {"status": "complete", "model": cfg.model.name, "quant": mode, "config": plain(cfg),
              "environment": environment(cfg.hardware), "metrics": rep.metric_specs(t),
              "verdict": out.verdict.as_dict(),
              "rows": rep.rows(out, mode, cfg.gate.output_rtol), "aa_check": rep.aa_checks(out),
              "timing": rep.timing(out), "bill": _bill(out, cfg), "stages": record,
              "lineage": {role: {"digest": a.digest, "stage": a.stage, "parent": a.parent,
                                 "path": str(a.path)} for role, a in
                          {"source": out.source, **out.models}.items()}}
    # what the terminal warned about before any stage ran belongs to the evidence too
    report["warnings"] = list(getattr(t, "warnings", ()))
    if getattr(t, "outside_charset", None) is not None:
        report["labels_outside_charset"] = plain(t.outside_charset)
    if rep.fusion(out) is not None:  # a transformer's fuse stage
        report["fusion"] = rep.fusion(out)
    if out.quant is not None:
        report["quantization"] = quant_report.as_dict(out.quant)
    if out.pruning is not None:
        from pipeline.prune import report as pruning_report

        report["pruning"] = pruning_report.as_dict(out)
        report["lineage"]["unpruned"] = {"digest": out.pruning["load"].digest, "stage": "load",
                                         "parent": None, "path": str(out.pruning["load"].path)}
    if out.load is not None:
        report["load"] = out.load.meta
    report["runtimes"] = out.runtimes
    if hasattr(t, "serving_spec"):  # what the evaluation fed the model: a server reproduces it
        report["serving"] = t.serving_spec()
    if out.auto is not None:  # recipes.auto_result.AutoResult: its JSON, as earlier runs wrote it
        report["auto"] = out.auto.as_dict()
    return report


def _bill(out, cfg) -> dict:
    """The report's bill section: informational, so a model it cannot read is noted, not fatal."""
    from pipeline.bill.artifact import run_bill

    try:
        return run_bill(out, cfg)
    except PipelineError as e:
        print(f"bill: not computed ({e})")
        return {"error": str(e)}


def figures(cfg, out, report: dict) -> dict:
    """File name -> a function that draws it at a path."""
    from pipeline.report import quant as quant_report
    from pipeline.report import plots

    figs = {"latency_cdf.png": lambda p: plots.latency_cdf(out.bench.path / "times.json", p)}
    if out.load is not None and cfg.bench.mode.value == "load":
        figs["load_curve.png"] = lambda p: plots.load_curve(out.load.meta, p)
    if out.quant is not None:
        figs["sensitivity.png"] = lambda p: quant_report.sensitivity_chart(report["quantization"], p)
        if out.quant.search:
            figs["mixed_search.png"] = lambda p: quant_report.search_chart(report["quantization"],
                                                                           p)
    return figs


def version_mode(cfg, out) -> str:
    """The mode part of the published version: it says what it holds and where it runs."""
    mode = cfg.quant.mode.value
    fallback = getattr(out.quant, "versus_fp32", None) or {}
    if fallback.get("candidate") == "fp32":  # INT8 could not pay: the FP32 model is what passed
        mode = "fp32"
    if out.auto is not None:  # quant=auto: the version says which candidate won
        mode = f"{mode}.{out.auto.winner.candidate}"
    deployed = out.runtimes["deployed"]
    if (deployed["runtime"], deployed["precision"]) != ("onnxruntime", "fp32"):
        mode = f"{mode}.{deployed['runtime']}-{deployed['precision']}"  # the version says so
    return mode


def manifest(out, report: dict) -> dict:
    """The evidence that ships with the candidate."""
    cand = next(r for r in report["rows"] if r["role"] == Role.candidate)
    deployed = out.runtimes["deployed"]
    return {"config": report["config"], "lineage": report["lineage"], "verdict": out.verdict.as_dict(),
            "metrics": {k: cand.get(k) for k in (*(m["name"] for m in report["metrics"]),
                                                 "agreement_with_fp16", "output_sha256")},
            "latency": cand["latency"], "environment": report["environment"],
            "input_contract": out.bench.meta.get("input_contract"),
            "evaluation_set": out.evals[Role.candidate].meta["evaluation_set"],
            "calibration_set": out.models[Role.candidate].meta.get("calibration_set"),
            "serving": report.get("serving"),
            "quantization": {k: report["quantization"][k] for k in
                             ("settings", "calibration", "latency_exclusions", "float_outputs")}
            if out.quant is not None else None,
            # what ships is the pruned network; unpruned manifests stay as they were
            **({"pruning": report["pruning"]} if "pruning" in report else {}),
            # what was gated is what ships: engine, precision, threads, executed kernels
            "runtime": {"deployed": deployed, "mode": out.runtimes["mode"],
                        "choice": {b: {k: v for k, v in c.items() if k != "considered"}
                                   for b, c in out.runtimes["choice"].items()}}}


def shipment(cfg, out, report: dict):
    """What an encoder's run publishes (``pipeline.report.publish``): its report, figures,
    version and manifest."""
    from pipeline.report.publish import Shipment

    # what a server reads requests with (a tokenizer's files) travels with the model
    t = out.run.task
    files = t.serving_files() if hasattr(t, "serving_files") else None
    return Shipment(report, version_mode(cfg, out), lambda: manifest(out, report),
                    figures=figures(cfg, out, report), files=files)
