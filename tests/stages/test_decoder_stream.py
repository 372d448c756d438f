"""The streaming path's two stages on the tiny Llama. decoder_export_stream: the builder's FP32
folder, the graph decoder_export writes, with no session on it (no parity). weight_only_stream:
the MatMuls of a plan as MatMulNBits one weight at a time, the same tensors and nodes the
weight_only stage writes for the plan, the folder's other files carried over; a plan naming no
MatMul of the graph is one line."""
from __future__ import annotations

import pytest

from pipeline.core.errors import StageError
from pipeline.stages.decoder_stream import DecoderExportStream, WeightOnlyStream
from pipeline.stages.weight_only import WeightOnly, matmuls, node_counts
from tests.stages.support import run

# Every test here stands on the tiny Llama's export by the model builder (tiny_decoder: about
# ten seconds, once per worker): out of make test-fast's edit loop.
pytestmark = pytest.mark.slow


def test_the_streamed_export_is_the_builders_graph_without_a_parity_check(tiny_decoder,
                                                                          tmp_path):
    out = tmp_path / "fp32"
    meta = run(DecoderExportStream(tiny_decoder.decoder), None, out)
    assert meta["nodes"] == node_counts(tiny_decoder.fp32.path)  # what decoder_export builds
    assert meta["parity_vs_transformers"] is None
    assert meta["weights_bytes"] == (out / "model.onnx.data").stat().st_size > 0
    assert (out / "genai_config.json").is_file() and meta["peak_rss_mb"] > 0


def _tensors_and_nodes(folder):
    import onnx

    m = onnx.load(str(folder / "model.onnx"))
    tensors = {t.name: onnx.numpy_helper.to_array(t).tobytes() for t in m.graph.initializer}
    nodes = sorted((n.name, n.op_type, tuple(n.input), tuple(n.output),
                    tuple(sorted((a.name, onnx.helper.get_attribute_value(a))
                                 for a in n.attribute))) for n in m.graph.node)
    return tensors, nodes


def test_streamed_weights_are_what_weight_only_writes(tiny_decoder, tmp_path):
    fp32 = tiny_decoder.fp32
    names = matmuls(fp32.path)
    # 8 bits, 4 bits, and the output layer left float
    plan = tuple((n, 4 if i % 2 else 8) for i, n in enumerate(names[:-1]))
    meta = run(WeightOnlyStream(plan, 32, False, 4), fp32, tmp_path / "stream")
    run(WeightOnly(plan, 32, False, "rtn", 4), fp32, tmp_path / "whole")
    assert _tensors_and_nodes(tmp_path / "stream") == _tensors_and_nodes(tmp_path / "whole")
    fours = sum(b == 4 for _, b in plan)
    assert meta["matmul_bits"] == {"4": fours, "8": len(plan) - fours}
    assert meta["matmul_float"] == 1 and meta["nodes"]["MatMulNBits"] == len(plan)
    assert 0 < meta["largest_weight_bytes"] < meta["weights_bytes"]
    carried = {p.name for p in fp32.path.iterdir()} - {"model.onnx", "model.onnx.data"}
    assert carried and carried <= {p.name for p in (tmp_path / "stream").iterdir()}


def test_a_plan_naming_no_matmul_of_the_graph_is_one_line(tiny_decoder, tmp_path):
    with pytest.raises(StageError, match=r"weight_only_stream: no MatMul named nowhere in the graph$"):
        run(WeightOnlyStream((("nowhere", 4),), 32, True, 0), tiny_decoder.fp32, tmp_path / "q")
