"""``hardware=cpu`` describes the machine the run is on: probed once per CPU fingerprint, cached
atomically, explicit values kept, and the bill says where its numbers come from."""
from __future__ import annotations

import json

import pytest

from pipeline.measure import machine
from pipeline.measure.probe import memory_gb
from pipeline.engine.compose import compose
from pipeline.core.env import cpu_info

AVX2 = {"model": "AMD EPYC", "flags": ["avx", "avx2", "fma"], "logical_cores": 2,
        "machine": "x86_64"}
AMX = {**AVX2, "model": "Intel Xeon Platinum 8480", "flags": [*AVX2["flags"], "amx_int8"]}


def fake_probe(calls: list, fp32: float = 0.1):
    def probe(threads):
        calls.append(threads)
        return {"cpu": "test CPU", "threads": threads, "date": "2026-11-30", "memory_gb": 7.5,
                "profile": {"memory_bandwidth_gbs": 12.0, "peak_tflops": {"fp32": fp32}},
                "busy": [], "seconds": 0.1}
    return probe


def test_fingerprint_separates_cpus_caps_threads_and_memory():
    base = machine.fingerprint(2, AVX2, 25.3)
    assert machine.fingerprint(2, dict(AVX2), 25.3) == base
    assert len({base, machine.fingerprint(2, AMX, 25.3), machine.fingerprint(4, AVX2, 25.3),
                machine.fingerprint(2, AVX2, 64.0),
                machine.fingerprint(2, {**AVX2, "isa_caps": {"ONEDNN_MAX_CPU_ISA": "AVX2"}},
                                    25.3)}) == 5


def test_probed_once_per_fingerprint_then_read_from_the_cache(tmp_path):
    calls = []
    first, source = machine.profile(2, fake_probe(calls), tmp_path)
    again, _ = machine.profile(2, fake_probe(calls), tmp_path)
    assert calls == [2] and again == first and "cached" in source
    files = list(tmp_path.iterdir())
    assert [f.name for f in files] == [f"{machine.fingerprint(2)}.json"]  # no temp file left
    # another CPU (here: the same one with 4 threads) is probed again, into its own file
    machine.profile(4, fake_probe(calls), tmp_path)
    assert calls == [2, 4] and len(list(tmp_path.iterdir())) == 2
    # a torn or foreign file is not trusted: probed again and replaced whole
    files[0].write_text('{"version": 1, "profi')
    record, _ = machine.profile(2, fake_probe(calls, fp32=0.2), tmp_path)
    assert calls == [2, 4, 2] and json.loads(files[0].read_text()) == record


def test_an_unwritable_cache_still_gives_the_numbers_and_says_so(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    record, source = machine.profile(2, fake_probe([]), blocker / "sub")
    assert record["profile"]["peak_tflops"]["fp32"] == 0.1 and "not cached" in source


def test_hardware_cpu_carries_this_machines_numbers():
    """A committed profile carried another machine's memory and a VNNI INT8 peak."""
    hw = compose([]).hardware
    assert hw.name == "cpu" and hw.memory_gb == pytest.approx(memory_gb())
    assert hw.peak_tflops.fp32 > 0 and hw.memory_bandwidth_gbs > 0
    assert f"probed on this machine: {cpu_info()['model']}" in hw.source
    assert machine.fingerprint(hw.intra_op_threads) in hw.source
    kept = compose(["hardware.memory_gb=1.5", "hardware.peak_tflops.int8=3.0"]).hardware
    assert kept.memory_gb == 1.5 and kept.peak_tflops.int8 == 3.0
    assert kept.peak_tflops.fp32 == hw.peak_tflops.fp32  # the rest still from the probe
    assert compose(["hardware=l4"]).hardware.memory_gb == 24  # datasheets are not probed
