"""The read-bandwidth probe: how the buffer is sized against the cache and the memory available,
and what a measurement reports (no verdict on the speed itself)."""
from __future__ import annotations

from pipeline.measure import bandwidth
from pipeline.measure.bandwidth import MAX_BYTES, MIN_BYTES, buffer_bytes, read_bandwidth


def test_buffer_is_four_caches_within_bounds_and_memory():
    assert buffer_bytes(100 * 2 ** 20, None) == 400 * 2 ** 20
    assert buffer_bytes(2 ** 20, None) == MIN_BYTES                 # never a cache-sized read
    assert buffer_bytes(4 * 2 ** 30, None) == MAX_BYTES
    assert buffer_bytes(None, None) == MIN_BYTES
    assert buffer_bytes(100 * 2 ** 20, 800 * 2 ** 20) == 200 * 2 ** 20  # a quarter of what is free


def test_cache_size_read_from_sysfs(tmp_path, monkeypatch):
    for i, size in enumerate(("32K", "2048K", "480M")):
        (tmp_path / f"index{i}").mkdir()
        (tmp_path / f"index{i}" / "size").write_text(size + "\n")
    real = bandwidth.Path
    monkeypatch.setattr(bandwidth, "Path", lambda p: real(str(p).replace(
        "/sys/devices/system/cpu/cpu0/cache", str(tmp_path))))
    assert bandwidth.last_level_cache_bytes() == 480 * 2 ** 20


def test_a_small_read_reports_median_and_spread():
    r = read_bandwidth(1, repeats=3, nbytes=8 * 2 ** 20)
    assert r["buffer_bytes"] == 8 * 2 ** 20 and r["threads"] == 1 and len(r["runs_gbs"]) == 3
    assert 0 < r["min_gbs"] <= r["gbs"] <= r["max_gbs"]
