"""The run report: ``report.json`` and ``report.md``, one row per stage's model.

In: the recipe's ``Outcome``, the run record and the environment. Out: a run folder under
``<workdir>/runs/`` written atomically, and the path of its ``report.md``. Each row shows one
step's model (size, nodes, accuracy, CER, agreement with FP16, p50/p99 per batch size, speedup
against the fastest float baseline), so the effect of each step is visible on its own line.
"""
from __future__ import annotations

import json
import shutil
import time
import uuid
from pathlib import Path

from pipeline.stages.evaluate import agreement

ROWS = (("export", "export (torch -> ONNX, FP32)"), ("fp32", "optimize (FP32 baseline)"),
        ("fp16", "fp16 (baseline)"), ("candidate", "candidate"))


def rows(outcome, mode: str) -> list[dict]:
    out = []
    batches = outcome.bench.meta["batches"]
    for role, title in ROWS:
        art = outcome.models[role]
        if role == "candidate":
            title = f"{art.stage} ({mode}, candidate)"
        ev = outcome.evals[role].meta
        row = {"role": role, "step": title, "digest": art.digest,
               "size_mb": art.model.stat().st_size / 1e6,
               "nodes": sum(art.meta.get("nodes", {}).values()),
               **ev["metrics"], "agreement_with_fp16": agreement(outcome.evals[role], outcome.evals["fp16"]),
               "output_sha256": ev["output_sha256"], "latency": {}}
        for b, at in batches.items():
            lat = at["latency_ms"][role]
            fastest = at["latency_ms"][at["fastest_float"]]
            entry = {"p50": lat["p50"], "p99": lat["p99"], "p999": lat["p999"],
                     "throughput": lat["throughput"],
                     "speedup_vs_fastest_float": fastest["p50"] / lat["p50"]}
            if role == "candidate":  # the gated number: median of per-round ratios, with its CI
                sp = at["speedup_vs_fastest_float"]
                entry.update(speedup_vs_fastest_float=sp["median"], speedup_ci95=sp["ci95"])
            row["latency"][b] = entry
        out.append(row)
    return out


def markdown(report: dict) -> str:
    bs = list(report["rows"][0]["latency"])
    head = ("| step | size MB | nodes | seq acc % | CER % | agree fp16 % | "
            + " | ".join(f"p50/p99 ms b{b} | speedup b{b}" for b in bs) + " |")
    lines = [f"# {report['model']} — quant={report['quant']}", "",
             f"**Gate: {report['verdict']['summary']}**", "", head,
             "|" + "---|" * (6 + 2 * len(bs))]
    for r in report["rows"]:
        cells = [r["step"], f"{r['size_mb']:.2f}", str(r["nodes"]), f"{r['sequence_accuracy']:.2f}",
                 f"{r['cer']:.2f}", f"{100 * r['agreement_with_fp16']:.1f}"]
        for b in bs:
            lat = r["latency"][b]
            cells += [f"{lat['p50']:.2f} / {lat['p99']:.2f}", f"{lat['speedup_vs_fastest_float']:.2f}x"]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Speedup is against the fastest float baseline at that batch size (p50 ratio; the "
              "candidate's is the median of per-round ratios, 95 % CI in report.json)."]
    for b, aa in report["aa_check"].items():
        lines.append(f"A/A check at batch {b} (FP32 against a second copy of itself): "
                     f"{aa['median']:.3f} (95 % CI {aa['ci95'][0]:.3f}-{aa['ci95'][1]:.3f}).")
    lines += ["", "## Stages", "", "| stage | status | seconds | digest |", "|---|---|---|---|"]
    for s in report["stages"]:
        lines.append(f"| {s['label']} | {'reused' if s['reused'] else 'built'} | "
                     f"{s['seconds']:.1f} | `{s['digest'][:16]}` |")
    env = report["environment"]
    lines += ["", "## Environment", "", f"- CPU: {env['cpu']['model']} "
              f"({env['cpu']['logical_cores']} logical cores; {', '.join(env['cpu']['flags'])})",
              f"- Provider: {env['provider']}, threads {env['threads']}",
              "- Tools: " + ", ".join(f"{k} {v}" for k, v in env["tools"].items())]
    if report.get("published"):
        lines += ["", f"Published to `{report['published']}`."]
    return "\n".join(lines) + "\n"


def write(workdir: str, report: dict) -> Path:
    runs = Path(workdir) / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    name = time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + uuid.uuid4().hex[:6]
    tmp = runs / f".tmp-{name}"
    tmp.mkdir()
    try:
        (tmp / "report.json").write_text(json.dumps(report, indent=2, sort_keys=True, default=str))
        (tmp / "report.md").write_text(markdown(report))
        tmp.rename(runs / name)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    latest = runs / "latest"
    link = runs / f".latest-{name}"
    link.symlink_to(name)
    link.replace(latest)  # atomic switch of the 'latest' pointer
    return runs / name / "report.md"


def aa_checks(outcome) -> dict:
    return {b: at["aa_check"] for b, at in outcome.bench.meta["batches"].items()}

