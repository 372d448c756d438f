"""Which ``model.path`` is a decoder LLM: one rule for composing the config and for the command line.

In: a path. Out: whether the decoder recipe takes it: a GGUF file, or a folder whose
``config.json`` names a causal LM (``...ForCausalLM``, GPT-2's ``...LMHeadModel``) or, without
architectures, a model type onnxruntime-genai's model builder exports. It reads one small JSON
file and nothing else, so compose can ask it before any stage; which decoders are then compiled,
and why the others are refused, is ``pipeline.models.decoder``'s question. It lives here, below
the models, because the config's defaults (a decoder needs no metric) depend on the answer.
"""
from __future__ import annotations

import json
from pathlib import Path

# The model types of the text decoders onnxruntime-genai 0.18's model builder exports, in the
# order of ``pipeline.models.decoder.ARCHITECTURES`` (one architecture per type).
MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi",
               "phi3", "granite", "olmo", "nemotron", "smollm3", "internlm2", "ernie4_5")
CAUSAL = ("ForCausalLM", "LMHeadModel")  # how transformers names a text generator's class


def is_gguf(path: str | Path) -> bool:
    return str(path).lower().endswith(".gguf")


def folder_config(folder: Path) -> dict:
    """``config.json`` of a folder, or {} when it is missing or not a JSON object."""
    try:
        value = json.loads((folder / "config.json").read_bytes())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def is_decoder(path: str | Path | None) -> bool:
    """A GGUF file, or a folder whose config.json names a causal LM or, without architectures,
    a decoder model type. Whether the builder exports it is ``check_folder``'s question: a
    decoder it does not export is refused, not compiled as an encoder."""
    if not path:
        return False
    path = Path(path)
    if is_gguf(path):
        return True
    cfg = folder_config(path) if path.is_dir() else {}
    archs = cfg.get("architectures") or []
    return (any(isinstance(a, str) and a.endswith(CAUSAL) for a in archs)
            or (not archs and cfg.get("model_type") in MODEL_TYPES))
