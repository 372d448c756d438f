"""Timed stages on a Ray cluster: on a node labelled for the target, one at a time per node.

In: a runner whose ``remote`` is a Ray address (the ray launcher sets ``PIPELINE_RAY_ADDRESS`` for
every point it runs), and a timed stage (``pipeline.core.locks.TIMED``). Out: the stage's artifact,
built or reused on a node that carries the custom resource ``hardware_<name>`` (``name`` is the
``hardware`` option, e.g. ``hardware_cpu``). Each node declares that resource with capacity 1, so
Ray runs one timed stage per node at a time; on the node the stage also takes the machine-wide
lock (``pipeline.core.locks``), so compile work of other points waits while it measures. The cache key
is computed on that node, so the hardware fingerprint, and the environment the benchmark records,
are those of the node it ran on. The workdir must be on a filesystem every node shares.
"""
from __future__ import annotations

import socket

from pipeline.core.errors import PipelineError, StageError


def resource(hardware_name: str) -> str:
    """The Ray custom resource a node carries when it is an instance of ``hardware``."""
    return f"hardware_{hardware_name}"


def _on_node(runner_class, workdir: str, hardware, stage, parent, label: str, refs: dict):
    # The runner's class is passed in (pickled by reference), not imported: the runner calls
    # this module, and the engine has no import cycle.
    lines: list[str] = []
    runner = runner_class(workdir, hardware, log=lines.append, remote="")  # "" = run here
    art = runner.run(stage, parent, label, **refs)
    row = {**runner.record[-1], "node": socket.gethostname()}
    return art, row, lines


def run_timed(runner, stage, parent, label: str, refs: dict):
    import ray

    if not ray.is_initialized():
        ray.init(address=runner.remote, log_to_driver=False, logging_level="ERROR")
    name = resource(runner.hardware.name)
    if ray.cluster_resources().get(name, 0) < 1:
        raise StageError(f"stage {label}: no node of the Ray cluster at {runner.remote} carries "
                         f"the resource {name} (start the target's nodes with "
                         f"ray start --resources='{{\"{name}\": 1}}')")
    # num_cpus=0: the point that waits for it already holds a CPU slot; the resource is the slot.
    task = ray.remote(num_cpus=0, resources={name: 1}, max_calls=1)(_on_node)
    try:
        art, row, lines = ray.get(task.remote(type(runner), str(runner.cache.parent),
                                              runner.hardware, stage, parent, label, refs))
    except ray.exceptions.RayTaskError as e:
        if isinstance(e.cause, PipelineError):
            raise e.cause from None
        raise StageError(f"stage {label} on the Ray cluster: {str(e).splitlines()[0]}") from None
    for line in lines:
        runner.log(line)
    runner.record.append(row)
    return art
