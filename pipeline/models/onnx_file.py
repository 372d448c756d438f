"""``model=onnx``: a model that exists only as an ONNX file someone else exported.

In: a ``Source`` of kind ``onnx`` (the file, its sha256, the data and metric configs). Out: a
``Task`` whose inputs, outputs and dynamic axes are read from the graph (a named dynamic axis keeps
its name when it is one of the known meanings or has one as a word, ``image_width`` a width; any
other dynamic axis but the first is ``dynamic``), and which has no network to load, export or
prune. The checks that end a run before any stage, one line each: a file that is not ONNX,
external data outside the model's folder, a metric that does not fit the outputs, labels the
metric needs and the data lacks.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from pipeline.core.errors import ConfigError
from pipeline.task.contract import AXIS_MEANINGS, InputSpec, OutputSpec
from pipeline.models.user_task import UserTask

DTYPES = {1: "float32", 7: "int64", 6: "int32", 10: "float16", 11: "float64", 9: "bool",
          2: "uint8", 3: "int8"}


def read(path: str | Path):
    """The graph without its weights; one line when the file is not ONNX."""
    import onnx
    from google.protobuf.message import DecodeError

    try:
        model = onnx.load(str(path), load_external_data=False)
    except (DecodeError, ValueError, RuntimeError, OSError) as e:
        raise ConfigError(f"model.path={path}: not an ONNX model ({type(e).__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else 'cannot parse'})") from None
    if not model.graph.node or not model.graph.input:
        raise ConfigError(f"model.path={path}: not an ONNX model (no graph)")
    return model


def external_data_inside(model, path: str | Path) -> None:
    """External tensors may only come from the model's own folder (``pipeline.models.files``)."""
    from pipeline.models.files import external_files

    external_files(model, path)


# Ops that only a quantized graph holds: its authors (or a quantizer) already chose the scales.
QUANTIZED_OPS = ("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "ConvInteger",
                 "MatMulInteger", "DynamicQuantizeLSTM", "DynamicQuantizeMatMul",
                 "MatMulIntegerToFloat", "QAttention", "QGemm", "QOrderedMatMul")


def quantized_ops(graph) -> list[str]:
    """The quantized op types ``graph`` holds (subgraphs included), in order of first use."""
    found: dict[str, None] = {}
    for node in graph.node:
        if node.op_type in QUANTIZED_OPS or node.op_type.startswith("QLinear"):
            found[node.op_type] = None
        for a in node.attribute:
            for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                found.update(dict.fromkeys(quantized_ops(g)))
    return list(found)


def redeclared(model, fixed_batch=(), outputs=None):
    """``model`` with the batch axis of the inputs in ``fixed_batch`` dynamic, and the outputs
    declared as ``outputs`` (``OutputSpec``) say, or undeclared (shape unknown) when None."""
    from onnx import helper

    for i in model.graph.input:
        if i.name in fixed_batch:
            i.type.tensor_type.shape.dim[0].dim_param = "batch"  # replaces the fixed value
    specs = {o.name: o for o in outputs or ()}
    for o in model.graph.output:
        elem = o.type.tensor_type.elem_type
        if outputs is None:
            o.type.tensor_type.ClearField("shape")
        elif o.name in specs:
            dims = [d if isinstance(d, int) else f"{d}_{k}" if d != "batch" else d
                    for k, d in enumerate(specs[o.name].shape)]
            o.type.CopyFrom(helper.make_tensor_type_proto(elem, dims))
    return model


