"""``python -m pipeline [overrides]``: compile, gate, publish and report one model.

Exit codes: 0 the candidate passed its gate (and was published when a registry is set),
1 the gate failed (candidate and report kept), 2 bad config, 3 a stage failed.
Expected failures print one line without a traceback; anything else is a bug and keeps it.
"""
from __future__ import annotations

import sys
import time

from pipeline.compose import compose
from pipeline.errors import GateFailed, PipelineError


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    try:
        return _run(argv)
    except PipelineError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code


def _run(argv: list[str]) -> int:
    cfg = compose(argv)
    from pipeline import report as rep
    from pipeline.env import environment
    from pipeline.recipe import recipe
    from pipeline.registry import publish
    from pipeline.runner import Runner, plain

    t0 = time.time()
    print(f"pipeline: model={cfg.model.name} quant={cfg.quant.mode.value} "
          f"hardware={cfg.hardware.name}")
    runner = Runner(cfg.workdir, cfg.hardware)
    out = recipe(cfg, runner)
    env = environment(cfg.hardware)
    mode = cfg.quant.mode.value
    body = {"model": cfg.model.name, "quant": mode, "config": plain(cfg), "environment": env,
            "verdict": out.verdict, "rows": rep.rows(out, mode), "aa_check": rep.aa_checks(out),
            "stages": runner.record,
            "lineage": {role: {"digest": a.digest, "stage": a.stage, "parent": a.parent,
                               "path": str(a.path)} for role, a in
                        {"source": out.source, **out.models}.items()}}
    if out.verdict["passed"] and cfg.registry is not None:
        cand = next(r for r in body["rows"] if r["role"] == "candidate")
        manifest = {"config": body["config"], "lineage": body["lineage"], "verdict": out.verdict,
                    "metrics": {k: cand[k] for k in ("sequence_accuracy", "cer",
                                                     "agreement_with_fp16", "output_sha256")},
                    "latency": cand["latency"], "environment": env,
                    "evaluation_set": out.evals["candidate"].meta["evaluation_set"],
                    "calibration_set": out.models["candidate"].meta.get("calibration_set")}
        body["published"] = str(publish(cfg.registry, model_name=cfg.model.name, mode=mode,
                                        candidate=out.models["candidate"], manifest=manifest))
    path = rep.write(cfg.workdir, body)
    reused = sum(s["reused"] for s in runner.record)
    print(f"stages: {reused} of {len(runner.record)} reused; {time.time() - t0:.1f} s")
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
