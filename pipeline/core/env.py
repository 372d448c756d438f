"""The environment a result was produced in: tool versions, CPU model and flags, threads.

In: nothing (reads /proc/cpuinfo and package metadata). Out: plain dicts for manifests, and a
short hardware fingerprint that goes into the cache key of every hardware-dependent stage, so a
benchmark is never reused on a different CPU or thread setting. Package versions come from
metadata, not imports, so the cached path stays fast.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
from functools import lru_cache
from importlib import metadata

TOOLS = ("torch", "onnx", "onnxruntime", "onnxscript", "numpy", "datasets", "hydra-core")
# The flags that decide which kernels ONNX Runtime and oneDNN pick.
CPU_FLAGS = ("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
             "avx_vnni", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_int8", "amx_tile")


@lru_cache(maxsize=1)
def tool_versions() -> dict[str, str]:
    out = {}
    for name in TOOLS:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "absent"
    out["python"] = platform.python_version()
    return out


# Environment variables that cap the instruction set a library uses, and for each cap value the
# CPU flags it leaves usable. oneDNN (inside OpenVINO and torch) reads ONEDNN_MAX_CPU_ISA, torch's
# own kernels ATEN_CPU_CAPABILITY. Capped at AVX2 a VNNI or AMX machine runs the AVX2 kernels, so
# the settings that depend on the flags (INT8 weight range, training precision) must follow the cap.
_BASE = {"avx", "avx2", "fma", "f16c"}
_AVX512 = _BASE | {"avx512f", "avx512bw", "avx512vl"}
ISA_CAPS = {
    "ONEDNN_MAX_CPU_ISA": {"SSE41": set(), "AVX": {"avx"}, "AVX2": _BASE,
                           "AVX2_VNNI": _BASE | {"avx_vnni"}, "AVX2_VNNI_2": _BASE | {"avx_vnni"},
                           "AVX512_CORE": _AVX512, "AVX512_CORE_VNNI": _AVX512 | {"avx512_vnni"},
                           "AVX512_CORE_BF16": _AVX512 | {"avx512_vnni", "avx512_bf16"},
                           "AVX512_CORE_FP16": _AVX512 | {"avx512_vnni", "avx512_bf16",
                                                          "avx512_fp16"}},
    "ATEN_CPU_CAPABILITY": {"DEFAULT": set(), "AVX2": _BASE},
}


def isa_caps(environ=None) -> dict[str, str]:
    """The instruction-set caps set in the environment (name -> value, upper case)."""
    environ = os.environ if environ is None else environ
    return {k: environ[k].upper() for k in ISA_CAPS if environ.get(k)}


def capped(flags, environ=None) -> list[str]:
    """``flags`` less those a cap in ``environ`` forbids (an unknown or ALL cap forbids none)."""
    out = list(flags)
    for name, value in isa_caps(environ).items():
        allowed = ISA_CAPS[name].get(value)
        if allowed is not None:
            out = [f for f in out if f in allowed or not _governed(f)]
    return out


def _governed(flag: str) -> bool:
    return flag.startswith(("avx", "amx")) or flag in ("fma", "f16c")


def effective_flags() -> list[str]:
    """The CPU flags the libraries will use: this CPU's, less any instruction-set cap."""
    return capped(cpu_info()["flags"])


BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def training_precision(flags=None) -> dict:
    """float32 or bfloat16 for training and the pruning recovery, from the CPU's flags.

    bfloat16 autocast roughly halves a step where the CPU multiplies bf16 natively (AVX512-BF16,
    AMX); without them torch emulates it and a step is many times slower than in float32."""
    flags = effective_flags() if flags is None else flags
    have = [f for f in BF16_FLAGS if f in flags]
    if have:
        return {"dtype": "bfloat16", "reason": f"{'/'.join(have)}: native bf16 matmuls"}
    return {"dtype": "float32",
            "reason": "no avx512_bf16 or amx_bf16: torch would emulate bfloat16, far slower"}


@lru_cache(maxsize=1)
def cpu_info() -> dict:
    model, flags = platform.processor() or "unknown", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and model in ("unknown", ""):
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    out = {"model": model, "flags": [f for f in CPU_FLAGS if f in flags],
           "logical_cores": os.cpu_count(), "machine": platform.machine(),
           "kernel": platform.release()}
    if isa_caps():  # absent when uncapped, so recorded environments stay as they were
        out["isa_caps"] = isa_caps()
    return out


def meminfo_bytes(field: str) -> int | None:
    """A field of /proc/meminfo (``MemTotal``, ``MemAvailable``) in bytes; None where there is
    no such file (not Linux) or no such field."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(f"{field}:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def environment(hardware) -> dict:
    return {"tools": tool_versions(), "cpu": cpu_info(), "provider": hardware.provider,
            "threads": {"intra_op": hardware.intra_op_threads,
                        "inter_op": hardware.inter_op_threads,
                        "global_pool": True},
            "affinity": list(hardware.affinity) if hardware.affinity is not None
            else sorted(os.sched_getaffinity(0)),
            "runtime": {"name": _value(getattr(hardware, "runtime", "onnxruntime")),
                        "precision": _value(getattr(hardware, "precision", "fp32")),
                        "performance_hint": _value(getattr(hardware, "performance_hint",
                                                           "latency")),
                        "versions": runtime_versions()}}


def hardware_fingerprint(hardware) -> str:
    cpu = cpu_info()
    blob = {"cpu": [cpu["model"], cpu["flags"], cpu["logical_cores"], cpu["machine"]]
            + ([cpu["isa_caps"]] if "isa_caps" in cpu else []),
            "provider": hardware.provider, "threads": [hardware.intra_op_threads,
                                                       hardware.inter_op_threads],
            "affinity": list(hardware.affinity) if hardware.affinity is not None else None}
    runtime = _value(getattr(hardware, "runtime", "onnxruntime"))
    if runtime != "onnxruntime":  # absent for the default, so its keys stay as they were
        blob["runtime"] = [runtime, runtime_versions()]
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()


def _value(x):
    return getattr(x, "value", x)


@lru_cache(maxsize=1)
def runtime_versions() -> dict[str, str]:
    """Versions of the inference engines ``pipeline.runtimes`` can use ("absent" if missing)."""
    out = {}
    for name in ("onnxruntime", "openvino"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "absent"
    return out


def differences(a: dict, b: dict) -> list[str]:
    """What differs between two recorded environments (tools, CPU, provider, threads, affinity):
    results from different environments are not comparable, and callers warn or refuse."""
    out = []
    for key in ("tools", "cpu", "provider", "threads", "affinity"):
        va, vb = a.get(key), b.get(key)
        if isinstance(va, dict) and isinstance(vb, dict):
            out += [f"{key}.{k}: {va.get(k)!r} vs {vb.get(k)!r}"
                    for k in sorted(set(va) | set(vb)) if va.get(k) != vb.get(k)]
        elif va != vb:
            out.append(f"{key}: {va!r} vs {vb!r}")
    return out


def peak_rss_mb(children: bool = False) -> float:
    """This process's peak resident memory in MiB (Linux reports KiB); with ``children``, the
    larger of it and its waited-for children's. A stage runs in a child of its own, so this is
    the stage's peak."""
    import resource

    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if children:
        kib = max(kib, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    return kib / 1024
