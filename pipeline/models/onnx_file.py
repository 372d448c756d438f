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

from pathlib import Path

from pipeline.errors import ConfigError
from pipeline.models.contract import AXIS_MEANINGS, InputSpec, OutputSpec
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


class OnnxTask(UserTask):
    def __init__(self, key):
        super().__init__(key)
        model = read(key.path)
        external_data_inside(model, key.path)
        self.onnx_source, self.onnx_sha256 = key.path, key.sha256
        self.model_proto = model
        weights = {i.name for i in model.graph.initializer}
        self.inputs = tuple(InputSpec(i.name, DTYPES.get(i.type.tensor_type.elem_type, "float32"),
                                      _shape(i)) for i in model.graph.input if i.name not in weights)
        self.outputs = tuple(OutputSpec(o.name, DTYPES.get(o.type.tensor_type.elem_type, "float32"),
                                        _shape(o)) for o in model.graph.output)
        self._finish()

    # Nothing to prune: the network exists only as a graph.
    pruning = None
    no_pruning = ("model=onnx has no network to prune (only an ONNX graph); prune a model=torch "
                  "source, or run with prune=none")

    def __repr__(self) -> str:
        return f"OnnxTask({self.key.path!r})"

    def charset_from_model(self):
        from pipeline.metrics.ctc import charset_from_onnx

        return charset_from_onnx(self.model_proto)
