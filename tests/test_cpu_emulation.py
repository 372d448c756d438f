"""The ``isa`` tests' AVX2 runs on an emulated AVX2-only CPU: QEMU's user-mode emulation of a
Haswell (``tests/python-avx2``). The caps the per-test AVX2 runs set (``tests/conftest.py``) do
not reach ONNX Runtime's own kernels (MLAS) or OpenVINO's CPU plugin, which read cpuid; on the
emulated CPU they run as on an AVX2-only machine: u8 x s8 products summed in saturating 16-bit
pairs, no bf16. One child pytest, on the emulated CPU and with the caps (the pipeline's flags
come from /proc/cpuinfo, which the emulator leaves as the host's), runs the AVX2 runs of the
files in ``EMULATED`` and ``test_this_cpu_is_avx2_only_and_saturates_full_range_int8`` below:
that the CPU is one, and that full-range INT8 weights do saturate on it, as they did on the
AVX2-only EPYC that turned the suite red, while the 7-bit weights resolved for AVX2 are exact.
"""
from __future__ import annotations

import contextlib
import os
import re
import signal
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.conftest import AVX2_CAPS, ROOT, avx2_is_native, avx2_python

# The files whose isa tests check what a cpuid-dispatched kernel computes, run emulated; each
# emulated file costs seconds of CPU (the emulator is 5 to 15 times slower than the host, and
# each import of a large library in a new process is translated again). Their stages and probes
# run in children there as everywhere: one CI run of a faster arrangement (the stages in the
# test's own process, OpenVINO imported by the forkserver) hung, silently, for its whole limit.
# They run in this order, this file's own test last: two whole-suite runs of three that had
# sorted them (its CPU probe first, which then imported OpenVINO in the test process) hung, the
# test process waiting on a later OpenVINO probe's child. tests/conftest.py sorts only xdist
# workers' tests, and the probe asks OpenVINO in a child now (tests/cpu_probe.py).
EMULATED = {
    "tests/stages/test_sqnr.py": "ONNX Runtime's INT8 MatMul (MLAS)",
    "tests/stages/test_quantize.py": "ONNX Runtime's INT8 MatMul (MLAS)",
    "tests/test_runtimes.py": "OpenVINO's CPU plugin and ONNX Runtime",
}
# Those whose isa tests check what the pipeline decides from the flags, which the caps alone
# show (their capped runs in tests/conftest.py).
CAPS_ONLY = {
    "tests/stages/test_prune.py": "the recovery's precision, from the flags",
}
ENV = "PIPELINE_TEST_EMULATED_AVX2"  # set in the emulated child


def test_every_isa_file_is_emulated_or_says_why_not():
    """A new test of a CPU-dependent kernel is not left to the caps by oversight."""
    uses = {p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").rglob("test_*.py")
            if re.search(r"def test_\w+\([^)]*\bisa\b", p.read_text())}
    assert uses == set(EMULATED) | set(CAPS_ONLY), uses ^ (set(EMULATED) | set(CAPS_ONLY))


def test_only_a_cpu_without_avx512_vnni_or_amx_counts_as_avx2_only():
    """What decides that the AVX2 runs (capped or emulated) would repeat the native ones."""
    base = ["sse4_2", "avx", "avx2", "fma", "f16c"]
    assert avx2_is_native(base)
    for extra in ("avx512f", "avx_vnni", "avx512_vnni", "avx512_bf16", "amx_tile"):
        assert not avx2_is_native([*base, extra]), extra
    assert not avx2_is_native(["sse4_2", "avx"])  # older than AVX2: not the class either


@pytest.mark.slow
def test_the_isa_tests_pass_on_an_emulated_avx2_cpu():
    if avx2_is_native():
        pytest.skip("this CPU is AVX2-only: the isa tests' native runs are its AVX2 runs, and "
                    "the check of the CPU itself runs natively")
    python = avx2_python()
    if python is None:
        # CI must not lose the check without a word: .ci/run installs QEMU, make setup the wrapper
        assert not os.environ.get("CI"), "CI has no emulated AVX2 CPU: .ci/run installs " \
            "qemu-user and `make setup` copies tests/python-avx2 into the venv"
        pytest.skip("no emulated AVX2 CPU here (qemu-x86_64 or the venv's python-avx2 missing)")
    env = {**os.environ, **AVX2_CAPS, ENV: "1", "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    base = tempfile.mkdtemp(prefix="pytest-avx2-")  # see conftest: not this session's basetemp
    try:
        code, out = _emulated_pytest(python, env, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    assert code == 0, f"on an emulated AVX2 CPU (QEMU, Haswell):\n{out[-6000:]}"
    # every AVX2 run, and the check of the CPU itself, ran there: none skipped, none left out
    summary = out.strip().splitlines()[-1]
    assert "skipped" not in summary and "deselected" in summary, out[-3000:]


def _emulated_pytest(python: Path, env: dict, base: str, limit=600) -> tuple[int, str]:
    """The child pytest's exit code and output. Its output goes to a file, not a pipe, and it
    leads a process group of its own: a run that hangs (one CI run's did, silently, for its
    whole 900 s) is killed with every process it started, the emulated forkserver included, and
    the failure shows what it printed up to then (``-v``: each test's name as it starts), with
    every thread's stack from the faulthandler dump of a test still running after 240 s."""
    log = Path(base) / "emulated.log"
    with log.open("w") as sink:
        proc = subprocess.Popen(
            [str(python), "-m", "pytest", "-v", "-rs", "-p", "no:cacheprovider",
             "-o", "faulthandler_timeout=240", f"--basetemp={base}/t",
             "-m", f"avx2 or {ENV.lower()}", *EMULATED, Path(__file__).relative_to(ROOT).as_posix()],
            cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            pytest.fail(f"the emulated AVX2 CPU's pytest still ran after {limit} s (a few dozen "
                        f"seconds as a rule); what it printed:\n{log.read_text()[-8000:]}")
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # what outlived it: its forkserver, say
    return code, log.read_text()


@pytest.mark.pipeline_test_emulated_avx2
def test_this_cpu_is_avx2_only_and_saturates_full_range_int8():
    # On an AVX2-only machine it checks that machine; elsewhere the emulated CPU
    if os.environ.get(ENV) != "1" and not avx2_is_native():
        pytest.skip("runs inside test_the_isa_tests_pass_on_an_emulated_avx2_cpu's child")
    from tests.cpu_probe import features, u8s8_error

    seen = features()
    assert seen["numpy"]["AVX2"] and seen["numpy"]["FMA3"], seen
    assert not seen["numpy"]["AVX512F"], seen
    if seen["openvino"] is not None:  # a real AVX2 machine offers no bf16 (docs/cpus.md)
        assert "BF16" not in seen["openvino"] and "FP32" in seen["openvino"], seen
    # full-range weights: pair sums past 32767 saturate (about half the product is lost); the
    # 7-bit weights an AVX2 machine resolves fit and are exact up to float32 scaling
    assert u8s8_error(reduce_range=False) > 0.1
    assert u8s8_error(reduce_range=True) < 1e-5
