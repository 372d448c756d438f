"""``python -m pipeline.bill`` and the compile pipeline's refusals: real command lines, exit codes."""
from __future__ import annotations

import json
import subprocess

import onnxruntime
import pytest

from pipeline.engine.compose import group_options
from tests.conftest import ROOT, run_cli


def bill_cli(*args: str, cwd=ROOT) -> subprocess.CompletedProcess:
    return run_cli(*args, cwd=cwd, timeout=120, module="pipeline.bill")


def test_default_bill_is_the_articles_example_as_a_table():
    proc = bill_cli("hardware=l4")
    assert proc.returncode == 0, proc.stderr
    assert "14.00" in proc.stdout and "8.59 (8.00)" in proc.stdout and "24.09" in proc.stdout
    assert "NO, 0.09 GB short" in proc.stdout


def test_compare_hardware_as_json_has_every_profile():
    proc = bill_cli("model=llm_7b_gqa", "--compare", "hardware", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["compare"] == "hardware" and set(out["bills"]) == set(group_options("hardware"))
    assert all(round(b["memory"]["kv_cache_gb"], 2) == 2.15 for b in out["bills"].values())


def test_capacity_from_the_command_line_with_a_price():
    proc = bill_cli("capacity", "--p99-ms", "40", "--throughput", "400", "--batch", "8",
                    "hardware.price_per_hour=2", "slo.peak_qps=500",
                    "slo.requests_per_day=20000000", "--json")
    assert proc.returncode == 0, proc.stderr
    cap = json.loads(proc.stdout)
    assert cap["choice"]["instances"] == 2 and cap["cost_per_million"] > 0


@pytest.mark.parametrize("args, key", [
    (["bill.batch=0"], "bill.batch=0"),
    (["--compare", "colour"], "--compare"),
    (["--nonsense"], "--nonsense"),
    (["hardware=tpu"], "hardware=tpu"),
    (["capacity", "--p99-ms", "10"], "--p99-ms and --throughput"),
])
def test_bad_values_exit_2_with_one_line(args, key):
    proc = bill_cli(*args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and key in lines[0] and "Traceback" not in proc.stderr


def test_pipeline_refuses_an_llm_description(tmp_path):
    proc = run_cli("model=llm_7b", f"workdir={tmp_path}")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "bill-only" in lines[0]
    compilable = lines[0].split("compilable models: ")[1].split(", ")
    assert {"ocr", "ocr_tiny"} <= set(compilable) and not any(m.startswith("llm") for m in compilable)
    assert not any(tmp_path.iterdir())


@pytest.mark.skipif("CUDAExecutionProvider" in onnxruntime.get_available_providers(),
                    reason="this onnxruntime has CUDA")
def test_pipeline_refuses_a_gpu_profile_without_its_provider(tmp_path):
    proc = run_cli("hardware=h100", f"workdir={tmp_path}")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "CUDAExecutionProvider is not available" in lines[0]
    assert not any(tmp_path.iterdir())


def one_channel_model(path):
    """image [N, 1, 32, W] -> Conv 1->4 -> [N, 4, 32, W]: the OCR models' input layout."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((4, 1, 3, 3), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["image", "w"], ["y"], pads=[1, 1, 1, 1])], "one_channel",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["n", 1, 32, "width"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4, 32, "width"])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return path


def one_line(proc, code: int) -> str:
    assert proc.returncode == code, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


def test_an_empty_onnx_file_is_one_line_not_a_crash(tmp_path):
    (tmp_path / "empty.onnx").write_bytes(b"")
    line = one_line(bill_cli("model=ocr", "--onnx", str(tmp_path / "empty.onnx")), 3)
    assert "empty.onnx" in line and "0 bytes" in line


def test_an_input_shape_that_contradicts_the_model_is_refused(tmp_path):
    model = one_channel_model(tmp_path / "m.onnx")
    line = one_line(bill_cli("model=ocr", "--onnx", str(model), "bill.input_shape=[3,32,100]"), 2)
    assert "bill.input_shape=[3, 32, 100]" in line and "1" in line and "'image'" in line
    ok = bill_cli("model=ocr", "--onnx", str(model), "bill.input_shape=[1,32,100]", "--json")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["m.onnx"]["inputs"]["image"][1:] == [1, 32, 100]


def test_an_llm_input_shape_sets_the_tokens_per_sequence_or_is_refused(capsys):
    """For an LLM one sample is a sequence of token ids: bill.input_shape=[N] is bill.seq=N (in
    process: the command line's shell, stdout and stderr as the user sees them)."""
    from pipeline.cli.bill import main

    def bill(*args):
        code = main(["model=llm_7b", "hardware=l4", "--json", *args])
        out, err = capsys.readouterr()
        return code, out, err.strip().splitlines()

    code, out, _ = bill("bill.input_shape=[512]")
    short = json.loads(out)
    assert code == 0 and short["setting"]["seq"] == 512
    code, out, _ = bill("bill.seq=512")
    assert code == 0 and json.loads(out)["memory"] == short["memory"]  # the same bill
    code, out, _ = bill()
    assert short["memory"]["kv_cache_gb"] == pytest.approx(json.loads(out)["memory"]
                                                           ["kv_cache_gb"] / 4)  # 512 of 2048
    for args, words in ((["bill.input_shape=[1,512]"], ("bill.input_shape=[1, 512]", "[tokens]")),
                        (["bill.input_shape=[512]", "bill.seq=1024"], ("disagree",))):
        code, out, err = bill(*args)
        assert code == 2 and out == "" and len(err) == 1, err
        assert all(w in err[0] for w in words), err[0]


def test_the_bill_of_another_models_run_is_refused(tiny_run):
    workdir, _ = tiny_run  # compiled model=ocr_tiny
    line = one_line(bill_cli("model=ocr_mobile", f"workdir={workdir}"), 2)
    assert "model=ocr_mobile" in line and "compiled model=ocr_tiny" in line
    assert bill_cli("model=ocr_tiny", f"workdir={workdir}").returncode == 0
