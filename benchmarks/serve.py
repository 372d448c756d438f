"""``make bench`` section ``serve``: the OCR artifact behind the real server, measured from raw
bytes by the load generator (``pipeline.serve.load``), on 127.0.0.1.

- ``cpu_bound``: what this process's cores can do at most, measured here: the model alone at
  batch 1 on a preprocessed scanner-size line (its runtime's threads on every usable core), and
  decoding + preprocessing one scanner-size PNG on one core; the bound of a server is the slower
  of the two shares.
- ``servers``: the INT8 candidate from PNG bytes of lines at a scanner's size (4x the model's
  32-pixel height, ``--scale 4``) behind ``inline`` (all in the handler), ``pipeline`` (worker
  processes + batcher) and a naive FastAPI handler per request (``benchmarks.serve_naive``), and
  the FP32 model behind ``pipeline``: each one's open-loop sweep (steps of ``step_seconds``,
  steady-state windows) and its highest steady rate within ``slo.p99_ms``, side by side.
- ``soak``: the pipeline server at half its highest rate for ``soak_seconds`` (600 in make
  bench): the windows' p99 first and last, and the server's RSS before and after.
- ``encoder``: the zoo's all-mpnet-base-v2 (dynamic INT8) served from UTF-8 sentences: the same
  CPU bound and sweeps (inline, producer/consumer, FP32), no naive row.
Not measured yet: a decoder (the server does not generate).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SCALE = 4.0        # a 300 dpi scanner's line: about 128 pixels tall
LINES = 64         # distinct request bodies


def _start(cmd: list[str], port_file: Path, timeout: float = 300) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.monotonic() + timeout
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"server did not start: {' '.join(cmd)} (exit {proc.poll()})")
        time.sleep(0.1)
    time.sleep(0.2)  # the naive server writes the port as soon as it listens
    return proc, f"http://127.0.0.1:{port_file.read_text()}"


def _stop(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait()


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(ln.split()[1]) / 1024 for ln in f if ln.startswith("VmRSS:"))


def _fp32_folder(run: Path, report: dict, dest: Path) -> Path:
    """The run's FP32 model as a pulled folder would hold it (with the tokenizer files a text
    model's spec names, from the run's model folder), so the server serves it as is."""
    dest.mkdir(parents=True)
    shutil.copy(Path(report["lineage"]["fp32"]["path"]) / "model.onnx", dest / "model.onnx")
    spec = report.get("serving") or {}
    for name in spec.get("files", {}):
        shutil.copy(Path(report["config"]["model"]["path"]) / name, dest / name)
    fp32 = next(r for r in report["rows"] if r["role"] == "fp32")
    (dest / "manifest.json").write_text(json.dumps({
        "config": report["config"], "serving": report.get("serving"),
        "metrics": {"output_sha256": fp32.get("output_sha256")},
        "runtime": {"deployed": {"runtime": "onnxruntime", "precision": "fp32"}}}))
    return dest


def cpu_bound(run_dir: Path, bodies: list[bytes]) -> dict:
    """The model alone at batch 1 (its threads on every usable core) and reading one request
    (decode + preprocess, through the server's own reader) on one core, each timed alone."""
    from pipeline import runtimes
    from pipeline.config import HardwareRuntime
    from pipeline.measure import timing
    from pipeline.serve.artifact import open_ref
    from pipeline.serve.config import usable_cores
    from pipeline.serve.inputs import Limits
    from pipeline.serve.load import _content_type
    from pipeline.serve.readers import reader

    cores = usable_cores()
    served = open_ref(str(run_dir), Path(tempfile.mkdtemp(prefix="bench-bound-")))
    r = reader(served.task_key)
    limits = Limits(1 << 26, 1 << 26, 1 << 16)
    feeds = [r.stack([r.prepare(b, _content_type(b), limits).feeds]) for b in bodies[:16]]
    model = runtimes.load(served.model, HardwareRuntime("cpu", "CPUExecutionProvider", cores, 1))
    timing.warm_up(model.run, feeds[:2])
    model_ms = float(np.median([timing.clock_ms(model.run, feeds[k % len(feeds)])
                                for k in range(200)]))
    prep = []
    for k in range(200):
        body = bodies[k % len(bodies)]
        start = time.perf_counter()
        r.prepare(body, _content_type(body), limits)
        prep.append((time.perf_counter() - start) * 1000.0)
    prep_ms = float(np.median(prep))
    return {"cores": cores, "model_ms_b1": model_ms, "decode_preprocess_ms_1_core": prep_ms,
            # serial on one stream: each request pays both; split: the model's share alone
            "bound_qps_serial": 1000.0 / (model_ms + prep_ms),
            "bound_qps_model_only": 1000.0 / model_ms}


def _sweep(servers: dict, bodies: list[bytes], cfg, bound: float, tmp: Path,
           soak_seconds: float = 0.0) -> tuple[dict, dict | None]:
    """Each server started, swept open-loop from an eighth of the CPU bound up, and stopped:
    ({name: highest steady rate within the target, steps, exit code}, the soak or None)."""
    from pipeline.serve import load

    out, soak = {}, None
    for name, cmd in servers.items():
        port_file = tmp / f"{name.replace(' ', '_')}.port"
        cmd = cmd + ([str(port_file)] if "serve_naive" in cmd[2] else
                     ["--port", "0", "--ready-file", str(port_file)])
        proc, url = _start(cmd, port_file)
        try:
            rep = load.run(url, bodies, cfg, start_qps=max(1.0, bound / 8), growth=1.4,
                           max_steps=14)
            out[name] = {"max_qps_within_slo": rep.max_qps_within_slo,
                         "steps": [vars(s) for s in rep.steps]}
            if name == "int8 pipeline" and soak_seconds > 0 and rep.max_qps_within_slo:
                rss0 = _rss_mb(proc.pid)
                soak_cfg = load.LoadConfig(slo_p99_ms=cfg.slo_p99_ms, step_seconds=soak_seconds,
                                           window_s=10.0)
                s = load.run(url, bodies, soak_cfg, rates=[rep.max_qps_within_slo / 2])
                step = s.steps[0]
                soak = {"qps": step.offered_qps, "seconds": soak_seconds,
                        "p99_ms": step.p99_ms, "errors": step.errors,
                        "window_p99_ms_first_last": [step.window_p99_ms[0],
                                                     step.window_p99_ms[-1]],
                        "rss_mb_before_after": [rss0, _rss_mb(proc.pid)]}
        finally:
            out.setdefault(name, {})["exit_code"] = _stop(proc)
    return out, soak


def section(base: list[str], cli, run_dir: Path | None = None, step_seconds: float = 5.0,
            soak_seconds: float = 600.0, encoder: bool = True, quick: bool = False) -> dict:
    from pipeline.serve import load

    if run_dir is None:
        code, _, report = cli(base)
        if not report:
            raise RuntimeError(f"the pipeline wrote no report (exit {code})")
        run_dir = Path("artifacts/runs/latest").resolve()
    report = json.loads((Path(run_dir) / "report.json").read_text())
    slo = float(report["config"]["slo"]["p99_ms"])
    bodies = load.ocr_lines(LINES, SCALE)
    out: dict = {"run": str(run_dir), "slo_p99_ms": slo, "scale": SCALE,
                 "body_bytes_median": int(np.median([len(b) for b in bodies])),
                 "cpu_bound": cpu_bound(run_dir, bodies), "servers": {}}
    bound = out["cpu_bound"]["bound_qps_serial"]
    cfg = load.LoadConfig(slo_p99_ms=slo, step_seconds=step_seconds, window_s=1.0)
    tmp = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    serve = [sys.executable, "-m", "pipeline.serve"]
    servers = {
        "int8 inline": serve + [str(run_dir), "--mode", "inline"],
        "int8 pipeline": serve + [str(run_dir)],
        "int8 naive FastAPI": [sys.executable, "-m", "benchmarks.serve_naive",
                               str(Path(report["lineage"]["candidate"]["path"]) / "model.onnx")],
        "fp32 pipeline": serve + [str(_fp32_folder(run_dir, report, tmp / "fp32"))],
    }
    try:
        out["servers"], soak = _sweep(servers, bodies, cfg, bound, tmp, soak_seconds)
        if soak:
            out["soak"] = soak
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out["targets"] = targets(out)
    if encoder:
        try:
            out["encoder"] = encoder_section(cli, slo, step_seconds, quick)
        except Exception as e:  # noqa: BLE001 - a benchmark: the OCR rows stand, the cause is kept
            out["encoder"] = {"error": f"{type(e).__name__}: {e}"}
    return out


def encoder_section(cli, slo: float, step_seconds: float, quick: bool) -> dict:
    """The zoo's all-mpnet-base-v2 (``benchmarks.zoo.mpnet``: from the package index, never a
    model hub) compiled with dynamic INT8, then served from UTF-8 sentences: inline, producer/
    consumer, and the FP32 model behind producer/consumer, with the CPU bound measured the same
    way. No naive FastAPI row: ``benchmarks.serve_naive`` reads images."""
    from benchmarks.zoo import mpnet
    from pipeline.serve import load

    folder = mpnet.model_folder().resolve()
    size = mpnet.QUICK if quick else mpnet.FULL
    tmp = Path(tempfile.mkdtemp(prefix="bench-serve-text-"))
    try:
        data = tmp / "sentences.jsonl"
        data.write_text("".join(json.dumps({"text": t}) + "\n"
                                for t in mpnet.sentences(size["sentences"])))
        workdir = Path("artifacts") / "bench-serve-mpnet"
        run = mpnet.run_pipeline(cli, folder, data, workdir, "dynamic", size, quick)
        if "error" in run:
            return {"error": run["error"], "command": run.get("command")}
        run_dir = (workdir / "runs" / "latest").resolve()
        report = json.loads((run_dir / "report.json").read_text())
        # sentences the evaluation did not read (seed 1), as a client would send them
        bodies = [t.encode() for t in mpnet.sentences(64, seed=1)]
        out: dict = {"model": mpnet.NAME, "quant": "dynamic", "run": str(run_dir),
                     "slo_p99_ms": slo, "verdict": report["verdict"].get("summary"),
                     "body_bytes_median": int(np.median([len(b) for b in bodies])),
                     "cpu_bound": cpu_bound(run_dir, bodies)}
        cfg = load.LoadConfig(slo_p99_ms=slo, step_seconds=step_seconds, window_s=1.0)
        serve = [sys.executable, "-m", "pipeline.serve"]
        servers = {"int8 inline": serve + [str(run_dir), "--mode", "inline"],
                   "int8 pipeline": serve + [str(run_dir)],
                   "fp32 pipeline": serve + [str(_fp32_folder(run_dir, report, tmp / "fp32"))]}
        out["servers"], _ = _sweep(servers, bodies, cfg, out["cpu_bound"]["bound_qps_serial"],
                                   tmp)
        out["targets"] = targets(out)
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def targets(section: dict) -> dict:
    """Highest steady rates within the target (req/s), compared as the issue asks; a comparison
    with a server the section did not run is left out."""
    m = {k: round(v.get("max_qps_within_slo") or 0.0, 1) for k, v in section["servers"].items()}
    pipe = m.get("int8 pipeline", 0.0)
    rows = {"INT8 from raw bytes: producer/consumer beats inline": ("int8 inline", "inline"),
            "INT8 from raw bytes: producer/consumer beats a naive FastAPI handler":
                ("int8 naive FastAPI", "naive"),
            "producer/consumer: INT8 beats FP32 end to end": ("fp32 pipeline", "fp32")}
    return {what: [{"pipeline": pipe, short: m[name]}, pipe > m[name]]
            for what, (name, short) in rows.items() if name in m}


def table(section: dict) -> list[str]:
    """The results page's rows: each server's highest steady rate within the target, and the
    stages of its fastest step that met it; the OCR model's, then the encoder's."""
    if "servers" not in section:
        return []
    lines = _rows(section, f"PNG at {section['scale']:g}x",
                  f"a {section['scale']:g}x line")
    if "soak" in section:
        k = section["soak"]
        lines.append(f"\nSoak: {k['qps']:.1f} req/s for {k['seconds']:g} s, p99 {k['p99_ms']:.1f} "
                     f"ms, errors {k['errors'] or 0}, server RSS {k['rss_mb_before_after'][0]:.0f}"
                     f" -> {k['rss_mb_before_after'][1]:.0f} MB.")
    enc = section.get("encoder") or {}
    if "servers" in enc:
        lines += ["", f"Text encoder {enc['model']} ({enc['quant']} INT8; gate: {enc['verdict']}):",
                  ""] + _rows(enc, "UTF-8 sentences", "a sentence")
    elif "error" in enc:
        lines += ["", f"Text encoder: not measured ({enc['error']})"]
    return lines + [""]


def _rows(section: dict, bodies: str, one: str) -> list[str]:
    b = section["cpu_bound"]
    lines = [f"CPU bound on {b['cores']} usable cores: the model alone {b['model_ms_b1']:.2f} ms "
             f"at batch 1, decoding + preprocessing {one} {b['decode_preprocess_ms_1_core']:.2f} "
             f"ms on one core: at most {b['bound_qps_serial']:.0f} requests/s done one after the "
             "other.\n",
             f"| server (p99 <= {section['slo_p99_ms']:g} ms, {bodies}) "
             "| highest steady rate | p50 / p99 there | decode | preprocess | queue | inference "
             "| postprocess | network |", "|---|---|---|---|---|---|---|---|---|"]
    for name, s in section["servers"].items():
        ok = [st for st in s.get("steps", []) if st.get("meets_slo")]
        if not ok:
            lines.append(f"| {name} | 0 | — | | | | | | |")
            continue
        st = max(ok, key=lambda x: x["offered_qps"])
        ms = st.get("stage_ms", {})
        cells = [f"{ms[k]:.2f}" if k in ms else "—" for k in
                 ("decode", "preprocess", "queue", "inference", "postprocess")]
        lines.append(f"| {name} | {s['max_qps_within_slo']:.1f} req/s | {st['p50_ms']:.1f} / "
                     f"{st['p99_ms']:.1f} ms | " + " | ".join(cells)
                     + f" | {st['network_ms']:.2f} |")
    return lines
