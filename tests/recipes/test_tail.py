"""The shared tail: every recipe, encoder or decoder, ends in the one judge, the one outcome
type and the one publish flow."""
from __future__ import annotations

import ast
import json
from pathlib import Path
from types import SimpleNamespace as NS

import pytest

from pipeline import gate
from pipeline.config import Config, GateConfig, RegistryConfig
from pipeline.core.errors import PipelineError
from pipeline.gate.outcome import Outcome
from pipeline.gate.verdict import Check, Verdict
from pipeline.measure.results import Role

ROOT = Path(__file__).resolve().parents[2]


def _calls(path: str) -> set[str]:
    """Every ``a.b(...)`` and ``f(...)`` called in a module, as dotted names."""
    out = set()
    for node in ast.walk(ast.parse((ROOT / path).read_text())):
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
                out.add(f"{f.value.id}.{f.attr}")
            elif isinstance(f, ast.Name):
                out.add(f.id)
    return out


def test_encoder_and_decoder_paths_end_in_the_same_judge_outcome_and_publish_flow():
    """Both recipes judge with ``gate.judge`` and return ``gate.outcome.Outcome``; both command
    lines end in ``cli.finish.finish``, which alone calls the one publish flow."""
    for recipe in ("pipeline/recipes/main.py", "pipeline/recipes/auto.py",
                   "pipeline/recipes/decoder.py"):
        calls = _calls(recipe)
        assert "gate.judge" in calls, recipe
        assert "Outcome" in calls, recipe
        assert not {c for c in calls if c.endswith("judge") and c != "gate.judge"} - {"judge"}
    for cli in ("pipeline/cli/main.py", "pipeline/cli/llm.py"):
        calls = _calls(cli)
        assert "finish" in calls and "run_recipe" in calls, cli
        assert not {"publish", "ship.publish", "rep.write", "run_report.write"} & calls, cli
    assert "publish_run" in _calls("pipeline/cli/finish.py")
    # nothing else publishes: the registry is pushed from the one flow only
    pushers = [p for p in (ROOT / "pipeline").rglob("*.py")
               if "registry import publish" in p.read_text() and "registry" not in p.parts]
    assert [p.relative_to(ROOT).as_posix() for p in pushers] == ["pipeline/report/publish.py"]


def _speed(meta):
    return NS(meta=meta)


def test_the_decoder_verdict_comes_from_the_one_judge_and_names_its_reference(monkeypatch):
    """The decoder's judge is the gate's: a spy on ``gate.judge`` sees it, and on the streaming
    path each detail names the INT8 reference it was judged against, never FP32."""
    from pipeline.core.env import environment
    from pipeline.recipes import decoder

    seen = []
    real = gate.judge
    monkeypatch.setattr(gate, "judge", lambda m, *a, **k: seen.append(m) or real(m, *a, **k))
    cfg = Config()
    scored = NS(meta={"perplexity_rise_pct": 0.5, "top1_agreement": 0.97, "kl_mean": 0.01})
    speed = _speed({"speedup_vs_fp32": {"candidate": {"median": 2.0, "ci95": [1.9, 2.1]}},
                    "environment": environment(cfg.hardware.target())})
    v = decoder.judge(cfg, scored, speed, Role.candidate, "the INT8 reference (bf16 checkpoint)")
    assert isinstance(v, Verdict) and len(seen) == 1
    assert v.passed, v.summary
    details = " ".join(c.detail for c in v.checks)
    assert "vs the INT8 reference (bf16 checkpoint)" in details and "vs FP32" not in details
    assert v.as_dict()["reference"] == "the INT8 reference (bf16 checkpoint)"
    # the reference judged as itself: no rise, a speedup of 1 by identity
    ref = decoder.judge(cfg, None, speed, Role.fp32)
    assert ref.passed and ref.check("speedup_ci_low").value == 1.0