def probe(path: str, one: dict, two: dict, fixed_batch: tuple) -> dict:
    """In a child: the shapes the outputs really have on the feeds ``one`` (batch 1) and ``two``
    (batch 2), the latter on the graph with its fixed batch axes made dynamic; ``two`` is None
    (and ``why`` says why) when the graph fails at batch 2."""
    import onnx
    import onnxruntime as ort

    opts = ort.SessionOptions()
    # outputs that differ from their declaration warn on every call, and a graph that fails at
    # batch 2 logs its error: the answer says why, in one line (fatal only on the console)
    opts.log_severity_level = 4
    model = onnx.load(path)  # external data from the model's folder (checked before)
    redeclared(model, fixed_batch)
    session = ort.InferenceSession(model.SerializeToString(), opts,
                                   providers=["CPUExecutionProvider"])
    out = {"one": [list(a.shape) for a in session.run(None, one)], "two": None, "why": ""}
    try:
        out["two"] = [list(a.shape) for a in session.run(None, two)]
    except Exception as e:  # noqa: BLE001 - the runtime's errors are long: its first line
        out["why"] = f"{type(e).__name__}: {runtime_line(e)}"
    return out


def runtime_line(e: Exception, limit: int = 300) -> str:
    """onnxruntime's error in one line, without what names its own source: "[ONNXRuntimeError]
    : 1 : FAIL : Non-zero status code returned while running Reshape node. Name:'...' Status
    Message: /onnxruntime_src/.../reshape_helper.h:91 onnxruntime::ReshapeHelper::...(...)
    input_shape_size == requested_shape_size was false. The input tensor cannot be reshaped ..."
    keeps the node and the sentence that says what went wrong."""
    lines = str(e).strip().splitlines()
    line = re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", lines[0] if lines else "")
    line = re.sub(r"\S*onnxruntime_src\S*:\d+ (\S+\(.*?\) )?(.*? was false\. )?", "", line)
    return line[:limit]


def _shape(value_info) -> tuple:
    dims = []
    for k, d in enumerate(value_info.type.tensor_type.shape.dim):
        if d.HasField("dim_value") and d.dim_value > 0:
            dims.append(int(d.dim_value))
        elif k == 0:
            dims.append("batch")
        else:
            # a meaning, or one as a word of the name ("image_width" is a width)
            words = d.dim_param.lower().replace("-", "_").split("_") if d.HasField("dim_param") \
                else []
            known = [w for w in words if w in AXIS_MEANINGS and w != "batch"]
            dims.append(known[-1] if known else "dynamic")
    return tuple(dims)


def _batched_on_the_first_axis(model, weights: set, path) -> None:
    """Every input is batched along its first axis (the pipeline stacks samples there). A scalar
    (silero-vad's sample rate, one value for the whole call) or an input whose first axis is a
    fixed size above 1 (its recurrent state [2, batch, 128]) cannot be: one line naming the
    input and what would make it one, before any stage (they had ended in a traceback, or a
    line about the task contract)."""
    for i in model.graph.input:
        if i.name in weights or not i.type.HasField("tensor_type"):
            continue
        dims = [d.dim_value if d.HasField("dim_value") else d.dim_param or "?"
                for d in i.type.tensor_type.shape.dim]
        if i.type.tensor_type.HasField("shape") and not dims:
            raise ConfigError(f"model.path={path}: input {i.name} is a scalar (shape []), one "
                              "value for the whole call; the pipeline batches every input along "
                              "its first axis: fold it into the graph as a constant (an "
                              f"initializer named {i.name}, removed from the inputs) or give it "
                              "a batch axis")
        if dims and isinstance(dims[0], int) and dims[0] > 1:
            raise ConfigError(f"model.path={path}: input {i.name} has shape {dims}, a fixed "
                              f"first axis of {dims[0]}; the pipeline batches every input along "
                              "its first axis: export the model with its batch first (a state "
                              "batched on another axis: a Transpose at the graph's input)")


