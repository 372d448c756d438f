"""onnxruntime-genai's model builder on a checkpoint it never loads whole: the graph of a decoder
larger than memory, its MatMul weights left in the checkpoint.

In: a ``Decoder`` (a Hugging Face folder of safetensors) and an output folder. Out: the folder
the builder writes at ``fp32`` (``model.onnx``, ``genai_config.json``, the tokenizer files), in
which every tensor except the MatMul weights is written to ``model.onnx.data`` (embedding,
norms, biases: small next to the MatMuls), and each MatMul weight is a placeholder: its name,
FP32 dtype and ``[in, out]`` shape in the graph, its ``external_data`` pointing at
``CHECKPOINT_MAP``, a file that names the checkpoint tensors it is made of (rows concatenated,
then transposed, as the builder packs Q, K and V). ``pipeline.quant.stream_nbits`` reads them
from the checkpoint one at a time (``pipeline.models.checkpoint_tensors``) and writes
MatMulNBits. The folder is not a model a session can open; it is what every candidate is built
from.

How: the builder's own code, with three of its methods wrapped while it runs (in the stage's
child process): ``load_weights`` builds the transformers model on the meta device (no memory)
and reads every tensor that is not a Linear weight from the checkpoint (that is all the builder
reads values of); ``make_matmul_float`` and ``make_packed_matmul_float_class`` record which
checkpoint tensors each MatMul weight comes from; ``save_model`` leaves those out of the data
file. What this does not handle: a MatMul weight the builder derives from the checkpoint by
anything other than packing rows (refused in one line, naming it), and GGUF files.
"""
from __future__ import annotations

import contextlib
import json
from pathlib import Path

from pipeline.core.errors import StageError
from pipeline.quant.stream_nbits import CHECKPOINT_MAP


@contextlib.contextmanager
def _wrapped(cls, **methods):
    """``cls``'s methods replaced for the duration (each receives the original first)."""
    old = {name: getattr(cls, name) for name in methods}
    for name, wrap in methods.items():
        setattr(cls, name, lambda self, *a, _w=wrap, _o=old[name], **k: _w(_o, self, *a, **k))
    try:
        yield
    finally:
        for name, fn in old.items():
            setattr(cls, name, fn)


def export_graph(decoder, out_dir: Path) -> dict:
    """The builder's graph in ``out_dir`` with placeholders for the MatMul weights; returns the
    map written to ``CHECKPOINT_MAP`` (placeholder -> checkpoint tensor names)."""
    import numpy as np
    import onnx
    import onnx_ir as ir
    import torch
    from onnxruntime_genai.models import builder  # noqa: F401 - puts its own folder on sys.path
    # the builder imports its classes by that folder's names (``builders.base``), a module of
    # its own beside ``onnxruntime_genai.models.builders.base``: its Model is the one to wrap
    from builders.base import Model

    from pipeline.models.checkpoint_tensors import CheckpointTensors
    from pipeline.models.hf_folder import offline
    from pipeline.stages.decoder_export import build_fp32

    offline()
    ck = CheckpointTensors(decoder.folder)
    linear: dict[int, str] = {}   # id(meta Linear weight) -> its checkpoint name
    sources: dict[str, list[str]] = {}  # MatMul weight initializer -> checkpoint names

    def load_weights(orig, self, input_path):
        from transformers import AutoConfig, AutoModelForCausalLM

        config = AutoConfig.from_pretrained(decoder.folder)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        names: dict[int, list[str]] = {}  # tied weights: one object, several names
        for name, p in model.named_parameters(remove_duplicate=False):
            names.setdefault(id(p), []).append(name)
        owners = {id(p): (m, n) for _, m in model.named_modules()
                  for n, p in m.named_parameters(recurse=False)}
        for pid, ns in names.items():
            stored = [n for n in ns if n in ck]
            if not stored:
                raise StageError(f"the checkpoint in {decoder.folder} has no tensor "
                                 f"{' or '.join(ns)}")
            module, attr = owners[pid]
            if isinstance(module, torch.nn.Linear) and attr == "weight":
                linear[pid] = stored[0]  # left on the meta device: read when quantized
            else:
                value = torch.from_numpy(np.ascontiguousarray(ck.read(stored[0])))
                for _, m in model.named_modules():  # every module sharing it gets the value
                    for n, p in list(m.named_parameters(recurse=False)):
                        if id(p) == pid:
                            m._parameters[n] = torch.nn.Parameter(value, requires_grad=False)
        return model

    def keys_of(matmul) -> list[str]:
        keys = getattr(matmul, "checkpoint_keys", None) or [linear.get(id(matmul.weight))]
        if None in keys:
            raise StageError("the streaming export cannot tell which checkpoint tensor a MatMul "
                             "weight of the builder comes from (it derives it by more than "
                             "packing rows)")
        return keys

    def make_packed_matmul_float_class(orig, self, q, k, v, **kw):
        packed = orig(self, q, k, v, **kw)  # torch.cat on the meta device: shapes only
        packed.checkpoint_keys = [x for m in (q, k, v) for x in keys_of(m)]
        return packed

    def make_matmul_float(orig, self, matmul, name, root_input, **kw):
        sources[name[1:].replace("/", ".") + ".weight"] = keys_of(matmul)  # the builder's name
        return orig(self, matmul, name, root_input, **kw)

    def save_model(orig, self, out):
        model = self.model
        model.graph.sort()
        held = {n: model.graph.initializers.pop(n) for n in sources}  # never materialized
        path = Path(out) / self.filename
        ir.save(model, str(path), external_data=path.name + ".data", size_threshold_bytes=0)
        proto = onnx.load(str(path), load_external_data=False)
        for name, value in held.items():
            t = onnx.TensorProto(name=name, data_type=int(value.dtype),
                                 dims=[int(d) for d in value.shape])
            t.data_location = onnx.TensorProto.EXTERNAL
            for key, val in (("location", CHECKPOINT_MAP), ("offset", "0"), ("length", "0")):
                entry = t.external_data.add()
                entry.key, entry.value = key, val
            proto.graph.initializer.append(t)
        onnx.save(proto, str(path))

    with _wrapped(Model, load_weights=load_weights, make_matmul_float=make_matmul_float,
                  make_packed_matmul_float_class=make_packed_matmul_float_class,
                  save_model=save_model):
        build_fp32(decoder, out_dir)
    if not linear:  # the architecture's builder loads its weights its own way: held whole
        raise StageError(f"the streaming export does not handle {decoder.architecture}: its "
                         "builder loads the checkpoint by its own code")
    mapping = {"checkpoint": str(Path(decoder.folder).resolve()), "digest": decoder.digest,
               "layout": "rows of the named tensors concatenated, then transposed to [in, out]",
               "weights": sources}
    (out_dir / CHECKPOINT_MAP).write_text(json.dumps(mapping, indent=1))
    return mapping
