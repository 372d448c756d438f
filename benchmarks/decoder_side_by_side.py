"""SmolLM2-135M through ``quant=auto`` with this checkout and with an older commit, one after the
other on the same machine: ``python -m benchmarks.decoder_side_by_side [--base COMMIT]
[--bench-json bench.json]``.

Issue 39 asks that a decoder's ``quant=auto`` take at most a third of the wall time it took
before the issue's work (``BASE``, the commit its runs measured), with the same verdict and the
same shipped candidate. Timings from different days or machines cannot show that, so both run
here, in turn: the same model (the llm section's SmolLM2-135M-Instruct in FP32, from its GGUF in
the package index), the same 200 text rows (64 scored, 32 for calibration, as the issue's run),
each from a fresh work folder, with this checkout's Python environment. The older commit is
checked out with ``git worktree`` into a temporary folder, removed afterwards. Out: each side's
wall time, exit code, verdict, shipped candidate and each candidate's verdict and decode speedup,
and the ratio of the wall times, in ``bench.json``'s ``llm`` section (``side_by_side``). The
machine's load average is recorded around each side: a neighbour's work stretches one side only.
A benchmark, not a test: nothing here asserts.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.decoder_runs import add_to_llm_section

BASE = "9f62cd7"          # the commit whose runs issue 39 reports (2 h on a 0.5 B model)
TARGET_RATIO = 1 / 3      # issue 39: at most a third of the earlier wall time
EVALUATION, CALIBRATION, ROWS = 64, 32, 200


def _side(src: Path, hf: Path, data: Path, work: Path) -> dict:
    """``quant=auto`` from ``src``'s code in the fresh folder ``work``: time, verdict, pick."""
    cmd = [sys.executable, "-m", "pipeline", "model=hf", f"model.path={hf}", "quant=auto",
           "data=jsonl", f"data.path={data}", "data.input_column=text",
           f"data.evaluation_samples={EVALUATION}", f"data.calibration_samples={CALIBRATION}",
           f"workdir={work}", f"data_dir={work / 'data'}", f"registry.root={work / 'registry'}"]
    load = os.getloadavg()[0]
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=src, env={**os.environ, "PYTHONPATH": str(src)},
                          capture_output=True, text=True)
    out = {"seconds": round(time.time() - t0, 1), "returncode": proc.returncode,
           "load_average_1min": [round(load, 2), round(os.getloadavg()[0], 2)]}
    report = work / "runs" / "latest" / "report.json"
    if not report.is_file():
        out["error"] = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return out
    r = json.loads(report.read_text())
    auto = r.get("auto") or {}
    out.update(verdict="PASS" if r["verdict"]["passed"] else "FAIL", winner=auto.get("winner"),
               published=r.get("published"),
               candidates={k: {"passed": v.get("passed"), "speedup": v.get("speedup")}
                           for k, v in (auto.get("candidates") or {}).items()})
    return out


def measure(base: str) -> dict:
    from benchmarks.llm import fp32_folder, texts

    hf = fp32_folder().resolve()
    repo = Path(__file__).resolve().parent.parent
    tmp = Path(tempfile.mkdtemp(prefix="side-by-side-"))
    data = tmp / "text.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts(ROWS)))
    older = tmp / "base"
    subprocess.run(["git", "worktree", "add", "--detach", str(older), base], cwd=repo,
                   check=True, capture_output=True)
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo,
                              capture_output=True, text=True).stdout.strip()
        now = _side(repo, hf, data, tmp / "work-now")
        before = _side(older, hf, data, tmp / "work-base")
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(older)], cwd=repo,
                       capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
    ratio = now["seconds"] / before["seconds"] if before.get("seconds") else None
    return {"model": "SmolLM2-135M-Instruct (FP32, from the llm section's GGUF)",
            "rows": {"evaluation": EVALUATION, "calibration": CALIBRATION, "text_rows": ROWS},
            "now": {"commit": head, **now}, "base": {"commit": base, **before},
            "ratio": round(ratio, 3) if ratio else None,
            "same_pick": now.get("winner") == before.get("winner"),
            "same_verdict": now.get("verdict") == before.get("verdict")}


def targets(out: dict) -> dict:
    return {"SmolLM2 quant=auto side by side: wall time <= 1/3 of the base commit's":
            [out["ratio"], out["ratio"] is not None and out["ratio"] <= TARGET_RATIO],
            "SmolLM2 quant=auto side by side: same verdict and same shipped candidate":
            [{"now": out["now"].get("winner"), "base": out["base"].get("winner")},
             out["same_pick"] and out["same_verdict"]]}


def table(section: dict) -> list[str]:
    """The results page's rows for the side-by-side run, when the section has one."""
    s = section.get("side_by_side")
    if not isinstance(s, dict) or "now" not in s:
        return []
    lines = [f"`quant=auto` side by side ({s['model']}, `python -m "
             "benchmarks.decoder_side_by_side`), one after the other on one machine:", "",
             "| code | wall time | load average (before, after) | verdict | shipped |",
             "|---|---|---|---|---|"]
    for side in ("base", "now"):
        r = s[side]
        load = r.get("load_average_1min") or ["—", "—"]
        lines.append(f"| {r['commit']} | {r['seconds']} s | {load[0]}, {load[1]} "
                     f"| {r.get('verdict') or r.get('error')} | {r.get('winner')} |")
    return lines + ["", f"Ratio of the wall times: {s['ratio']}.", ""]


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default=BASE, help="the older commit to run beside this checkout")
    ap.add_argument("--bench-json", type=Path, default=None,
                    help="add the record to this file's llm section and render the results page")
    args = ap.parse_args(argv)
    out = measure(args.base)
    print(json.dumps(out, indent=2, default=str))
    if args.bench_json:
        add_to_llm_section(args.bench_json, "side_by_side", out, targets(out))
        subprocess.run([sys.executable, "-m", "benchmarks.results", str(args.bench_json)],
                       check=False)
    return out


if __name__ == "__main__":
    main()
