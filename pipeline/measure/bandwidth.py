"""This machine's memory read bandwidth, measured now: the bound on decode speed.

In: a thread count (the one the model runs with) and a number of repeats. Out: GB/s of a
streaming read (median, min, max and every repeat), the buffer size, and the last-level cache it
was sized against. Decode reads every weight once per token and writes almost nothing, so a read
(a sum over the buffer, torch's vectorized reduction on ``threads`` threads) is the operation to
time, not a copy (``pipeline.measure.probe`` times a copy, read plus write, for the hardware profile).

Why these choices:
- The buffer is four times the last-level cache (at least 256 MiB, at most 2 GiB and a quarter of
  the memory available now): a buffer that fits in cache measures the cache. Virtual machines may
  report the host's whole cache; the size used and the cache read are both in the result.
- The same thread count as the model: on a 2-core VM one thread does not saturate memory reads,
  and the bound must be the one the model's own kernels could reach.
- The median is the number, with min and max beside it: taken in the same run as the decode
  timings, next to other processes, one repeat may land on a burst. Bandwidth is decimal GB/s.
Deliberately not handled: NUMA placement, huge pages, non-temporal reads.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

MIN_BYTES, MAX_BYTES = 256 * 2 ** 20, 2 * 2 ** 30


def last_level_cache_bytes() -> int | None:
    """Size of the largest cache CPU 0 reports under /sys (Linux), None when unreadable."""
    best = None
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        unit = {"K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30}.get(text[-1:].upper(), 1)
        digits = text.rstrip("KkMmGg")
        if digits.isdigit():
            best = max(best or 0, int(digits) * unit)
    return best


def available_bytes() -> int | None:
    from pipeline.core.env import meminfo_bytes

    return meminfo_bytes("MemAvailable")


def buffer_bytes(llc: int | None, available: int | None) -> int:
    size = max(MIN_BYTES, 4 * (llc or 0))
    size = min(size, MAX_BYTES)
    if available:
        size = min(size, max(MIN_BYTES // 4, available // 4))
    return int(size)


def read_bandwidth(threads: int, repeats: int = 7, nbytes: int | None = None) -> dict:
    """Stream-read GB/s on ``threads`` threads: median, min, max over ``repeats`` timed reads
    after one untimed read (page faults, thread start)."""
    import torch

    llc = last_level_cache_bytes()
    nbytes = nbytes or buffer_bytes(llc, available_bytes())
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        buf = torch.ones(nbytes // 4, dtype=torch.float32)
        buf.sum()
        rates = []
        for _ in range(repeats):
            t0 = time.perf_counter_ns()
            buf.sum()
            rates.append(buf.nbytes / ((time.perf_counter_ns() - t0) / 1e9) / 1e9)
        del buf
    finally:
        torch.set_num_threads(before)
    return {"gbs": float(np.median(rates)), "min_gbs": float(min(rates)),
            "max_gbs": float(max(rates)), "runs_gbs": [round(r, 2) for r in rates],
            "threads": threads, "buffer_bytes": int(nbytes), "last_level_cache_bytes": llc,
            "buffer_over_cache": (nbytes / llc) if llc else None}
