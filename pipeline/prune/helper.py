"""What a model offers pruning: the task's pruning helper, and the layers it keeps whole.

In: a task (its ``pruning`` helper module, or why it has none) and the ``prune`` config. Out: the
task's pruning helper for a network (trace input, held-out data and scores, recovery loop), or one
line saying why this model cannot be pruned; the config with the model's own ignored layers filled
in; and ``preflight``: the pruning planned on the configured architecture before any stage runs,
so a bad ``prune.*`` value or an ONNX-only model costs one line and seconds, not a recovery.
"""
from __future__ import annotations

import importlib
from pipeline.core.errors import ConfigError


def refuse_unprunable(t) -> None:
    """One line, before anything is built, for a model without a network to prune."""
    if not getattr(t, "pruning", None):
        why = getattr(t, "no_pruning", None) or f"model {t.key!r} has no pruning support"
        raise ConfigError(f"prune=channels: {why}")


def helper(t, net):
    """The task's pruning helper for ``net`` (its trace input, held-out data, scores and
    recovery loop), or one line saying why this model cannot be pruned."""
    refuse_unprunable(t)
    return importlib.import_module(t.pruning).helper(t, net)


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