def test_a_measurement_the_stage_did_not_record_fails_closed_but_a_renamed_key_is_a_bug():
    """An absent speedup fails its check, naming it; a speedup whose fields were renamed is
    not a gate FAIL but an error (exit 4: the pipeline has a bug)."""
    cfg = Config()
    from pipeline.recipes import decoder

    scored = NS(meta={"perplexity_rise_pct": 0.5, "top1_agreement": 0.97, "kl_mean": 0.01})
    v = decoder.judge(cfg, scored, _speed({"speedup_vs_fp32": {}}), Role.candidate)
    check = v.check("speedup_ci_low")
    assert not check.passed and check.detail == ("speedup_ci_low: no decode speedup vs FP32 "
                                                 "was recorded (fails closed)")
    no_top1 = NS(meta={"perplexity_rise_pct": 0.5, "kl_mean": 0.01})
    check = decoder.judge(cfg, no_top1, _speed({}), Role.candidate).check("top1_agreement_drop")
    assert check.detail == ("top1_agreement_drop: no top1_agreement measured for the candidate "
                            "(fails closed)")
    renamed = _speed({"speedup_vs_fp32": {"candidate": {"middle": 2.0, "ci": [1.9, 2.1]}}})
    with pytest.raises(KeyError):
        decoder.judge(cfg, scored, renamed, Role.candidate)


def _outcome(tmp_path, passed: bool) -> Outcome:
    model = tmp_path / "cand" / "model.onnx"
    model.parent.mkdir(parents=True)
    model.write_bytes(b"not really onnx, but bytes to hash")
    cand = NS(model=model, path=model.parent, files_digest="ab" * 32, digest="cd" * 32)
    verdict = Verdict([Check("accuracy_drop", 0.0, 0.3, passed, "drop 0.00 points")])
    return Outcome(None, {Role.candidate: cand}, {}, None, verdict, None)


def _shipment(out, render):
    from pipeline.report.publish import Shipment

    body = {"status": "complete", "verdict": out.verdict.as_dict()}
    return Shipment(body, "int8", lambda: {"verdict": out.verdict.as_dict()}, render=render)


def test_the_publish_flow_writes_the_report_then_publishes_and_records_the_ref(tmp_path):
    from pipeline.report.publish import publish_run

    cfg = NS(workdir=str(tmp_path / "work"),
             registry=RegistryConfig(root=str(tmp_path / "registry")), model=NS(name="tiny"))
    out = _outcome(tmp_path, passed=True)
    rendered = []
    ship = _shipment(out, lambda r: rendered.append(dict(r.get("publish") or {})) or "# r\n")
    path = publish_run(cfg, out, ship)
    report = json.loads((path.parent / "report.json").read_text())
    assert report["publish"]["status"] == "published"
    assert report["published"].startswith("tiny:int8-abababababababab@sha256:")
    assert rendered[0] == {"status": "pending", "backend": "local"}  # written before the push
    assert json.loads((path.parent / "verdict.json").read_text())["passed"] is True


def test_a_failed_gate_is_reported_and_nothing_is_published(tmp_path):
    from pipeline.report.publish import publish_run

    cfg = NS(workdir=str(tmp_path / "work"),
             registry=RegistryConfig(root=str(tmp_path / "registry")), model=NS(name="tiny"))
    out = _outcome(tmp_path, passed=False)
    path = publish_run(cfg, out, _shipment(out, lambda r: "# r\n"))
    report = json.loads((path.parent / "report.json").read_text())
    assert "publish" not in report and "published" not in report
    assert not (tmp_path / "registry").exists()


def test_the_gate_reads_typed_measures_the_same_way_for_both_kinds():
    """The encoder's and the decoder's measures are one type; the judge does not know which."""
    g = GateConfig()
    from pipeline.measure.results import DecodeResult

    m = gate.decode_measures({"perplexity_rise_pct": 0.1, "top1_agreement": 0.99,
                              "kl_mean": 0.001}, DecodeResult({}, False, None), Role.int4, g)
    assert isinstance(m, gate.Measures) and m.speed.speedup is None and m.agreement is None


def test_a_failed_push_is_recorded_in_the_report_then_raised(tmp_path):
    from pipeline.report.publish import publish_run

    blocker = tmp_path / "file"
    blocker.write_text("a file where the registry's folder should be")
    cfg = NS(workdir=str(tmp_path / "work"),
             registry=RegistryConfig(root=str(blocker / "registry")), model=NS(name="tiny"))
    out = _outcome(tmp_path, passed=True)
    with pytest.raises((OSError, PipelineError)) as raised:
        publish_run(cfg, out, _shipment(out, lambda r: "# r\n"))
    report = json.loads(next((tmp_path / "work" / "runs").glob("2*/report.json")).read_text())
    assert report["publish"]["status"] == "failed" and "published" not in report
    assert report["publish"]["error"] and str(blocker) in report["publish"]["error"] + str(
        raised.value)
