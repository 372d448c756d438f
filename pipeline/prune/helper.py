"""What a model offers pruning: the task's pruning helper, and the layers it keeps whole.

In: a task (a ``pipeline.task.contract.Prunable``, or one saying in ``no_pruning`` why it is
not) and the ``prune`` config. Out: the
task's pruning helper for a network (trace input, held-out data and scores, recovery loop), or one
line saying why this model cannot be pruned; the config with the model's own ignored layers filled
in; and ``preflight``: the pruning planned on the configured architecture before any stage runs,
so a bad ``prune.*`` value or an ONNX-only model costs one line and seconds, not a recovery.
"""
from __future__ import annotations

from pipeline.core.errors import ConfigError
from pipeline.task.contract import Prunable, PruningHelper


def refuse_unprunable(t) -> None:
    """One line, before anything is built, for a model without a network to prune."""
    why = getattr(t, "no_pruning", None)
    if why or not isinstance(t, Prunable):
        raise ConfigError(f"prune=channels: {why or f'model {t.key!r} has no pruning support'}")


def helper(t, net) -> PruningHelper:
    """The task's pruning helper for ``net`` (its trace input, held-out data, scores and
    recovery loop), or one line saying why this model cannot be pruned."""
    refuse_unprunable(t)
    return t.pruning_helper(net)


def with_ignored(cfg, t):
    """``prune.ignored: null`` means the model's own default (layers whose width is fixed)."""
    import dataclasses

    if cfg.ignored is not None:
        return cfg
    return dataclasses.replace(cfg, ignored=list(t.prune_ignored))


def preflight(t, prune, params: dict) -> dict[str, list[int]]:
    """Plan the pruning on the configured architecture (random weights: the channel counts do not
    depend on them) before any stage runs, so a bad ``prune.*`` value costs seconds, not a
    recovery. Returns the planned {layer: [before, after]}."""
    from pipeline.prune import channels as pruning

    refuse_unprunable(t)
    net = t.build_network(params)
    return pruning.plan(net, helper(t, net).example(), with_ignored(prune, t)).widths
