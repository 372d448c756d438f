"""``hardware=cpu`` describes the machine the run is on: its numbers probed once per CPU, cached.

In: a composed ``HardwareConfig`` whose profile says ``probe: true`` (``conf/hardware/cpu.yaml``).
Out: the same profile with ``memory_gb``, ``memory_bandwidth_gbs`` and ``peak_tflops`` of this
machine, and a ``source`` naming the CPU, the date and the cache file. A committed profile would
carry the numbers of the machine it was measured on (another CPU's memory, a VNNI machine's INT8
peak), so the bill, roofline and capacity plan would describe a CPU that is not there.

The probe (``pipeline.measure.probe``) runs on first use for each CPU fingerprint (model, the flags
the kernels use, instruction-set caps, logical cores, threads, host memory) in a quick form (a
few seconds), and its result is written atomically to
``$XDG_CACHE_HOME/pipeline/hardware/<fingerprint>.json`` (default ``~/.cache``);
``python -m pipeline.bill probe`` measures longer and replaces that file. Values set on the
command line (``hardware.memory_gb=...``) are kept. A probe that fails, or a cache that cannot be
written, leaves the numbers unknown or uncached and says so in ``source``, never stops a run.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

VERSION = 2            # of the cached record; a change re-probes (2: FP32 on ONNX Runtime too)
QUICK = {"seconds": 0.2, "n": 1024}  # first use: seconds, not the full probe's half minute


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "pipeline" / "hardware"


def fingerprint(threads: int, cpu: dict | None = None, memory: float | None = None) -> str:
    """What the probed numbers depend on; the cache file's name."""
    from pipeline.measure.probe import memory_gb
    from pipeline.core.env import cpu_info

    cpu = cpu_info() if cpu is None else cpu
    memory = memory_gb() if memory is None else memory
    blob = {"version": VERSION, "model": cpu.get("model"), "flags": cpu.get("flags"),
            "isa_caps": cpu.get("isa_caps", {}), "cores": cpu.get("logical_cores"),
            "machine": cpu.get("machine"), "threads": threads,
            "memory_gb": round(memory, 1) if memory else None}
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:16]


def _read(path: Path) -> dict | None:
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # absent or torn: probe again
    if not (isinstance(record, dict) and record.get("version") == VERSION
            and isinstance(record.get("profile"), dict)):
        return None
    return record if "fp32" in record["profile"].get("peak_tflops", {}) else None


def write(path: Path, record: dict) -> None:
    """Atomically: a reader sees the old file or the whole new one, never half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(record, f, indent=2, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def record_of(result: dict, fp: str) -> dict:
    return {"version": VERSION, "fingerprint": fp, "cpu": result["cpu"],
            "threads": result["threads"], "date": result["date"],
            "memory_gb": result["memory_gb"], "profile": result["profile"],
            "busy": result.get("busy", []), "probe_seconds": result.get("seconds")}


def profile(threads: int, probe_fn=None, directory: Path | None = None) -> tuple[dict, str]:
    """(this machine's record, a one-line source): from the cache, else probed and cached."""
    fp = fingerprint(threads)
    path = (cache_dir() if directory is None else directory) / f"{fp}.json"
    record = _read(path)
    if record is not None:
        return record, _source(record, f"cached {path}")
    if probe_fn is None:  # in a child: the probe sets torch's thread count and allocates 1 GB
        from pipeline.core import isolate
        from pipeline.measure.probe import probe

        probe_fn = lambda t: isolate.call("probe this machine", probe, t, **QUICK)  # noqa: E731
    record = record_of(probe_fn(threads), fp)
    try:
        write(path, record)
        where = f"cached {path}"
    except OSError as e:
        where = f"not cached: {path.parent}: {e.strerror or e}"
    return record, _source(record, where)


def _source(record: dict, where: str) -> str:
    busy = f"; {len(record['busy'])} other busy processes during the probe" \
        if record.get("busy") else ""
    return (f"probed on this machine: {record['cpu']}, {record['threads']} threads, "
            f"{record['date']} (fingerprint {record['fingerprint']}, {where}{busy})")


def apply(hardware) -> None:
    """Fill a ``probe: true`` profile with this machine's numbers, in place."""
    if not getattr(hardware, "probe", False):
        return
    try:
        record, source = profile(hardware.intra_op_threads)
    except Exception as e:  # noqa: BLE001 - a failed probe leaves the numbers unknown, said so
        hardware.source = f"probe of this machine failed ({type(e).__name__}: {e}); numbers unknown"
        return
    if hardware.memory_gb is None:
        hardware.memory_gb = record["memory_gb"]
    if hardware.memory_bandwidth_gbs is None:
        hardware.memory_bandwidth_gbs = record["profile"]["memory_bandwidth_gbs"]
    for key, value in record["profile"]["peak_tflops"].items():
        if getattr(hardware.peak_tflops, key, 0) is None:
            setattr(hardware.peak_tflops, key, value)
    hardware.source = source
