"""The ``model=`` group's schema (``conf/model/``): which model is compiled and from where.

In: nothing (typed config). Out: ``ModelConfig`` (a built-in task or the user's own model: an ONNX
file, a torch factory or a Hugging Face folder; sample counts), ``LlmConfig`` (a decoder LLM's
shape, for the bill only), ``SOURCES`` and ``decoder_path``, the one rule that says whether
``model.path`` names a decoder LLM. Values are checked when the config is made (exit 2).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Dict, List, Optional

from pipeline.config.checks import positive
from pipeline.core.errors import ConfigError


class ModelKind(str, Enum):
    task = "task"    # a network the pipeline compiles: a module in pipeline.models.TASKS
    llm = "llm"      # a decoder-only LLM described by its shape, for the bill only


@dataclass
class LlmConfig:
    """The shape of a decoder-only transformer: all the bill needs, no weights."""
    params_b: float = 7.0                   # parameters, in billions (the model card's count)
    layers: int = 32                        # transformer blocks
    attention_heads: int = 32               # query heads
    kv_heads: int = 32                      # key/value heads: < attention_heads is grouped-query
    head_dim: int = 128                     # per head; hidden size = attention_heads * head_dim
    vocab: int = 32000
    max_context: int = 4096                 # tokens the model was trained to attend over

    def __post_init__(self):
        if self.params_b <= 0:
            raise ConfigError(f"model.llm.params_b={self.params_b}: must be > 0")
        positive(self, "model.llm", "layers", "attention_heads", "kv_heads", "head_dim", "vocab",
                  "max_context")
        if self.attention_heads % self.kv_heads:
            raise ConfigError(f"model.llm.kv_heads={self.kv_heads}: must divide "
                              f"attention_heads={self.attention_heads}")


SOURCES = ("onnx", "torch", "hf")  # model.source values that bring the user's own model


@dataclass
class ModelConfig:
    # What the model is called in the registry and the report; empty: the ONNX file's stem, the
    # Hugging Face folder's name, the torch checkpoint's stem (else the factory function's name),
    # the built-in task's name; lower-cased into the registry's grammar.
    name: str = "ocr"
    # Which loader builds it (the model= option sets it): a built-in task
    # (pipeline.models.TASKS: ocr, ocr_mobile), or the user's own model: onnx (an ONNX file,
    # model.path), torch (model.factory builds it, model.checkpoint holds its weights) or hf (a
    # Hugging Face folder). null: model.name, as configs written before model.source said it.
    source: Optional[str] = None
    kind: ModelKind = ModelKind.task        # llm: a shape for `python -m pipeline.bill` only
    llm: Optional[LlmConfig] = None         # the LLM's shape; required when kind=llm
    checkpoint: Optional[str] = None        # safetensors file; null = seeded random init (smoke tests)
    # The network's own settings: a built-in task's architecture (ocr: widths, hidden), or the
    # keyword arguments model=torch passes to its factory.
    params: Dict[str, Any] = field(default_factory=dict)
    path: Optional[str] = None              # model=onnx: the ONNX file; model=hf: the folder
    factory: Optional[str] = None           # model=torch: package.module:function -> nn.Module
    # model=torch: input name -> shape, fixed sizes as ints and dynamic axes by their meaning
    # (batch, width, height, sequence), e.g. {image: [batch, 3, 32, width]}; exported so.
    inputs: Dict[str, List[Any]] = field(default_factory=dict)
    input_dtypes: Dict[str, str] = field(default_factory=dict)  # default float32
    outputs: List[str] = field(default_factory=lambda: ["output"])  # model=torch: output names
    eval_samples: int = 2000                # held-out lines the accuracy gate is judged on
    calibration_samples: int = 512          # lines quantization calibrates on (a different seed)
    eval_batch_size: int = 64               # batch used for evaluation only, not for timing
    parity_samples: int = 32                # lines compared torch vs ONNX after export/optimize

    def __post_init__(self):
        positive(self, "model", "eval_samples", "calibration_samples", "eval_batch_size",
                  "parity_samples")
        if self.source is None:  # before model.source, model.name chose the loader
            self.source, self.name = self.name, "" if self.name in SOURCES else self.name
        if not self.name:
            self.name = self.default_name()
        if (self.kind == ModelKind.llm) != (self.llm is not None):
            raise ConfigError(f"model.kind={self.kind.value}: model.llm must be "
                              f"{'set' if self.kind == ModelKind.llm else 'null'}")
        if self.kind == ModelKind.llm:
            return
        if self.source == "hf" and not self.path:
            raise ConfigError("model.path is empty: model=hf needs a local Hugging Face model "
                              "folder (config.json, weights, tokenizer files)")
        if self.source == "hf" and "max_length" in self.params:
            n = self.params["max_length"]  # a bool is an int to Python, not a token count
            if isinstance(n, bool) or not isinstance(n, int) or n < 2:
                raise ConfigError(f"model.params.max_length={n!r}: must be a whole number of "
                                  "tokens, 2 or more (at most the model's context)")
        if self.source == "hf" and self.checkpoint is not None:
            raise ConfigError("model.checkpoint: model=hf takes its weights from the folder in "
                              "model.path")
        if self.source == "onnx" and not self.path:
            raise ConfigError("model.path is empty: model=onnx needs the ONNX file to compile")
        if self.source == "torch":
            if not self.factory or ":" not in self.factory:
                raise ConfigError(f"model.factory={self.factory!r}: model=torch needs "
                                  "package.module:function, a function that returns the nn.Module")
            if not self.inputs:
                raise ConfigError("model.inputs is empty: model=torch needs each input's name "
                                  "and shape, e.g. {image: [batch, 3, 32, 32]}")
        if self.checkpoint is not None and self.source == "onnx":
            raise ConfigError("model.checkpoint: model=onnx takes its weights from model.path")

    def default_name(self) -> str:
        """The registry name when model.name is empty: what the user already calls the model,
        in the registry's grammar (lower-case letters and digits joined by '.', '_' or '-')."""
        import re
        from pathlib import PurePath

        if self.source in ("onnx", "hf") and self.path:
            given = PurePath(str(self.path).rstrip("/\\"))
            given = (given.stem if self.source == "onnx" or given.suffix.lower() == ".gguf"
                     else given.name)  # a GGUF file: named like an ONNX file, by its stem
        elif self.source == "torch":
            given = (PurePath(self.checkpoint).stem if self.checkpoint
                     else str(self.factory or "").rpartition(":")[2])
        else:
            given = str(self.source or "")
        name = re.sub(r"[^a-z0-9._-]+", "-", given.lower())
        name = re.sub(r"[._-]*([._-])[._-]*", r"\1", name).strip("._-")
        return name or "model"


def decoder_path(path: Optional[str]) -> bool:
    """model.path names a decoder LLM, by the command line's own rule
    (``pipeline.config.decoder_files.is_decoder``: a GGUF file, a folder whose config.json names a
    causal LM or, without architectures, a decoder's model type). One rule: with two, a folder
    without architectures was an encoder here ("needs a metric") and a decoder there ("leave
    metric= unset")."""
    from pipeline.config.decoder_files import is_decoder

    return is_decoder(path)
