"""make bench's Optimum peer: the AutoQuantizationConfig chosen from the CPU's flags, its
refusals of bad input (one line, exit 2, checked before Optimum is imported, so this venv runs
them), and the transformer section's rows when Optimum could not be run."""
import subprocess
import sys
from pathlib import Path

from benchmarks import optimum_peer
from benchmarks.transformer import targets
from tests.conftest import one_line

SCRIPT = Path(optimum_peer.__file__)


def test_the_widest_integer_instructions_name_the_config():
    assert optimum_peer.arch({"avx", "avx2", "fma"}, "x86_64") == "avx2"
    assert optimum_peer.arch({"avx2", "avx512f", "avx512bw"}, "x86_64") == "avx512"
    assert optimum_peer.arch({"avx2", "avx512f", "avx512_vnni"}, "x86_64") == "avx512_vnni"
    assert optimum_peer.arch({"avx_vnni", "avx2"}, "x86_64") == "avx2"  # Optimum has no AVX-VNNI
    assert optimum_peer.arch({"asimd"}, "aarch64") == "arm64"


def test_flags_are_read_from_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse avx2 avx512f\n\nprocessor\t: 1\n")
    assert optimum_peer.cpu_flags(str(info)) == {"fpu", "sse", "avx2", "avx512f"}
    assert optimum_peer.cpu_flags(str(tmp_path / "none")) == set()


def test_bad_input_ends_with_one_line_and_nothing_written(tmp_path):
    model, folder, out = tmp_path / "model.onnx", tmp_path / "bert", tmp_path / "out"

    def peer():
        return subprocess.run([sys.executable, "-I", str(SCRIPT), str(model), str(folder),
                               str(out)], capture_output=True, text=True)

    one_line(peer(), 2, str(model), "no such ONNX file")
    model.write_bytes(b"")
    folder.mkdir()
    one_line(peer(), 2, str(folder), "no config.json")
    (folder / "config.json").write_text("{}")
    out.mkdir()
    one_line(peer(), 2, str(out), "already exists")
    assert list(out.iterdir()) == []


def test_an_optimum_failure_is_recorded_not_claimed():
    peers = {"optimum": {"error": "optimum_peer exited 3: DecodeError"},
             "cosine_mean_vs_fp16": {"pipeline": 0.9999},
             "1": {"pipeline_speedup_vs_openvino": {"median": 2.0}},
             "8": {"pipeline_speedup_vs_openvino": {"median": 0.9}}}
    rows = targets({}, {}, None, 1.3, False, peers)
    optimum = {k: v for k, v in rows.items() if "Optimum" in k}
    assert len(optimum) == 2
    assert all(v[1] is None and "DecodeError" in v[0] for v in optimum.values())
    assert rows["batch 1: pipeline faster than OpenVINO's default compile"] == [2.0, True]
    assert rows["batch 8: pipeline faster than OpenVINO's default compile"] == [0.9, False]
