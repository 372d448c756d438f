"""What a recipe returns: the artifacts by role, their evaluations, the benchmark and the verdict.

The plain recipe and the ``quant=auto`` sub-recipe both return one; publishing, the manifest and
the report read it. A module of its own so that a sub-recipe can build one without importing the
recipe that calls it.
"""
from __future__ import annotations

from dataclasses import dataclass

from pipeline.models.run import Run


@dataclass
class Outcome:
    run: Run            # the task key and task the artifacts came from (built once per run)
    models: dict        # role -> Artifact: export, fp32, fp16, candidate
    evals: dict         # role -> evaluate Artifact
    bench: object
    verdict: dict
    source: object      # the network export starts from: load, or prune when pruning
    load: object = None  # the loadtest artifact (bench.mode=load or soak)
    quant: object = None  # QuantInfo: settings, calibration, explanation, sensitivity, search
    runtimes: dict | None = None  # targets per artifact, failures, the choice (runtimes.plan)
    pruning: dict | None = None  # prune=channels: the load, prune and unpruned export artifacts
    auto: dict | None = None  # quant=auto: every candidate on every runtime, the winner and why
