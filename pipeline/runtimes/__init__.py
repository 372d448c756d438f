"""Runtimes: the inference engines a model is run, measured and gated on.

In: an ONNX file and the stage's target (``config.HardwareRuntime``: threads, affinity,
``runtime``, ``precision``, ``performance_hint``). Out: a loaded model with ``run(batch) ->
logits`` and ``describe(example) -> dict`` (engine, version, the settings it was compiled with and
the precision its convolutions and matmuls actually executed in, read back from the engine). The
backends are a plain dict of modules, imported on use: ``onnxruntime`` (sessions on one
process-global thread pool) and ``openvino`` (the CPU plugin with explicit threads, performance
hint and inference precision). Also here: which (runtime, precision) targets this CPU offers and
the config check run before anything is built. A runtime that is missing, refuses an operator or
fails to compile raises ``RuntimeFailure`` naming itself, so callers can record it per runtime and
go on with the others. Deliberately not handled: GPU providers and TensorRT (later targets).
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Protocol

import numpy as np

from pipeline.core.errors import ConfigError
# The backends import these from their own module, so this package, which imports a backend by
# name, is never imported back by one; callers still name them pipeline.runtimes.RuntimeFailure.
from pipeline.runtimes.failure import RuntimeFailure, first_line

BACKENDS = {"onnxruntime": "pipeline.runtimes.onnxruntime",
            "openvino": "pipeline.runtimes.openvino"}
PRECISIONS = ("fp32", "bf16", "fp16")
# The CPU flags that give a float precision native kernels (x86, as /proc/cpuinfo names them).
PRECISION_FLAGS = {"bf16": ("avx512_bf16", "amx_bf16"), "fp16": ("avx512_fp16", "amx_fp16")}


class Loaded(Protocol):
    def run(self, batch: dict | np.ndarray) -> np.ndarray: ...  # feeds by name -> 1st output

    def describe(self, example: dict | np.ndarray | None = None) -> dict: ...


class Backend(Protocol):
    NAME: str

    def version(self) -> str | None: ...

    def precisions(self) -> tuple[str, ...]: ...

    def load(self, model: Path, settings) -> Loaded: ...


@dataclass(frozen=True, order=True)
class Target:
    """One column of the runtime comparison: an engine and the precision of its float ops."""
    runtime: str
    precision: str

    def __str__(self) -> str:
        return f"{self.runtime} {self.precision}"


PRIMARY = Target("onnxruntime", "fp32")  # the project's default target


def backend(name: str) -> Backend:
    if name not in BACKENDS:
        raise ConfigError(f"hardware.runtime={name!r}: unknown; valid choices: "
                          f"{', '.join(BACKENDS)}, auto")
    return importlib.import_module(BACKENDS[name])


def installed(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def concrete(settings):
    """``runtime=auto`` before a choice exists (e.g. the quantization search) runs the primary
    target, so those evaluations are the ones a default run would make."""
    if settings.runtime == "auto":
        return dataclasses.replace(settings, runtime=PRIMARY.runtime, precision=PRIMARY.precision)
    return settings


def settings_for(settings, target: Target):
    """The stage's settings with the runtime and precision of ``target``."""
    return dataclasses.replace(settings, runtime=target.runtime, precision=target.precision)


def load(model: Path, settings) -> Loaded:
    """Load ``model`` on the settings' runtime; any failure is a one-line ``RuntimeFailure``."""
    settings = concrete(settings)
    name = settings.runtime
    if not installed(name):
        raise RuntimeFailure(f"{name}: not installed (pip install {name})")
    try:
        return backend(name).load(Path(model), settings)
    except RuntimeFailure:
        raise
    except Exception as e:  # noqa: BLE001 - one line naming the runtime; the caller goes on
        raise RuntimeFailure(f"{name} {settings.precision}: {type(e).__name__}: "
                             f"{first_line(e)}") from None


def probe(model: Path, settings, batch: np.ndarray) -> dict:
    """Load, run ``batch`` once and describe: {"output", "describe"}. Sets the process-global
    ONNX Runtime pool, so call it in a child (``pipeline.core.isolate.call``)."""
    loaded = load(model, settings)
    first = {n: a[:1] for n, a in batch.items()} if isinstance(batch, dict) else batch[:1]
    return {"output": loaded.run(batch), "describe": loaded.describe(first)}


@lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """Every flag of the first CPU in /proc/cpuinfo (empty where there is none), less those an
    instruction-set cap in the environment (``ONEDNN_MAX_CPU_ISA``) forbids."""
    from pipeline.core.env import capped

    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(capped(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return frozenset()


def cpu_supports(precision: str, flags=None) -> bool:
    flags = cpu_flags() if flags is None else flags
    return precision == "fp32" or any(f in flags for f in PRECISION_FLAGS.get(precision, ()))


def targets(flags=None) -> tuple[list[Target], dict[str, str]]:
    """Every (runtime, precision) this machine can run, and why each other one cannot."""
    flags = cpu_flags() if flags is None else flags
    found, missing = [], {}
    for name in BACKENDS:
        if not installed(name):
            missing[name] = f"not installed (pip install {name})"
            continue
        for p in PRECISIONS:
            t = Target(name, p)
            if p not in backend(name).precisions():
                missing[str(t)] = f"{name} has no {p} inference precision on the CPU"
            elif not cpu_supports(p, flags):
                missing[str(t)] = (f"this CPU has neither {' nor '.join(PRECISION_FLAGS[p])}")
            else:
                found.append(t)
    return found, missing


def check(hardware, quant_mode: str, flags=None) -> None:
    """The runtime settings against this machine, before anything is built (ConfigError)."""
    flags = cpu_flags() if flags is None else flags
    value = lambda x: getattr(x, "value", x)  # noqa: E731 - enums or plain strings
    runtime, precision = value(hardware.runtime), value(hardware.precision)
    key = "hardware.precision"
    if value(quant_mode) == "bf16":
        precision, key = "bf16", "quant"
    if runtime != "onnxruntime" and value(getattr(hardware, "kind", "cpu")) != "cpu":
        raise ConfigError(f"hardware.runtime={runtime}: OpenVINO targets run on the CPU here; "
                          f"hardware={hardware.name} is a {value(hardware.kind)} profile "
                          "(valid: onnxruntime)")
    if precision not in PRECISIONS:
        raise ConfigError(f"{key}={precision}: valid choices: {', '.join(PRECISIONS)}")
    if not cpu_supports(precision, flags):
        have = [f for f in ("avx512_bf16", "amx_bf16", "avx512_fp16", "amx_fp16") if f in flags]
        valid = [p for p in PRECISIONS if cpu_supports(p, flags)]
        raise ConfigError(f"{key}={precision}: this CPU has neither "
                          f"{' nor '.join(PRECISION_FLAGS[precision])} (its float flags: "
                          f"{', '.join(have) or 'none'}); valid here: {', '.join(valid)}")
    if runtime == "auto":
        return
    if not installed(runtime):
        raise ConfigError(f"hardware.runtime={runtime}: the {runtime} package is not installed "
                          f"(pip install {runtime}); valid choices here: "
                          + ", ".join([n for n in BACKENDS if installed(n)] + ["auto"]))
    offered = backend(runtime).precisions()
    if precision not in offered:
        raise ConfigError(f"{key}={precision}: {runtime} runs float ops on the CPU in "
                          f"{', '.join(offered)} only; use hardware.runtime=openvino or auto")
