"""decoder_export: a decoder LLM exported FP32 with a KV cache by onnxruntime-genai's model builder.

In: the ``Decoder`` (a Hugging Face causal-LM folder, its digest and architecture) and a few
sequences of the evaluation text. Out: the folder onnxruntime-genai loads as it is:
``model.onnx`` with its weights in ``model.onnx.data``, ``genai_config.json`` (inputs, KV cache
names, heads, context length, search defaults) and the tokenizer files; node counts by op type
(fused GroupQueryAttention, SimplifiedLayerNormalization, one MatMul per projection) and parity:
the largest difference of the exported logits from transformers' own on the same tokens. The
builder does the fusions and the KV cache; this stage only calls it and checks its output.
FP32 is the reference every candidate is scored and timed against.
"""
from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.core.errors import StageError
from pipeline.engine.runner import CHECKS_ONLY

PARITY_SEQUENCES = 2
PARITY_ATOL = 1e-2  # FP32 logits: fused attention and a different summation order, nothing more


def build_fp32(decoder, out_dir: Path) -> None:
    """onnxruntime-genai's model builder, FP32 on the CPU, into ``out_dir``; one line on failure."""
    from onnxruntime_genai.models.builder import create_model, parse_extra_options

    args = ("model", decoder.folder, str(out_dir), "fp32", "cpu",
            str(out_dir / ".scratch" / "builder"))
    log = io.StringIO()  # the builder narrates every tensor it writes
    try:
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            options = parse_extra_options(*args, [])
            rope_as_the_builder_reads(options["hf_details"]["hf_config"], decoder)
            create_model(*args, **options)
    except StageError:
        raise
    except Exception as e:  # noqa: BLE001 - the builder's errors: one line naming it
        raise StageError(f"onnxruntime-genai's model builder failed on "
                         f"{decoder.given} ({decoder.architecture}): "
                         f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
                         ) from None
    from pipeline.metrics.generation import local_window, model_file
    from pipeline.models.decoder import cap_context, context

    # A sliding window the export does not implement (Mistral, Phi-3: no local window in their
    # attention) holds what is published to the window; one it does (Gemma 2 and 3) keeps the
    # model's whole context
    if not local_window(model_file(out_dir)):
        cap_context(out_dir, context(decoder))


def rope_as_the_builder_reads(config, decoder) -> None:
    """The rotary settings of a model with two kinds of attention layer, in the form the builder
    reads. transformers 5 keeps them per kind (Gemma 3: ``rope_parameters = {"full_attention":
    {...}, "sliding_attention": {...}}``, whichever form its config.json was written in: 4.x's
    ``rope_theta`` and ``rope_local_base_freq`` are read into it); onnxruntime-genai 0.18's
    Gemma 3 builder reads 4.x's form and stops on a KeyError without it. The builder gives both
    kinds the global layers' scaling and only their base apart, so a model whose kinds differ in
    more than the base (Gemma 3 4B and up: global layers scaled linearly by 8, local ones not)
    would export local layers that attend at the wrong positions: refused, as the streaming
    path, which checks no parity, would not catch it."""
    rope = getattr(config, "rope_parameters", None)
    if not (isinstance(rope, dict) and "full_attention" in rope and "rope_type" not in rope):
        return
    full = dict(rope["full_attention"])
    local = dict(rope.get("sliding_attention", full))
    apart = sorted(k for k in {*full, *local} - {"rope_theta"} if full.get(k) != local.get(k))
    if apart:
        raise StageError(
            f"{decoder.given} ({decoder.architecture}): its global and local attention layers "
            f"differ in their rotary {', '.join(apart)} ({_rope_text(full)} against "
            f"{_rope_text(local)}), and onnxruntime-genai's model builder gives both the "
            "global layers' settings: the export would not be faithful")
    config.rope_parameters = full
    config.rope_theta = full.get("rope_theta", 10000.0)
    config.rope_local_base_freq = local.get("rope_theta", config.rope_theta)


def _rope_text(params: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(params.items()))


@dataclass(frozen=True)
class DecoderExport:
    decoder: object        # pipeline.models.decoder.Decoder
    # TextSet: the sequences parity is checked on. The export does not depend on them (the
    # builder reads the folder alone), so new evaluation text must not export again: out of the
    # key; a reused export keeps the parity it was checked with when it was built.
    data: object = field(metadata=CHECKS_ONLY)
    name = "decoder_export"
    version = 3  # 2: the stage's peak resident memory in its result; 3: context within a window
    hardware_dependent = False

    def run(self, parent, out_dir: Path) -> dict:
        from pipeline.core.env import peak_rss_mb
        from pipeline.stages.weight_only import node_counts

        build_fp32(self.decoder, out_dir)
        return {"architecture": self.decoder.architecture, "nodes": node_counts(out_dir),
                "parity_vs_transformers": self._parity(out_dir), "peak_rss_mb": peak_rss_mb()}

    def _parity(self, folder: Path) -> dict:
        import numpy as np
        import torch

        from pipeline.metrics.generation import next_token_logits
        from pipeline.models.hf_folder import offline

        offline()
        from transformers import AutoModelForCausalLM

        ids = self.data.token_ids()[:PARITY_SEQUENCES]
        model = AutoModelForCausalLM.from_pretrained(self.decoder.folder, torch_dtype=torch.float32,
                                                     use_safetensors=True).eval()
        onnx_logits = next_token_logits(folder, ids)
        worst, same = 0.0, 0
        with torch.inference_mode():
            for seq, got in zip(ids, onnx_logits):
                want = model(torch.tensor([seq])).logits[0].numpy()
                worst = max(worst, float(np.abs(want - got).max()))
                same += int((want.argmax(-1) == got.argmax(-1)).sum())
        total = sum(len(s) for s in ids)
        if worst > PARITY_ATOL * max(1.0, float(np.abs(onnx_logits[0]).max())):
            raise StageError(f"the exported decoder differs from transformers' by {worst:.3g} in "
                             f"its logits (limit {PARITY_ATOL} relative): the builder's export of "
                             f"{self.decoder.architecture} is not faithful")
        return {"max_abs_diff": worst, "argmax_agreement": same / max(total, 1),
                "sequences": len(ids)}
