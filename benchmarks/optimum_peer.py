"""Optimum's default dynamic INT8 of an exported ONNX model, run inside Optimum's own venv.

``make bench`` builds ``.venv-optimum`` (``optimum-onnx``, the package that holds
``ORTQuantizer``, with the transformers it accepts and the same onnxruntime and onnx as
``.venv``), because ``optimum-onnx`` 0.1.0 requires transformers < 4.58 and the ``hf`` extra has
transformers 5. The ``transformer`` section runs this file as a script with that venv's Python in
isolated mode (``python -I``): it imports only the standard library, Optimum and what Optimum
pulls, never the project. In: the exported ``model.onnx``, the model folder whose
``config.json`` Optimum reads, and a folder to create. Out, in that folder:
``model_quantized.onnx`` (``ORTQuantizer.quantize`` with
``AutoQuantizationConfig.<arch>(is_static=False)``, every other argument left at Optimum's
default; ``<arch>`` chosen from this CPU's flags), Optimum's own ``ort_config.json``, and
``optimum.json``: the method, its settings, the flags it was chosen from, the versions of
optimum, optimum-onnx, transformers, onnxruntime and onnx, and the op types of the result. Bad
input ends with one line and exit 2, a failure of Optimum with one line and exit 3; nothing
half-written is left in place of the folder.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> set[str]:
    """This CPU's flags as the kernel lists them (the ``flags`` line of the first processor)."""
    try:
        for line in Path(cpuinfo).read_text().splitlines():
            if line.startswith(("flags", "Features")):  # x86, arm64
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def arch(flags: set[str], machine: str | None = None) -> str:
    """The ``AutoQuantizationConfig`` method Optimum's docs name for a CPU with these flags: the
    widest integer instructions it has (VNNI, then AVX-512, else AVX2; ``arm64`` on ARM)."""
    machine = (machine or platform.machine()).lower()
    if machine in ("aarch64", "arm64"):
        return "arm64"
    if "avx512_vnni" in flags:
        return "avx512_vnni"
    if "avx512f" in flags:
        return "avx512"
    return "avx2"


def versions() -> dict[str, str]:
    from importlib import metadata

    out = {}
    for name in ("optimum", "optimum-onnx", "transformers", "onnxruntime", "onnx", "torch"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "absent"
    out["python"] = platform.python_version()
    return out


def settings(qconfig) -> dict:
    """The fields of Optimum's ``QuantizationConfig`` that decide the quantized graph, as text."""
    keys = ("is_static", "format", "mode", "activations_dtype", "activations_symmetric",
            "weights_dtype", "weights_symmetric", "per_channel", "reduce_range",
            "operators_to_quantize", "nodes_to_quantize", "nodes_to_exclude")
    return {k: (getattr(qconfig, k) if isinstance(getattr(qconfig, k), (bool, list))
                else str(getattr(qconfig, k))) for k in keys}


def stage(model: Path, config_dir: Path, into: Path) -> None:
    """A folder as Optimum expects one: the model as ``model.onnx`` with the files beside it
    (external data keeps its name) and the folder's ``config.json``, linked where the file system allows."""
    files = {"model.onnx": model}
    files.update({p.name: p for p in model.parent.iterdir()
                  if p.is_file() and p.suffix != ".onnx" and p.name not in files})
    files["config.json"] = config_dir / "config.json"  # the model's, whatever lies beside it
    for name, src in files.items():
        try:
            os.link(src, into / name)
        except OSError:
            shutil.copy2(src, into / name)


def quantize(model: Path, config_dir: Path, out: Path, method: str) -> dict:
    from onnx import load
    from optimum.onnxruntime import ORTQuantizer
    from optimum.onnxruntime.configuration import AutoQuantizationConfig

    qconfig = getattr(AutoQuantizationConfig, method)(is_static=False)
    with tempfile.TemporaryDirectory(prefix=".optimum-in-", dir=out.parent) as given:
        stage(model, config_dir, Path(given))
        t0 = time.perf_counter()
        ORTQuantizer.from_pretrained(given, file_name="model.onnx").quantize(
            quantization_config=qconfig, save_dir=out)
        seconds = time.perf_counter() - t0
    result = out / "model_quantized.onnx"
    ops = Counter(n.op_type for n in load(str(result), load_external_data=False).graph.node)
    return {"auto_quantization_config": f"AutoQuantizationConfig.{method}(is_static=False)",
            "settings": settings(qconfig), "model": result.name,
            "quantize_seconds": round(seconds, 2), "op_types": dict(sorted(ops.items()))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path, help="the exported ONNX file")
    ap.add_argument("config_dir", type=Path, help="the model folder holding config.json")
    ap.add_argument("out", type=Path, help="the folder to create for the quantized model")
    ap.add_argument("--arch", choices=("arm64", "avx2", "avx512", "avx512_vnni"),
                    help="the AutoQuantizationConfig method (default: from this CPU's flags)")
    args = ap.parse_args(argv)
    if not args.model.is_file():
        print(f"optimum_peer: {args.model}: no such ONNX file", file=sys.stderr)
        return 2
    if not (args.config_dir / "config.json").is_file():
        print(f"optimum_peer: {args.config_dir}: no config.json", file=sys.stderr)
        return 2
    if args.out.exists():
        print(f"optimum_peer: {args.out}: already exists (give a new folder)", file=sys.stderr)
        return 2
    flags = cpu_flags()
    method = args.arch or arch(flags)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{args.out.name}-", dir=args.out.parent))
    try:
        record = quantize(args.model, args.config_dir, partial, method)
        record.update(chosen_from={"machine": platform.machine(),
                                   "flags": sorted(f for f in flags if f.startswith(("avx", "amx")))},
                      arch_given=args.arch is not None, versions=versions())
        (partial / "optimum.json").write_text(json.dumps(record, indent=2))
        partial.rename(args.out)  # the folder appears whole or not at all
    except Exception as e:  # noqa: BLE001 - one line for the caller's record
        shutil.rmtree(partial, ignore_errors=True)
        print(f"optimum_peer: Optimum's ORTQuantizer failed: {type(e).__name__}: "
              f"{str(e).splitlines()[0] if str(e) else ''}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
