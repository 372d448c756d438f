"""The one publish flow, for every kind of run: the report first, then the registry.

In: the run's ``Config``, the recipe's ``Outcome`` and what its kind of model publishes: the
report's body and renderer, its figures, the version's mode, the evidence (the manifest) and
any files beside the model (a decoder's folder). Out: the report's path; what publishing did
(the ref, or the error) is the Shipment's ``RunEnd``, written into the report. The report exists
before publishing (publish ``pending``), and records what publishing then did: the ref, or the
error, which is raised again; a signal while publishing leaves the report ``interrupted``.
Nothing is published when the gate failed or no registry is set.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from pipeline.core.errors import describe_os_error
from pipeline.measure.results import Role
from pipeline.report.body import Publication, RunEnd


@dataclass(frozen=True)
class Shipment:
    """What one kind of run publishes, beside the candidate itself."""
    body: object                      # report.json's body: a RunReport, or a decoder's dict
    mode: str                         # the version's mode part: int8, fp32, int8.mixed ...
    evidence: Callable[[], dict]      # the manifest, built only when publishing
    # report.md's writer (None: pipeline.report.run.markdown): a typed body's takes (body, end),
    # a dict body's the JSON it writes (body and end together)
    render: Callable | None = None
    figures: dict = field(default_factory=dict)  # file name -> draw(path)
    files: dict | None = None         # other files by name that ship with the model
    end: RunEnd = field(default_factory=RunEnd)  # figures and publishing, as they happen


def publish_run(cfg, out, ship: Shipment) -> Path:
    """Write the report, publish the candidate when the gate passed and a registry is set,
    record the outcome in the report; returns the report's path."""
    from pipeline.report import run as rep

    publishing = out.verdict.passed and cfg.registry is not None
    evidence = ship.evidence() if publishing else None
    if publishing:  # the report exists before publishing, whatever publishing then does
        ship.end.publish = Publication("pending", backend=cfg.registry.backend.value)
    path = rep.write(cfg.workdir, ship.body, ship.figures, render=ship.render, end=ship.end)
    if publishing:  # a signal: the report says so
        with rep.publishing(path, ship.body, render=ship.render, end=ship.end):
            _push(cfg, out, ship, path, evidence)
    return path


def _push(cfg, out, ship: Shipment, path: Path, evidence: dict) -> None:
    from pipeline.registry import publish as push
    from pipeline.report import run as rep

    end = ship.end
    try:
        end.published = str(push(cfg.registry, model_name=cfg.model.name, mode=ship.mode,
                                  candidate=out.models[Role.candidate], manifest=evidence,
                                  extra=ship.files))
        end.publish.status, end.publish.ref = "published", end.published
    except Exception as e:  # noqa: BLE001 - recorded in the report, then raised as it was
        end.publish.status = "failed"
        end.publish.error = describe_os_error(e) if isinstance(e, OSError) else str(e)
        try:
            rep.update(path, ship.body, render=ship.render, end=end)
        except OSError as full:  # a full disk: the report written before publishing stays
            print(f"report: not updated ({describe_os_error(full)})")
        print(f"report: {path} (the gate passed; publishing failed)")
        raise
    rep.update(path, ship.body, render=ship.render, end=end)
