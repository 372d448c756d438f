"""fp16: the FP16 baseline (and ``quant=fp16`` candidate), safe to load on the target.

In: an ``optimize`` artifact. Out: ``model.onnx`` with weights and ops in FP16 except the op types
kept in FP32; inputs and outputs stay FP32 so callers see no change. onnxruntime's
``float16.convert_float_to_float16`` does the conversion.

Which op types stay FP32 is found, not assumed: a converted graph is loaded and run in a child
process. ONNX Runtime's CPU provider segfaults while creating a session for some FP16 graphs (seen
here with an LSTM, and with the Transpose before it); those op types stay FP32 and the report
names them. Ops in ``quant.fp16_keep_float32`` are never tried. The whole graph is tried first,
which is the answer for most models: one conversion, where trying each op type on its own cost
one per op type (all-mpnet-base-v2's 34 op types: the stage took 169 s that way and takes 15 s
now, on a 2-core Zen 4 EPYC). Only when it fails is the culprit searched for, by halving the list
of op types converted (``_culprits``), and the graph tried again without it. Trying the op types
one at a time also misjudged graphs whose ops only convert together: in a fused transformer an
Add, a MatMul or a LayerNormalization alone in FP16 between FP32 neighbours failed the type
check, so all-mpnet-base-v2's "FP16" baseline kept seven op types, nearly all its arithmetic, in
FP32; the whole graph, cast at its edges only, loads and runs.

A graph with control flow (``If``, ``Loop``, ``Scan``: silero-vad's whole network sits in the
branches of an ``If`` on the sample rate) defeats the converter: it converts the branches' tensors
whatever op types are blocked, and the model no longer loads ("Graph attribute inferencing
failed"). There, and only there, the FP32 model stands in as the baseline (``stand_in`` says
why): the run goes on, judged against the float model itself, and says so; ``quant=fp16`` has
nothing to ship and is refused.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from pipeline.core import isolate
from pipeline.core.errors import StageError
from pipeline.stages._parity import compare, node_counts


def _convert(src: Path, dst: Path, block: list[str]) -> None:
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = convert_float_to_float16(onnx.load(str(src)), keep_io_types=True,
                                     op_block_list=sorted(block))
    onnx.save(model, str(dst))


def _load_and_run(model: Path, example, hardware) -> None:
    from pipeline.runtimes import onnxruntime as ort

    ort.run(ort.session(model, hardware, probe=True), example)  # a refusal is the answer


def _fails(model: Path, example, hardware) -> str | None:
    """Why ``model`` does not load and run on the target (in a child: it may crash), or None."""
    try:
        isolate.call("fp16 probe", _load_and_run, model, example, hardware)
    except StageError as e:
        return str(e).split(": ", 1)[-1]
    return None


def _culprits(model: Path, probe: Path, all_ops: set, kept: dict, failure: str, fails) -> dict:
    """The op types to keep in FP32 besides ``kept`` (op type: why), given that converting every
    other one fails with ``failure``. ``fails(path)``: why the graph at ``path`` fails, or None.

    Bisection over the sorted op types: the shortest prefix whose conversion fails ends with a
    culprit (the prefix before it passed); keep it in FP32, and try the rest again, until the rest
    passes. A failure that needs several op types together is found the same way, one op type at
    a time; whatever is found, the graph returned passed its last try. One culprit among n op
    types costs about log2(n) + 2 tries (6 for the OCR network's 15, whose Transpose crashes
    before an LSTM; one try per op type was 15)."""
    def tries(converted: list) -> str | None:
        _convert(model, probe, sorted(all_ops - set(converted)))
        return fails(probe)

    found: dict[str, str] = {}
    rest = sorted(all_ops - set(kept))
    none = tries([])
    if none:  # nothing is to blame: the converter itself breaks the graph (control flow)
        raise StageError(f"the graph fails with every op type kept in FP32: {none}")
    while failure:
        passes, fails_at = 0, len(rest)  # prefix lengths: rest[:passes] runs, rest[:fails_at] not
        while fails_at - passes > 1:
            mid = (passes + fails_at) // 2
            why = tries(rest[:mid])
            if why:
                fails_at, failure = mid, why
            else:
                passes = mid
        found[rest.pop(fails_at - 1)] = failure
        failure = tries(rest)
    return found


@dataclass(frozen=True)
class ToFp16:
    keep_float32: tuple[str, ...]
    data: object           # DataSplit: the samples parity is checked on
    hardware: object
    name = "fp16"
    version = 4  # 3: the FP32 model stands in where control flow defeats the converter;
    # 4: the whole graph is tried first, culprits found by bisection
    hardware_dependent = True  # which kernels exist (and crash) depends on the target

    def run(self, parent, out_dir: Path) -> dict:
        from pipeline.runtimes import onnxruntime as ort
        from pipeline.models import task

        t = task(self.data.task)
        example = t.example(2)
        all_ops = set(node_counts(parent.model))
        kept = {op: "configured" for op in self.keep_float32 if op in all_ops}
        target = out_dir / "model.onnx"
        stand_in = None
        try:
            _convert(parent.model, target, list(kept))
            failure = _fails(target, example, self.hardware)
            if failure:  # some op type does not run in FP16 here: find it, convert without it
                kept.update(_culprits(parent.model, out_dir / "probe.onnx", all_ops, kept,
                                      failure, lambda m: _fails(m, example, self.hardware)))
                _convert(parent.model, target, list(kept))  # the graph the last probe passed
        except Exception as e:  # noqa: BLE001 - a graph without control flow re-raises it
            flow = _control_flow(parent.model)
            if not flow:
                raise
            why = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
            stand_in = (f"no FP16 copy could be built ({why}): onnxruntime's converter cannot "
                        f"convert a graph with {', '.join(flow)} subgraphs; the FP32 model "
                        "stands in as the baseline")
            target.unlink(missing_ok=True)
            for f in Path(parent.model).parent.iterdir():  # the model and its external data
                if f.is_file() and f.name != "artifact.json":
                    shutil.copyfile(f, out_dir / f.name)
        finally:
            (out_dir / "probe.onnx").unlink(missing_ok=True)

        ds = t.dataset(self.data)
        ref, cand = ort.session(parent.model, self.hardware), ort.session(target, self.hardware)
        parity = compare(lambda x: ort.run(ref, x), lambda x: ort.run(cand, x), t, ds)
        return {"kept_float32": kept, "nodes": node_counts(target), "parity_vs_fp32": parity,
                "stand_in": stand_in}


def stand_in(art) -> str | None:
    """Why the FP32 model stands in for this fp16 artifact's FP16 copy (None: it is one)."""
    return art.meta.get("stand_in")


def _control_flow(model: Path) -> list[str]:
    """The op types of the graph's nodes that hold subgraphs (If, Loop, Scan)."""
    import onnx

    graph = onnx.load(str(model), load_external_data=False).graph
    return sorted({n.op_type for n in graph.node
                   if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                          for a in n.attribute)})