class OnnxTask(UserTask):
    def __init__(self, key):
        super().__init__(key)
        model = read(key.path)
        external_data_inside(model, key.path)
        self.onnx_source, self.onnx_sha256 = key.path, key.sha256
        self.model_proto = model
        self.quantized_ops = quantized_ops(model.graph)  # quant=int8 cannot re-quantize these
        weights = {i.name for i in model.graph.initializer}
        declared = [(i.name, DTYPES.get(i.type.tensor_type.elem_type, "float32"), _shape(i))
                    for i in model.graph.input if i.name not in weights]
        _batched_on_the_first_axis(model, weights, key.path)
        # A batch axis fixed at 1 (exporters often write one): the probe below checks the graph
        # runs at batch 2, and the import stage then declares the axis dynamic.
        self.fixed_batch = tuple(n for n, _, shape in declared if shape[:1] == (1,))
        self.inputs = tuple(InputSpec(n, dtype, ("batch", *shape[1:]) if n in self.fixed_batch
                                      else shape) for n, dtype, shape in declared)
        self.outputs = tuple(OutputSpec(o.name, DTYPES.get(o.type.tensor_type.elem_type, "float32"),
                                        _shape(o)) for o in model.graph.output)
        self.learned_outputs = False  # True: output shapes come from running the graph
        self._finish()

    def _learn_outputs(self) -> None:
        """When the declarations are suspect (a fixed batch, an output whose first axis is not a
        dynamic batch, a CTC output not of rank 3), run the graph on the first real sample at
        batch 1 and 2 (in a child, as every session) and trust what it returns: the batch axis
        is the one that follows the batch fed, the last axis keeps its size (the classes)."""
        from pipeline.config.metrics import MetricName

        ctc = self.metric_cfg.name == MetricName.ctc
        if not (self.fixed_batch or any(o.shape[:1] != ("batch",) for o in self.outputs)
                or (ctc and len(self.outputs[0].shape) != 3)):
            return
        seen = self._probe(self.example(1), self.example(2))
        path = self.key.path
        if seen["two"] is None:
            if self.fixed_batch:
                self._batch_of_one(seen, f"the graph fails at batch 2 ({seen['why']})")
            seen["two"] = [None] * len(seen["one"])
        elif self.fixed_batch:  # it ran at batch 2: an output that grew followed the batch
            # (one that did not grow holds no sample: anchors, a constant, batch-independent)
            mixed = next(((o.name, one, two) for o, one, two in
                          zip(self.outputs, seen["one"], seen["two"])
                          if two != one and not any(len(two) == len(one) and one[a] == 1
                                                    and two[a] == 2 for a in range(len(one)))),
                         None)
            if mixed:  # a Reshape to a constant [1, -1] folds both samples into one row
                name, one, two = mixed
                self._batch_of_one(seen, f"at batch 2 the graph mixes the samples: output {name}"
                                         f" is {one} at batch 1 and {two} at batch 2, no axis "
                                         "following the batch")
                seen["two"] = [None] * len(seen["one"])
        outputs = []
        for o, one, two in zip(self.outputs, seen["one"], seen["two"]):
            axes = [a for a in range(len(one)) if two is not None and one[a] == 1
                    and len(two) == len(one) and two[a] == 2]
            if self.max_batch == 1:  # only batch 1 ran: the batch is the leading axis of 1
                axes = [0]
            if len(axes) != 1:  # no axis follows the batch, or several: the declaration stays
                outputs.append(o)
                continue
            b, rank_kept = axes[0], len(o.shape) == len(one)
            # batch 1 alone says nothing of which sizes vary: a size declared and seen is kept
            kept = rank_kept and self.max_batch == 1
            shape = tuple("batch" if a == b else int(one[a]) if a == len(one) - 1 else
                          o.shape[a] if rank_kept and isinstance(o.shape[a], str) and a else
                          int(one[a]) if kept and o.shape[a] == one[a] else
                          ("time" if ctc else "dynamic") for a in range(len(one)))
            layout = ""
            if ctc and o is self.outputs[0] and len(one) == 3:
                if (b == 1) != self.time_major:
                    layout = (f"; read as [{'time, batch' if b == 1 else 'batch, time'}, classes]"
                              " whatever metric.time_major says")
                self.time_major = b == 1
            # a graph of batch 1 only declares its outputs' batch as 1: true, nothing to say
            same = shape == o.shape or (self.max_batch == 1 and o.shape[:1] == (1,)
                                        and shape[1:] == o.shape[1:])
            if not same or layout:
                self.warnings.append(f"model.path={path}: output {o.name} is declared "
                                     f"{list(o.shape)} but the graph returns {one} at batch 1 "
                                     f"and {two} at batch 2: the pipeline trusts the graph "
                                     f"({list(shape)}){layout}")
                self.learned_outputs |= not same
            outputs.append(OutputSpec(o.name, o.dtype, shape))
        self.outputs = tuple(outputs)
        if self.fixed_batch and self.max_batch is None:
            self.warnings.append(f"model.path={path}: input(s) {', '.join(self.fixed_batch)} "
                                 "declare a fixed batch of 1; the graph runs at batch 2, so the "
                                 "imported model declares the batch axis dynamic")

    def _batch_of_one(self, seen: dict, why: str) -> None:
        """The graph declares batch 1 and cannot run batch 2 (``why``): a Reshape to a constant
        [1, ...] baked in by a static export fails there, or folds the two samples into one row
        without an error (YOLO heads, text detectors: outputs [1, 2 x anchors, ...]). The run
        feeds it one sample per model run (``max_batch``; ``pipeline.task.batch_limit`` sets the
        run's batch sizes to 1), and the imported model keeps its batch fixed. Each output must
        then hold the sample along a leading axis of 1, which is how its outputs are read; one
        line otherwise."""
        path = self.key.path
        for o, one in zip(self.outputs, seen["one"]):
            if not one or one[0] != 1:
                raise ConfigError(f"model.path={path}: input {self.fixed_batch[0]} declares a "
                                  f"fixed batch of 1 and {why}, so it runs one sample at a time;"
                                  f" but output {o.name} is {one} at batch 1, with no leading "
                                  "batch axis of 1 to read a sample's outputs from: export it "
                                  "with a batch axis first (a dynamic one, or 1)")
        self.max_batch = 1
        self.warnings.append(f"model.path={path}: input(s) {', '.join(self.fixed_batch)} declare "
                             f"a fixed batch of 1 and {why}: one sample per model run wherever "
                             "the run evaluates, calibrates, times or serves it (the batch sizes "
                             "it uses are set to 1)")

    def _probe(self, one: dict, two: dict) -> dict:
        """``probe`` run once per model file, sample and runtime, not in every stage's child
        (each rebuilds the task: a second or two each): its answer is kept under data_dir,
        keyed by the file's digest, the feeds and onnxruntime's version."""
        import hashlib
        import json
        import os

        import onnxruntime

        h = hashlib.sha256(json.dumps([self.key.sha256, list(self.fixed_batch),
                                       onnxruntime.__version__]).encode())
        for feeds in (one, two):
            for name in sorted(feeds):
                a = np.ascontiguousarray(feeds[name])
                h.update(f"{name}:{a.dtype}:{a.shape}".encode())
                h.update(a.tobytes())
        kept = Path(self.key.data_dir) / "onnx-probes" / f"{h.hexdigest()}.json"
        n = len(self.outputs)
        try:
            seen = json.loads(kept.read_text())
            if (len(seen["one"]) == n and (seen["two"] is None or len(seen["two"]) == n)
                    and isinstance(seen["why"], str)):
                return seen
        except (OSError, ValueError, KeyError, TypeError):
            pass  # none kept yet, or unreadable: run the graph
        from pipeline.core import isolate

        seen = isolate.call(f"{self.what}: running the graph on a real sample", probe,
                            self.key.path, one, two, self.fixed_batch)
        tmp = kept.with_name(f".{kept.name}.{os.getpid()}")
        try:
            kept.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(seen))
            os.replace(tmp, kept)  # whole or not at all: a concurrent run reads either
        except OSError:  # a read-only or full data_dir: the next stage runs the graph again
            tmp.unlink(missing_ok=True)
        return seen

    # Nothing to prune: the network exists only as a graph.
    no_pruning = ("model=onnx has no network to prune (only an ONNX graph); prune a model=torch "
                  "source, or run with prune=none")

    def __repr__(self) -> str:
        return f"OnnxTask({self.key.path!r})"

    def charset_from_model(self, classes: int | None = None):
        from pipeline.metrics.ctc import charset_from_onnx

        return charset_from_onnx(self.model_proto, classes)
