"""fp16: the FP16 baseline (and ``quant=fp16`` candidate), safe to load on the target.

In: an ``optimize`` artifact. Out: ``model.onnx`` with weights and ops in FP16 except the op types
kept in FP32; inputs and outputs stay FP32 so callers see no change. onnxruntime's
``float16.convert_float_to_float16`` does the conversion.

Which op types stay FP32 is found, not assumed: each op type is converted on its own and the
result loaded and run in a child process. ONNX Runtime's CPU provider segfaults while creating a
session for some FP16 graphs (seen here with an LSTM, and with the Transpose before it); those op
types stay FP32 and the report names them. Ops in ``quant.fp16_keep_float32`` are never tried.

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


@dataclass(frozen=True)
class ToFp16:
    keep_float32: tuple[str, ...]
    data: object           # DataSplit: the samples parity is checked on
    hardware: object
    name = "fp16"
    version = 3  # 3: the FP32 model stands in where control flow defeats the converter
    hardware_dependent = True  # which kernels exist (and crash) depends on the target

    def run(self, parent, out_dir: Path) -> dict:
        from pipeline.runtimes import onnxruntime as ort
        from pipeline.models import task

        t = task(self.data.task)
        example = t.example(2)
        all_ops = set(node_counts(parent.model))
        kept = {op: "configured" for op in self.keep_float32 if op in all_ops}
        probe = out_dir / "probe.onnx"
        for op in sorted(all_ops - set(kept)):
            _convert(parent.model, probe, [o for o in all_ops if o != op])
            try:
                isolate.call(f"fp16 probe {op}", _load_and_run, probe, example, self.hardware)
            except StageError as e:
                kept[op] = str(e).split(": ", 1)[-1]
        probe.unlink(missing_ok=True)
        target = out_dir / "model.onnx"
        stand_in = None
        try:
            _convert(parent.model, target, list(kept))
            # The combination can still fail where each op alone did not: check it, isolated.
            isolate.call("fp16 model", _load_and_run, target, example, self.hardware)
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
