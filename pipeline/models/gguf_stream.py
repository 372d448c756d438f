"""A GGUF file converted into a Hugging Face folder one tensor at a time, never whole in memory.

In: a ``.gguf`` file (llama.cpp's format: its tensors quantized or float, its config and
tokenizer in its metadata). Out: a folder ``save_pretrained`` could have written: ``config.json``
(no ``quantization_config``: the weights are plain floats now), the tokenizer files, and the
weights in safetensors shards of at most ``SHARD_BYTES`` with ``model.safetensors.index.json``
naming them. Each tensor is dequantized by the ``gguf`` package, renamed and re-laid out by
transformers' own GGUF tables (``get_gguf_hf_weights_map`` and the architecture's tensor
processor, which undoes llama.cpp's Q/K row permutation), exactly as ``from_pretrained(...,
gguf_file=...)`` does for the whole file; values are FP32 (F16 tensors stay F16).

Why not ``from_pretrained``: it dequantizes every tensor into one state dict and builds the FP32
model around it (28 GB for a 7 B model, whatever the file's own size). Here the peak is one shard
being filled plus one tensor; each tensor's bytes are read with a seek, not through the reader's
memory map (mapped pages count as resident while the map is open). The config and tokenizer
still come from transformers' GGUF reader, which reads the metadata only.
"""
from __future__ import annotations

import json
from pathlib import Path

SHARD_BYTES = 256 << 20  # a shard is written once it holds this much: the converter's peak


def convert(gguf_path: str, folder_with_link: str, name: str, out: str) -> None:
    """``folder_with_link/name`` (a link to ``gguf_path``) into the folder ``out``."""
    import numpy as np
    import torch
    from gguf import GGUFReader, dequantize
    from safetensors.numpy import save_file
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import (TENSOR_PROCESSORS, TensorProcessor,
                                                          get_gguf_hf_weights_map,
                                                          load_gguf_checkpoint)

    out = Path(out)
    src = str(Path(folder_with_link) / name)
    tok = AutoTokenizer.from_pretrained(folder_with_link, gguf_file=name)
    config = AutoConfig.from_pretrained(folder_with_link, gguf_file=name)
    with torch.device("meta"):  # names and shapes only, for transformers' name map
        skeleton = AutoModelForCausalLM.from_config(config)
    config.architectures = [type(skeleton).__name__]
    if hasattr(config, "quantization_config"):  # the weights are plain floats from here on
        del config.quantization_config
    parsed = load_gguf_checkpoint(src, return_tensors=False)  # metadata only
    reader = GGUFReader(gguf_path)
    arch = str(reader.fields["general.architecture"].contents())
    processor = TENSOR_PROCESSORS.get(arch, TensorProcessor)(config=parsed["config"])
    mapping = get_gguf_hf_weights_map(skeleton, processor)
    del skeleton

    index: dict[str, str] = {}
    shard: dict[str, np.ndarray] = {}
    files: list[str] = []
    total = 0

    def flush() -> None:
        nonlocal total
        if shard:
            total += sum(a.nbytes for a in shard.values())
            files.append(f"model-{len(files) + 1:05d}.safetensors")
            save_file(shard, str(out / files[-1]), metadata={"format": "pt"})
            index.update({k: files[-1] for k in shard})
            shard.clear()

    extra = {"config": parsed["config"], "tensors": {}}  # where some processors put tensors
    with open(gguf_path, "rb") as fh:
        for t in reader.tensors:
            fh.seek(int(t.data_offset))
            raw = np.fromfile(fh, dtype=t.data.dtype, count=t.data.size).reshape(t.data.shape)
            values = dequantize(raw, t.tensor_type)
            del raw
            result = processor.process(weights=values, name=t.name, tensor_key_mapping=mapping,
                                       parsed_parameters=extra)
            if result.name not in mapping:
                continue
            w = np.ascontiguousarray(result.weights)
            if w.dtype not in (np.float32, np.float16):
                w = w.astype(np.float32)
            shard[mapping[result.name]] = w
            if sum(a.nbytes for a in shard.values()) >= SHARD_BYTES:
                flush()
    for k, v in extra["tensors"].items():  # a processor's own tensors (an MoE's experts)
        shard[k] = np.ascontiguousarray(v.numpy() if hasattr(v, "numpy") else v)
    flush()
    (out / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": index}, indent=1))
    config.save_pretrained(out)
    tok.save_pretrained(out)
