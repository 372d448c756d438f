"""decoder_export: the tiny Llama exported FP32 with a KV cache by onnxruntime-genai's model
builder, as a folder onnxruntime-genai loads (graph, external weights, genai_config.json, the
tokenizer), its attention fused, its logits checked against transformers' own; an export whose
logits differ is refused, and a builder failure is one line naming the model."""
from __future__ import annotations

import json
import shutil

import pytest

from pipeline.core.errors import StageError
from pipeline.stages.decoder_export import PARITY_ATOL, PARITY_SEQUENCES, DecoderExport
from tests.stages.support import run

# Every test here stands on the tiny Llama's export by the model builder (tiny_decoder: about
# ten seconds, once per worker): out of make test-fast's edit loop.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def exported(tiny_decoder, tmp_path_factory):
    out = tmp_path_factory.mktemp("decoder-export") / "fp32"
    return out, run(DecoderExport(tiny_decoder.decoder, tiny_decoder.text), None, out)


def test_the_export_is_a_genai_folder_faithful_to_transformers(exported):
    out, meta = exported
    assert {"model.onnx", "model.onnx.data", "genai_config.json", "tokenizer.json"} <= \
        {p.name for p in out.iterdir()}
    genai = json.loads((out / "genai_config.json").read_text())["model"]
    assert genai["decoder"]["num_hidden_layers"] == 2 and genai["type"] == "llama"
    assert meta["architecture"] == "LlamaForCausalLM"
    # the builder's fusions: one attention node per layer; a MatMul per projection
    assert meta["nodes"]["GroupQueryAttention"] == 2
    assert meta["nodes"]["MatMul"] >= 2 * 4
    parity = meta["parity_vs_transformers"]
    assert parity["sequences"] == PARITY_SEQUENCES
    assert parity["max_abs_diff"] < PARITY_ATOL and parity["argmax_agreement"] >= 0.95
    assert meta["peak_rss_mb"] > 0


def _scaled_head(src, dst, factor: float) -> None:
    """``src`` copied to ``dst`` with the LM head's weights scaled: a wrong export."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    shutil.copytree(src, dst)
    model = onnx.load(str(src / "model.onnx"))
    head = next(n for n in model.graph.node if n.op_type == "MatMul" and "lm_head" in n.name)
    w = next(i for i in model.graph.initializer if i.name == head.input[1])
    w.CopyFrom(numpy_helper.from_array(np.asarray(numpy_helper.to_array(w) * factor), w.name))
    (dst / "model.onnx.data").unlink()
    onnx.save(model, str(dst / "model.onnx"), save_as_external_data=True,
              location="model.onnx.data")


def _parity(stage, folder):
    return stage._parity(folder)


def test_an_export_whose_logits_differ_from_transformers_is_refused(exported, tiny_decoder,
                                                                   tmp_path):
    from pipeline.core import isolate

    out, _ = exported
    _scaled_head(out, tmp_path / "wrong", 3.0)
    stage = DecoderExport(tiny_decoder.decoder, tiny_decoder.text)
    with pytest.raises(StageError, match=r"differs from transformers' by .* is not faithful"):
        isolate.call("parity", _parity, stage, tmp_path / "wrong")


def test_a_builder_failure_is_one_line_naming_the_model(tiny_decoder, tmp_path):
    import dataclasses

    broken = tmp_path / "broken"
    shutil.copytree(tiny_decoder.decoder.folder, broken)
    (broken / "model.safetensors").unlink()
    decoder = dataclasses.replace(tiny_decoder.decoder, folder=str(broken), given="broken")
    with pytest.raises(StageError) as e:
        run(DecoderExport(decoder, tiny_decoder.text), None, tmp_path / "out")
    assert "model builder failed on broken (LlamaForCausalLM)" in str(e.value)
    assert "\n" not in str(e.value)
