"""prepare: the float model as the quantizer wants it (shape inference and its optimizations).

In: an ``optimize`` artifact. Out: ``model.onnx`` from onnxruntime's ``quant_pre_process``: shapes
inferred for every tensor, which the calibrator and quantizer need. Symbolic shape inference fails
on some graphs ("Incomplete symbolic shape inference"); the stage then retries with its
dimensions merged, then without it, and records what it took. Its own stage so that calibration
(expensive) and quantization (cheap, many variants) can both start from the same cached file.
A full disk is one line naming the stage's folder: ``quant_pre_process`` logs a failed
optimization (with its traceback) and goes on, and onnx's shape inference writes an empty file
when its write fails, so the output is checked against the input's graph, and the stage's own
log lines are kept from onnxruntime's logger.
"""
from __future__ import annotations

import contextlib
import errno
import logging
import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.errors import StageError

# quant_pre_process keeps up to four copies of the model in its temporary folder at once (shape
# inferred, optimized, ONNX-shape inferred, its input) besides the output: the room it needs.
COPIES = 5


@dataclass(frozen=True)
class Prepare:
    name = "prepare"
    version = 4  # 4: Gemm biases of shape [1, N] flattened to [N] (the quantizer's per-channel
                 #    bias code fails on them);
                 # 3: symbolic shape inference retried with its dimensions merged (auto_merge);
                 # 2: nothing written outside the stage's folder
    hardware_dependent = False

    def run(self, parent, out_dir: Path) -> dict:
        target = (out_dir / "model.onnx").resolve()
        source = Path(parent.model).resolve()
        # onnxruntime's symbolic shape inference, when it fails, saves its partial model (and an
        # external-data file) in the current directory: run it from a scratch folder of this
        # stage's own, removed afterwards, so that nothing lands where the user started the run.
        with _scratch(out_dir), _logged("onnxruntime.quantization.shape_inference") as failures:
            meta = _inferred(source, target)
        _check_output(Path(parent.model), target, out_dir)
        meta["flattened_gemm_bias"] = _flat_gemm_bias(target)
        if failures:  # onnxruntime's optimization failed and it went on without it
            print(f"  prepare: onnxruntime's optimization step failed ({failures[-1]}); the "
                  "model is shape-inferred without it", flush=True)
        return meta


def _flat_gemm_bias(path: Path) -> list[str]:
    """Gemm nodes whose bias initializer is [1, N] (onnxruntime's MatMulAddFusion keeps the Add's
    2-D constant: Google's magika) get it as [N], the same broadcast: onnxruntime's QDQ quantizer,
    per channel, indexes the bias per output channel and fails on a 2-D one ("The truth value of
    an array with more than one element is ambiguous"). Only the dims change (the bytes of [1, N]
    and [N] are the same), so external data stays where it is. Returns the nodes changed."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    inits = {i.name: i for i in model.graph.initializer}
    declared = {i.name for i in model.graph.input}  # an initializer listed as an input: left
    users: dict[str, int] = {}
    for n in model.graph.node:
        for i in n.input:
            users[i] = users.get(i, 0) + 1
    changed = []
    for n in model.graph.node:
        bias = inits.get(n.input[2]) if n.op_type == "Gemm" and len(n.input) > 2 else None
        if (bias is not None and len(bias.dims) == 2 and bias.dims[0] == 1
                and users.get(bias.name) == 1 and bias.name not in declared):
            width = bias.dims[1]
            del bias.dims[:]
            bias.dims.append(width)
            changed.append(n.name)
    if changed:
        onnx.save(model, str(path))
    return changed


# quant_pre_process's settings, tried in order. Symbolic shape inference stops where two of its
# symbolic dimensions meet that it cannot prove equal ("Incomplete symbolic shape inference": an
# ALBERT encoder whose layers share their weights); merging them (auto_merge) completes it.
# Without it only onnx's own inference runs, which types nothing past a contrib op (Attention,
# FastGelu): the calibrator then skips those tensors, and quantizing a bias after them failed
# ("Unable to get valid quantization scale").
ATTEMPTS = ({"auto_merge": False}, {"auto_merge": True}, {"skip_symbolic_shape": True})


def _inferred(source: Path, target: Path) -> dict:
    from onnxruntime.quantization.shape_inference import quant_pre_process

    first = None
    for options in ATTEMPTS[:-1]:
        try:
            quant_pre_process(str(source), str(target), **options)
        except OSError:  # the machine refused (a full disk): a retry cannot help
            raise
        except Exception as e:  # noqa: BLE001 - the next settings are tried
            first = first or e
            continue
        return {"symbolic_shape_inference": True, "auto_merge": options["auto_merge"],
                **({"symbolic_failure": str(first)[:300]} if first else {})}
    try:
        quant_pre_process(str(source), str(target), **ATTEMPTS[-1])
    except OSError:
        raise
    except Exception as e:  # noqa: BLE001
        raise StageError(f"quant_pre_process failed ({first}); without symbolic shape "
                         f"inference too: {e}") from None
    print(f"  prepare: symbolic shape inference failed ({str(first).splitlines()[0][:120]}); "
          "continued without it", flush=True)
    return {"symbolic_shape_inference": False, "symbolic_failure": str(first)[:300]}


@contextlib.contextmanager
def _scratch(out_dir: Path):
    """The current directory is a fresh folder inside ``out_dir`` while the block runs; what was
    left in it is removed after."""
    scratch = out_dir.resolve() / "scratch"
    scratch.mkdir(exist_ok=True)
    try:
        with contextlib.chdir(scratch):
            yield
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


@contextlib.contextmanager
def _logged(name: str):
    """The last line of each error ``name`` logs, instead of its traceback on stderr."""
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            text = record.getMessage().strip().splitlines()
            if record.levelno >= logging.ERROR and text and "Traceback" not in text[0]:
                lines.append(text[-1][:200])
            elif text and "Traceback" in text[0]:
                lines[-1:] = [text[-1][:200]]  # the cause, in place of "Optimization Failed!"

    logger = logging.getLogger(name)
    handler, propagate = Keep(), logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


def _check_output(source: Path, target: Path, out_dir: Path) -> None:
    """The output has the input's graph inputs and outputs; a file that does not (empty, cut
    short) on a disk without room for the work is a full disk, named by the stage's folder."""
    import onnx

    def io(path):  # weights listed as inputs (older exporters) may be dropped: not compared
        g = onnx.load(str(path), load_external_data=False).graph
        weights = {t.name for t in g.initializer}
        return ([i.name for i in g.input if i.name not in weights], [o.name for o in g.output],
                len(g.node))

    try:
        got = io(target)
    except Exception:  # noqa: BLE001 - a file cut short does not parse: judged below
        got = None
    want = io(source)
    if got is not None and got[:2] == want[:2] and got[2] > 0:
        return
    block = os.statvfs(out_dir).f_bsize
    need = COPIES * math.ceil(source.stat().st_size / block) * block
    free = shutil.disk_usage(out_dir).free
    if free < need:
        raise OSError(errno.ENOSPC, f"No space left on device: quant_pre_process wrote an "
                                    f"incomplete model with {free} bytes free, where it needs "
                                    f"about {need}", str(out_dir))
    raise StageError(f"quant_pre_process wrote a model without the graph's inputs and outputs "
                     f"({target.name}: {got[:2] if got else 'not ONNX'}, expected {want[:2]})")
