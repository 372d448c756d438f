"""``python -m pipeline [overrides]``: compile, gate, publish and report one model.

Exit codes: 0 the candidate passed its gate (and was published when a registry is set),
1 the gate failed (candidate and report kept), 2 bad config, 3 a stage failed or the machine
refused (a read-only or full disk), 4 a bug. Expected failures print one line without a
traceback; a bug keeps it.
``python -m pipeline -m a=x,y ...`` runs a sweep instead (``pipeline.sweep.launch``, docs/sweeps.md).
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

from pipeline.compose import compilable_models, compose
from pipeline.errors import ConfigError, GateFailed, PipelineError, cli, describe_os_error


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    from pipeline.sweep import launch as sweep

    if sweep.is_sweep(argv):  # -m: a sweep through Hydra's multirun (docs/sweeps.md)
        return cli(sweep.main, argv, __doc__)
    return cli(_run, argv, __doc__)


def _preflight(cfg) -> None:
    """What composing cannot know: whether this model compiles and this runtime has the provider.
    Checked before anything is written, so such a mistake ends like any other config error."""
    if cfg.model.llm is not None:
        raise ConfigError(f"model={cfg.model.name}: a bill-only LLM description (python -m "
                          f"pipeline.bill model={cfg.model.name}); compilable models: "
                          f"{', '.join(compilable_models())}")
    checkpoint = cfg.model.checkpoint
    if checkpoint is not None and not Path(checkpoint).is_file():
        raise ConfigError(f"model.checkpoint={checkpoint}: "
                          f"{'not a file' if Path(checkpoint).exists() else 'no such file'} "
                          f"(from {Path.cwd()}; null = a seeded random network)")
    import onnxruntime

    available = onnxruntime.get_available_providers()
    if cfg.hardware.provider not in available:
        raise ConfigError(f"hardware={cfg.hardware.name}: provider {cfg.hardware.provider} is not "
                          f"available in this onnxruntime ({', '.join(available)}); the profile "
                          "is data for python -m pipeline.bill")
    from pipeline import runtimes

    runtimes.check(cfg.hardware, cfg.quant.mode)  # runtime installed, precision on this CPU
    from pipeline.models import task
    from pipeline.models.contract import check
    from pipeline.models.sources import task_key

    # The model, its data and metric must fit each other before any stage runs: a file that is
    # not ONNX, a factory that does not import, a metric that does not fit the outputs.
    t = task(task_key(cfg.model, cfg.data, cfg.metric, cfg.data_dir))
    problems = check(t)
    if problems:
        raise ConfigError(f"model={cfg.model.name}: does not meet the task contract: "
                          + "; ".join(problems))
    if cfg.prune.method.value != "none":  # ignored names, whole layers removed, the trace
        from pipeline.stages.prune import preflight

        preflight(cfg)


def _bill(out, cfg) -> dict:
    """The report's bill section: informational, so a model it cannot read is noted, not fatal."""
    from pipeline.bill.artifact import run_bill

    try:
        return run_bill(out, cfg)
    except PipelineError as e:
        print(f"bill: not computed ({e})")
        return {"error": str(e)}


def _update_report(path, body) -> None:
    """Record a failed publish in the report; the publish error, not this one, is what is raised."""
    from pipeline.report import run as rep

    try:
        rep.update(path, body)
    except OSError as e:  # a full disk: the report written before publishing stays as it was
        print(f"report: not updated ({describe_os_error(e)})")


