"""How many ranked units the mixed search keeps float (``pipeline.quant.prefix``): galloping
from one unit, then a bisection; and which candidates ``quant=auto`` does not build."""
from __future__ import annotations

from types import SimpleNamespace

import onnx
import pytest
from onnx import TensorProto, helper

from pipeline.quant.prefix import limit, smallest_passing


def _search(n: int, answer: int | None, stop_after: int | None = None):
    tried: list[int] = []

    def passes(k: int) -> bool:
        tried.append(k)
        return answer is not None and k >= answer

    stop = (lambda: False) if stop_after is None else (lambda: len(tried) >= stop_after)
    return smallest_passing(n, passes, stop), tried


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 13, 64, 68, 100])
def test_the_smallest_passing_prefix_is_found_within_the_limit(n):
    for answer in range(1, n + 1):
        k, tried = _search(n, answer)
        assert k == answer
        assert len(tried) <= limit(n), (n, answer, tried)
        assert len(set(tried)) == len(tried) and all(1 <= t <= n for t in tried)


def test_a_few_units_cost_a_few_evaluations_not_log2_of_all():
    """Three of 68 units matter: 1, 2, 4 then 3, where bisection from the middle spent 6."""
    k, tried = _search(68, 3)
    assert k == 3 and tried == [1, 2, 4, 3]
    k, tried = _search(256, 1)
    assert k == 1 and tried == [1]


def test_nothing_passes_even_with_every_unit_float():
    k, tried = _search(10, None)
    assert k is None and tried[-1] == 10 and tried == [1, 2, 4, 8, 10]
    assert _search(0, 1) == (None, [])


def test_a_stop_returns_the_best_passing_prefix_so_far():
    k, tried = _search(64, 5, stop_after=4)  # 1, 2, 4 fail, 8 passes; then no time for 6, 5
    assert tried == [1, 2, 4, 8] and k == 8
    k, tried = _search(64, 40, stop_after=3)  # nothing passed before the stop
    assert k is None and tried == [1, 2, 4]


def _graph(path, op: str):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    node = helper.make_node(op, ["x"], ["y"], name=f"{op.lower()}0")
    onnx.save(helper.make_model(helper.make_graph([node], "g", [x], [y])), str(path))
    return SimpleNamespace(model=path)


def test_auto_builds_no_dynamic_candidate_for_a_graph_without_its_ops(tmp_path):
    """Dynamic INT8 of a CNN with no LSTM quantizes nothing: it would be FP32 again."""
    from pipeline.recipes.auto import dynamic_ops

    t = SimpleNamespace(dynamic_op_types=("LSTM", "GRU"))
    cfg = SimpleNamespace(quant=SimpleNamespace(dynamic_op_types=None))
    cnn, other = _graph(tmp_path / "cnn.onnx", "Relu"), _graph(tmp_path / "mm.onnx", "Sigmoid")
    assert dynamic_ops(cfg, t, cnn) == []
    assert dynamic_ops(cfg, t, cnn, other) == []
    cfg.quant.dynamic_op_types = ["Relu"]  # the user's own list wins over the task's
    assert dynamic_ops(cfg, t, cnn) == ["relu0"]
    cfg.quant.dynamic_op_types = None
    assert dynamic_ops(cfg, SimpleNamespace(dynamic_op_types=("Sigmoid",)), cnn, other) == ["sigmoid0"]


def test_auto_times_no_candidate_where_it_misses_the_accuracy_budget():
    """Labels left out of quant=auto's benchmark: a candidate or contender on a runtime where its
    evaluation fails accuracy, and FP16 where it is no float baseline; never a float baseline
    nor the INT8 model on its own target (the benchmark's parent)."""
    from pipeline.recipes.auto import not_timed
    from pipeline.runtimes import PRIMARY, Target

    hw = SimpleNamespace(runtime="auto", precision="fp32")
    ov32, ovbf = Target("openvino", "fp32"), Target("openvino", "bf16")
    bad = {("candidate", PRIMARY), ("candidate", ov32), ("mixed", ovbf), ("fp32", ov32)}
    plan = SimpleNamespace(options=[PRIMARY, ov32, ovbf],
                           evaluation_of=lambda evals, role, t: (role, t))
    out = not_timed(hw, plan, {}, ["fp32", "fp16", "mixed"], ("fp32", "mixed"),
                    lambda ev: ev not in bad)
    assert sorted(out) == sorted(["candidate @ openvino fp32", "mixed @ openvino bf16",
                                  "fp16 @ openvino bf16"])
