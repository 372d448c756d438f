"""Bytes per decoded token counted from tiny ``onnx.helper`` graphs: MatMulNBits codes, scales and
zero points in full, the embedding and rotary caches one row per token, the KV cache per position;
the bound from an injected bandwidth; what fits a memory budget."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from pipeline.bill.llm import kv_bytes
from pipeline.bill.token_bytes import bound_tokens_per_s, count, fit
from pipeline.config import LlmConfig, Precision

VOCAB, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, MAX_POS = 100, 64, 4, 2, 16, 128


def init(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def nbits(name, k, n, block, bits, zero_points):
    """A MatMulNBits weight's initializers: packed codes [N, blocks, blob], FP32 scales, and
    packed 4-bit zero points when asymmetric."""
    blocks = -(-k // block)
    out = [init(f"{name}_q", np.zeros((n, blocks, block * bits // 8), np.uint8)),
           init(f"{name}_s", np.ones(n * blocks, np.float32))]
    if zero_points:
        out.append(init(f"{name}_z", np.zeros(n * -(-blocks * bits // 8), np.uint8)))
    return out


def decoder(bits=4, block=32, zero_points=False, tied_float_head=False):
    inits = [init("embed", np.zeros((VOCAB, HIDDEN), np.float32)),
             init("norm", np.ones(HIDDEN, np.float32)),
             init("cos_cache", np.zeros((MAX_POS, HEAD_DIM // 2), np.float32)),
             init("sin_cache", np.zeros((MAX_POS, HEAD_DIM // 2), np.float32))]
    qkv = nbits("qkv", HIDDEN, (HEADS + 2 * KV_HEADS) * HEAD_DIM, block, bits, zero_points)
    inits += qkv
    mnb = dict(domain="com.microsoft", K=HIDDEN, bits=bits, block_size=block)
    nodes = [helper.make_node("Gather", ["embed", "input_ids"], ["h0"]),
             helper.make_node("SimplifiedLayerNormalization", ["h0", "norm"], ["h1"]),
             helper.make_node("MatMulNBits", ["h1", *(t.name for t in qkv)], ["qkv"],
                              N=(HEADS + 2 * KV_HEADS) * HEAD_DIM, **mnb),
             helper.make_node("GroupQueryAttention",
                              ["qkv", "", "", "past_key_values.0.key", "past_key_values.0.value",
                               "seqlens", "total", "cos_cache", "sin_cache"],
                              ["attn", "present.0.key", "present.0.value"], domain="com.microsoft",
                              num_heads=HEADS, kv_num_heads=KV_HEADS)]
    if tied_float_head:  # the embedding table read in full by a float output layer
        nodes.append(helper.make_node("Gemm", ["attn", "embed"], ["logits"], transB=1))
    else:
        head = nbits("head", HIDDEN, VOCAB, block, bits, zero_points)
        inits += head
        nodes.append(helper.make_node("MatMulNBits", ["attn", *(t.name for t in head)],
                                      ["logits"], N=VOCAB, **{**mnb, "K": HIDDEN}))
    kv = [helper.make_tensor_value_info(f"past_key_values.0.{x}", TensorProto.FLOAT,
                                        ["batch", KV_HEADS, "past", HEAD_DIM]) for x in ("key", "value")]
    graph = helper.make_graph(
        nodes, "decoder",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]), *kv],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "seq", VOCAB])],
        inits)
    return helper.make_model(graph)


def test_int4_codes_scales_rows_and_kv():
    tb = count(decoder())
    qkv_n = (HEADS + 2 * KV_HEADS) * HEAD_DIM
    codes = (qkv_n + VOCAB) * HIDDEN // 2                   # 4 bits per weight
    scales = (qkv_n + VOCAB) * (HIDDEN // 32) * 4           # one FP32 scale per 32 weights
    assert tb.by_kind == {"codes": codes, "scales": scales, "float": HIDDEN * 4}
    assert tb.weights == codes + scales + HIDDEN * 4
    assert scales == codes / 4                              # params x bits / 8 is 25 % short
    assert tb.output_layer == VOCAB * HIDDEN // 2 + VOCAB * 2 * 4
    # one embedding row and one row of each rotary cache per token, not the tables
    assert tb.rows_per_token == HIDDEN * 4 + 2 * (HEAD_DIM // 2) * 4
    assert tb.kv_per_position == 2 * KV_HEADS * HEAD_DIM * 4 and tb.layers == 1
    assert tb.stored == tb.weights + (VOCAB * HIDDEN + 2 * MAX_POS * HEAD_DIM // 2) * 4


def test_int8_asymmetric_zero_points_and_block_size():
    tb = count(decoder(bits=8, block=16, zero_points=True))
    qkv_n = (HEADS + 2 * KV_HEADS) * HEAD_DIM
    blocks = (qkv_n + VOCAB) * HIDDEN // 16
    assert tb.by_kind["codes"] == (qkv_n + VOCAB) * HIDDEN
    assert tb.by_kind["scales"] == blocks * 4 and tb.by_kind["zero_points"] == blocks


def test_an_embedding_also_read_in_full_counts_once_in_full():
    tb = count(decoder(tied_float_head=True))
    assert tb.output_layer == VOCAB * HIDDEN * 4
    assert tb.rows_per_token == 2 * (HEAD_DIM // 2) * 4     # rotary rows only
    assert tb.by_kind["float"] == (VOCAB + 1) * HIDDEN * 4


def test_a_table_transposed_then_gathered_is_one_row_per_token():
    """The builder's tied embedding: Gather(Transpose(output layer's [HIDDEN, VOCAB] weight)).
    With the output layer quantized (MatMulNBits), the float weight only feeds the transpose,
    which onnxruntime folds at load: one HIDDEN row per token, not the whole table per step."""
    model = decoder()
    graph = model.graph
    table = next(t for t in graph.initializer if t.name == "embed")
    table.CopyFrom(init("embed_t", np.zeros((HIDDEN, VOCAB), np.float32)))
    graph.node.insert(0, helper.make_node("Transpose", ["embed_t"], ["embed"], perm=[1, 0]))
    tb = count(model)
    assert tb.rows_per_token == HIDDEN * 4 + 2 * (HEAD_DIM // 2) * 4
    assert "embed_t" not in str(tb.by_kind) and tb.by_kind.get("float") == HIDDEN * 4
    # the same table also read in full by a float output layer counts once, in full
    graph.node.append(helper.make_node("MatMul", ["attn", "embed_t"], ["more"]))
    assert count(model).by_kind["float"] == (VOCAB + 1) * HIDDEN * 4


def test_kv_bytes_match_the_bills_formula():
    tb = count(decoder())
    llm = LlmConfig(params_b=0.001, layers=1, attention_heads=HEADS, kv_heads=KV_HEADS,
                    head_dim=HEAD_DIM, vocab=VOCAB, max_context=MAX_POS)
    for batch, seq in ((1, 1), (4, 100), (3, 128)):
        assert tb.kv_bytes(seq, batch) == kv_bytes(llm, batch, seq, Precision.fp32)


def test_bound_from_an_injected_bandwidth():
    tb = count(decoder())
    one = bound_tokens_per_s(10.0, tb, kv_len=0)
    assert one == pytest.approx(10e9 / (tb.weights + tb.rows_per_token))
    four = bound_tokens_per_s(10.0, tb, kv_len=100, streams=4)
    assert four == pytest.approx(4 * 10e9 / (tb.weights + 4 * (tb.rows_per_token
                                                             + 100 * tb.kv_per_position)))
    assert bound_tokens_per_s(20.0, tb, kv_len=100) == pytest.approx(
        2 * bound_tokens_per_s(10.0, tb, kv_len=100))
    # a longer cache costs more bytes per token
    assert tb.per_token(1000) > tb.per_token(10)


def test_what_fits_a_memory_budget():
    tb = count(decoder())
    budget = tb.stored + 1000 + 10 * 50 * tb.kv_per_position + 7
    f = fit(tb, budget, margin_bytes=1000, seq=50, streams=10)
    assert f["max_streams_at_seq"] == {"seq": 50, "streams": 10}
    assert f["max_seq_at_streams"] == {"streams": 10, "seq": 50}
    assert fit(tb, tb.stored, seq=1)["max_streams_at_seq"]["streams"] == 0


def test_heads_and_head_size_from_genai_config_when_the_graph_leaves_them_symbolic(tmp_path):
    import json

    import onnx

    m = decoder()
    for i in m.graph.input[1:]:
        i.type.tensor_type.shape.dim[3].ClearField("dim_value")
        i.type.tensor_type.shape.dim[3].dim_param = "kv_cache_dim"
    onnx.save(m, tmp_path / "model.onnx")
    with pytest.raises(ValueError, match="heads and head size"):
        count(tmp_path / "model.onnx")
    (tmp_path / "genai_config.json").write_text(json.dumps(
        {"model": {"decoder": {"num_key_value_heads": KV_HEADS, "head_size": HEAD_DIM}}}))
    assert count(tmp_path / "model.onnx").kv_per_position == 2 * KV_HEADS * HEAD_DIM * 4