def _run(argv: list[str]) -> int:
    cfg = compose(argv)
    _preflight(cfg)
    from pipeline.quant import report as quant_report
    from pipeline.report import run as rep
    from pipeline.env import environment
    from pipeline.gate import table as gate_table
    from pipeline.recipe import recipe
    from pipeline.registry import publish
    from pipeline.runner import Runner, plain

    t0 = time.time()
    print(f"pipeline: model={cfg.model.name} quant={cfg.quant.mode.value} "
          f"hardware={cfg.hardware.name}")
    runner = Runner(cfg.workdir, cfg.hardware.target())
    out = recipe(cfg, runner)
    env = environment(cfg.hardware)
    mode = cfg.quant.mode.value
    from pipeline.models import task
    from pipeline.models.sources import task_key

    t = task(task_key(cfg.model, cfg.data, cfg.metric, cfg.data_dir))
    body = {"model": cfg.model.name, "quant": mode, "config": plain(cfg), "environment": env,
            "metrics": rep.metric_specs(t),
            "verdict": out.verdict, "rows": rep.rows(out, mode), "aa_check": rep.aa_checks(out),
            "timing": rep.timing(out), "bill": _bill(out, cfg),
            "stages": runner.record,
            "lineage": {role: {"digest": a.digest, "stage": a.stage, "parent": a.parent,
                               "path": str(a.path)} for role, a in
                        {"source": out.source, **out.models}.items()}}
    if out.quant is not None:
        body["quantization"] = quant_report.as_dict(out.quant)
    if out.pruning is not None:
        from pipeline.prune import report as pruning_report

        body["pruning"] = pruning_report.as_dict(out)
        body["lineage"]["unpruned"] = {"digest": out.pruning["load"].digest, "stage": "load",
                                       "parent": None, "path": str(out.pruning["load"].path)}
    if out.load is not None:
        body["load"] = out.load.meta
    body["runtimes"] = out.runtimes
    if out.auto is not None:  # quant=auto: the version says which candidate won
        body["auto"] = out.auto
        mode = f"{mode}.{out.auto['winner']['candidate']}"
    deployed = out.runtimes["deployed"]
    if (deployed["runtime"], deployed["precision"]) != ("onnxruntime", "fp32"):
        mode = f"{mode}.{deployed['runtime']}-{deployed['precision']}"  # the version says so
    from pipeline.report import plots

    figures = {"latency_cdf.png": lambda p: plots.latency_cdf(out.bench.path / "times.json", p)}
    if out.load is not None and cfg.bench.mode.value == "load":
        figures["load_curve.png"] = lambda p: plots.load_curve(out.load.meta, p)
    if out.quant is not None:
        figures["sensitivity.png"] = lambda p: quant_report.sensitivity_chart(body["quantization"], p)
        if out.quant.search:
            figures["mixed_search.png"] = lambda p: quant_report.search_chart(body["quantization"], p)
    if out.verdict["passed"] and cfg.registry is not None:
        cand = next(r for r in body["rows"] if r["role"] == "candidate")
        manifest = {"config": body["config"], "lineage": body["lineage"], "verdict": out.verdict,
                    "metrics": {k: cand.get(k) for k in (*t.metrics.names,
                                                         "agreement_with_fp16", "output_sha256")},
                    "latency": cand["latency"], "environment": env,
                    "input_contract": out.bench.meta.get("input_contract"),
                    "evaluation_set": out.evals["candidate"].meta["evaluation_set"],
                    "calibration_set": out.models["candidate"].meta.get("calibration_set"),
                    "quantization": {k: body["quantization"][k] for k in
                                     ("settings", "calibration", "latency_exclusions",
                                      "float_outputs")}
                    if out.quant is not None else None,
                    # what ships is the pruned network; unpruned manifests stay as they were
                    **({"pruning": body["pruning"]} if "pruning" in body else {}),
                    # what was gated is what ships: engine, precision, threads, executed kernels
                    "runtime": {"deployed": deployed, "mode": out.runtimes["mode"],
                                "choice": {b: {k: v for k, v in c.items() if k != "considered"}
                                           for b, c in out.runtimes["choice"].items()}}}
    publishing = out.verdict["passed"] and cfg.registry is not None
    if publishing:  # the report exists before publishing, whatever publishing then does
        body["publish"] = {"status": "pending", "backend": cfg.registry.backend.value}
    path = rep.write(cfg.workdir, body, figures)
    if publishing:
        try:
            body["published"] = str(publish(cfg.registry, model_name=cfg.model.name, mode=mode,
                                            candidate=out.models["candidate"], manifest=manifest))
            body["publish"].update(status="published", ref=body["published"])
        except (PipelineError, OSError) as e:
            body["publish"].update(status="failed", error=describe_os_error(e)
                                   if isinstance(e, OSError) else str(e))
            _update_report(path, body)
            print(f"report: {path} (the gate passed; publishing failed)")
            raise
        rep.update(path, body)
    reused = sum(s["reused"] for s in runner.record)
    print(f"stages: {reused} of {len(runner.record)} reused; {time.time() - t0:.1f} s")
    print(gate_table(out.verdict))
    print(f"gate: {out.verdict['summary']}")
    if body.get("published"):
        print(f"published: {body['published']}")
    print(f"report: {path}")
    if not out.verdict["passed"]:
        raise GateFailed(f"gate failed, candidate kept at {out.models['candidate'].path}; "
                         f"report {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
