"""Module paths for ONNX nodes (``pipeline.quant.modules``) on hand-built graphs, one per source
the module reads: the dynamo exporter's scope metadata, a TorchScript scope name, a fused node's
scoped output, named parameters; a node none of them names keeps its node name in the per-layer
table, and two nodes of one module are told apart there. (The same on a real transformer export:
tests/test_hf.py.)"""
from onnx import TensorProto, helper, numpy_helper
import numpy as np

from pipeline.quant.modules import node_modules
from pipeline.report.quant import layer_rows


def _graph():
    w = [numpy_helper.from_array(np.zeros((2, 2), np.float32), n)
         for n in ("enc.0.weight", "model.embeddings.word.weight", "model.embeddings.norm.bias",
                   "onnx::MatMul_7")]
    dynamo = helper.make_node("Gemm", ["x", "enc.0.weight"], ["linear"], name="node_linear")
    dynamo.metadata_props.add(key="pkg.torch.onnx.name_scopes", value="['', 'enc', 'enc.0', 'linear']")
    nodes = [dynamo,
             helper.make_node("MatMul", ["linear", "onnx::MatMul_7"], ["/model/layer.0/q/MatMul_output_0"],
                              name="/model/layer.0/q/MatMul"),
             helper.make_node("Relu", ["/model/layer.0/q/MatMul_output_0"],
                              ["/model/layer.0/attention/self/Reshape_3_output_0"], name="Attention_0"),
             helper.make_node("Add", ["model.embeddings.word.weight", "model.embeddings.norm.bias"],
                              ["e"], name="EmbedLayerNormalization_0"),
             helper.make_node("Add", ["e", "onnx::MatMul_7"], ["f"], name="Add_12"),
             helper.make_node("Mul", ["f", "f"], ["/model/Mul_output_0"], name="/model/Mul")]
    return helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
                             [helper.make_tensor_value_info("f", TensorProto.FLOAT, [2, 2])], w)


def test_each_source_of_a_module_path():
    paths = node_modules(_graph(), prefix="model.")
    assert paths == {"node_linear": "enc.0",                       # dynamo metadata
                     "/model/layer.0/q/MatMul": "layer.0.q",        # TorchScript scope name
                     "Attention_0": "layer.0.attention.self",       # a fused node's output
                     "EmbedLayerNormalization_0": "embeddings"}     # its parameters' module
    # Add_12 (no scope, an unnamed weight) and /model/Mul (the wrapper itself): no path
    assert node_modules(_graph())["/model/layer.0/q/MatMul"] == "model.layer.0.q"


def test_the_table_names_rows_by_module_and_keeps_the_node_name_otherwise():
    from pipeline.quant.explanation import Explanation, NodeProfile
    from pipeline.quant.int8_info import QuantInfo

    def node(name, module, precision="int8-dynamic"):
        return NodeProfile(name, module, "MatMul", "MatMulInteger", precision, 1.0, 0.5, 0.5, False)

    nodes = (node("/m/a/MatMul", "a"), node("/m/a/MatMul_1", "a"), node("Add_12", None),
             node("/m/b/MatMul", "b"), node("/m/c/MatMul", "c", "float"))
    q = QuantInfo(settings=None, calibration="none (dynamic)",
                  explain=Explanation(8, 1, 4.0, 2.0, 0.0, nodes, (), 0, 0, (), ()))
    assert [r.module for r in layer_rows(q)] == ["a [MatMul]", "a [MatMul_1]", "Add_12", "b"]
