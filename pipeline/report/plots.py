"""Pictures for the report: latency CDFs (candidate against baselines) and load curves.

In: the benchmark's per-round times and the load test's steps. Out: PNG files, drawn by
matplotlib with the Agg backend (no display needed). A CDF shows the whole distribution, where a
mean or a single percentile hides a tail; the load curve shows where p99 leaves the target.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from pipeline.measure.bench_record import LoadRecord


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def latency_cdf(times_file: Path, out: Path, roles=("candidate", "fp32", "fp16")) -> None:
    plt = _plt()
    times = json.loads(Path(times_file).read_text())
    fig, axes = plt.subplots(1, len(times), figsize=(5 * len(times), 3.6), squeeze=False)
    for ax, (batch, by_role) in zip(axes[0], times.items()):
        for role in roles:
            if role in by_role:
                ms = np.sort(np.asarray(by_role[role]))
                ax.plot(ms, np.arange(1, ms.size + 1) / ms.size, label=role)
        ax.set_xscale("log")
        ax.set_xlabel("latency (ms, log)")
        ax.set_ylabel("share of runs")
        ax.set_title(f"batch {batch}")
        ax.grid(alpha=0.3)
        ax.legend()
    # fixed margins, wide enough for these labels: tight_layout measured every text first, half
    # of the 0.3 s this picture took, in every run
    fig.subplots_adjust(left=0.75 / fig.get_figwidth(), right=0.98, bottom=0.15,
                        top=0.9, wspace=0.25)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def load_curve(load: LoadRecord, out: Path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    styles = {"dynamic": "-o", "batch1": "--s"}
    for role, entry in load.models.items():
        for policy, curve in entry.curves():
            if curve.steps:
                ax.plot([s.achieved_qps for s in curve.steps], [s.p99_ms for s in curve.steps],
                        styles[policy], label=f"{role}, {policy}")
    ax.axhline(load.slo_p99_ms, color="red", lw=1, label=f"p99 target {load.slo_p99_ms} ms")
    ax.set_xlabel("achieved requests/s")
    ax.set_ylabel("p99 latency (ms, log)")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
