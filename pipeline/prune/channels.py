"""Structured channel pruning of a torch network with Torch-Pruning's dependency graph.

In: a network, an example input (a tensor, or a tuple of tensors for a network of several inputs)
and a ``PruneConfig`` (``ratio``, ``importance``, ``round_to``, ``ignored``). Out: the same network
with channels physically removed (smaller weight tensors, the layers' channel attributes updated),
each pruned layer's width before and after, and the pruning history (per pruned layer, the
channels removed: JSON) from which ``rebuild`` makes the same structure out of the unpruned
network, for networks whose constructor arguments cannot describe the pruned widths.
Torch-Pruning (``torch_pruning``) traces one forward pass and groups coupled layers: a conv's
output channels with the BatchNorm after it and the input channels of whatever consumes them (the
next conv, the LSTM). Each group's channels are ranked by the chosen importance and the lowest
``ratio`` of them removed, the kept count rounded down to a multiple of ``round_to`` so the int8
and float kernels see aligned widths. Checked before anything is removed: every name in
``ignored`` is a prunable layer, the trace reached every prunable layer, and no layer would lose
all of its channels. An LSTM's hidden units are pruned by our own handler (``LstmHidden``):
Torch-Pruning 1.6's slices the gate weights along the wrong axes and ignores that a bidirectional
output is two halves. Deliberately not handled: stacked LSTMs (``num_layers`` > 1), GRUs,
global ranking across layers, and iterative schedules.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from pipeline.core.errors import ConfigError, StageError

PRUNABLE = (nn.Conv2d, nn.Linear, nn.LSTM)  # the layer types that root a pruning group


def _lstm_handler():
    from torch_pruning.pruner.function import LSTMPruner

    class LstmHidden(LSTMPruner):
        """Hidden units of a one-layer LSTM, the same units in both directions. Its output is seen
        as 2 x hidden channels in two groups (forward, reverse), so Torch-Pruning ranks each unit
        by both halves together and removes unit i as channels i and hidden + i downstream."""

        def get_out_channels(self, layer):
            return layer.hidden_size * (2 if layer.bidirectional else 1)

        def get_out_channel_groups(self, layer):
            return 2 if layer.bidirectional else 1

        def prune_out_channels(self, layer: nn.LSTM, idxs) -> nn.Module:
            assert layer.num_layers == 1 and not layer.proj_size, "refused by plan()"
            h = layer.hidden_size
            drop = {int(i) % h for i in idxs}
            keep = torch.tensor([k for k in range(h) if k not in drop])
            rows = torch.cat([keep + g * h for g in range(4)])  # gates i, f, g, o: 4 blocks of h
            for sfx in ("_l0", "_l0_reverse") if layer.bidirectional else ("_l0",):
                for name, dim_keep in ((f"weight_ih{sfx}", ((0, rows),)),
                                       (f"weight_hh{sfx}", ((0, rows), (1, keep))),
                                       (f"bias_ih{sfx}", ((0, rows),)),
                                       (f"bias_hh{sfx}", ((0, rows),))):
                    if not hasattr(layer, name):  # bias=False
                        continue
                    w = getattr(layer, name).data
                    for dim, idx in dim_keep:
                        w = torch.index_select(w, dim, idx)
                    setattr(layer, name, nn.Parameter(w.contiguous()))
            layer.hidden_size = len(keep)
            return layer

    return LstmHidden()


@dataclass
class Plan:
    """What pruning will do, computed before anything is removed."""
    groups: list               # Torch-Pruning groups, each removing channels of one root layer
    widths: dict[str, list[int]]  # root layer name -> [channels before, after]
    graph: object = None       # their dependency graph: it records the history as they prune


def args(example) -> tuple:
    """The network's positional inputs: one tensor, or a tuple of them in input order."""
    return tuple(example) if isinstance(example, (tuple, list)) else (example,)


def shapes(example) -> str:
    return ", ".join(str(list(x.shape)) for x in args(example))


def prunable_layers(net: nn.Module) -> dict[str, nn.Module]:
    return {name: m for name, m in net.named_modules() if isinstance(m, PRUNABLE)}


def importance(kind: str):
    import torch_pruning as tp

    if kind == "l1":
        return tp.importance.MagnitudeImportance(p=1)
    if kind == "l2":
        return tp.importance.MagnitudeImportance(p=2)
    if kind == "bn_scale":  # |gamma| of the BatchNorm after each conv: how much a channel passes
        bn, l1 = tp.importance.BNScaleImportance(), tp.importance.MagnitudeImportance(p=1)

        def bn_scale_or_l1(group):  # a group without BatchNorm (the LSTM's) would be skipped
            imp = bn(group)
            return imp if imp is not None else l1(group)

        return bn_scale_or_l1
    raise ConfigError(f"prune.importance={kind!r}: valid choices: l1, l2, bn_scale")


def _ignored(net: nn.Module, names) -> list[nn.Module]:
    layers = prunable_layers(net)
    unknown = [n for n in names if n not in layers]
    if unknown:
        raise ConfigError(f"prune.ignored={list(names)}: no prunable layer named "
                          f"{', '.join(unknown)}; valid names: {', '.join(layers)}")
    return [layers[n] for n in names]


def plan(net: nn.Module, example: torch.Tensor, cfg) -> Plan:
    """Trace ``net`` and decide which channels go; raises before the network is touched."""
    import torch_pruning as tp

    ignored = _ignored(net, cfg.ignored)
    for name, m in prunable_layers(net).items():
        if isinstance(m, nn.LSTM) and m not in ignored and (m.num_layers != 1 or m.proj_size):
            raise ConfigError(f"prune.ignored={list(cfg.ignored)}: {name} is a stacked or "
                              "projected LSTM, whose hidden units this pruner cannot remove; add "
                              f"{name} to prune.ignored")
    net.eval()  # BatchNorm statistics must not move while tracing
    try:
        pruner = tp.pruner.BasePruner(net, example, importance=importance(cfg.importance.value),
                                      pruning_ratio=cfg.ratio, ignored_layers=ignored,
                                      round_to=cfg.round_to or None,
                                      customized_pruners={nn.LSTM: _lstm_handler()})
    except Exception as e:  # noqa: BLE001 - any tracing failure is reported with the network
        raise StageError(f"torch-pruning could not trace {type(net).__name__} on an input of "
                         f"shape {shapes(example)}: {type(e).__name__}: "
                         f"{str(e).strip().splitlines()[0] if str(e).strip() else ''}") from None
    names = {m: n for n, m in prunable_layers(net).items()}
    unreached = [n for m, n in names.items() if m not in pruner.DG.module2node]
    if unreached:
        raise StageError(f"torch-pruning's dependency graph did not reach {', '.join(unreached)} "
                         f"in {type(net).__name__} (called outside its module's forward?): their "
                         "channels cannot be pruned consistently")
    # Torch-Pruning silently skips a group it would empty; the arithmetic of its local ranking
    # is repeated here to refuse instead: per channel group (an LSTM direction) keep
    # int(C * (1 - ratio)), then round what is kept of the whole layer down to round_to.
    expected, emptied = {}, {}
    for group in pruner.DG.get_all_groups(ignored_layers=pruner.ignored_layers,
                                          root_module_types=pruner.root_module_types):
        root = group[0].dep.target.module
        total, parts = pruner.DG.get_out_channels(root), pruner._get_channel_groups(group)
        per = total // parts
        n = per - int(per * (1 - cfg.ratio))
        if n > 0 and cfg.round_to:
            n = pruner._round_to(n, total, cfg.round_to)
        kept = per - n
        if kept <= 0:
            emptied[names[root]] = f"{names[root]} ({per} -> {kept})"
        elif kept < per:
            expected[names[root]] = [per, kept]
    if emptied:
        raise ConfigError(f"prune.ratio={cfg.ratio} with prune.round_to={cfg.round_to} would "
                          "remove every channel of "
                          f"{', '.join(emptied[n] for n in names.values() if n in emptied)}; lower "
                          "prune.ratio or prune.round_to, or add them to prune.ignored")
    groups, found = [], {}
    for group in pruner.step(interactive=True):
        root = group[0].dep.target.module
        total, parts = pruner.DG.get_out_channels(root), pruner._get_channel_groups(group)
        groups.append(group)
        found[names[root]] = [total // parts, (total - len(group[0].idxs)) // parts]
    if found != expected:
        raise StageError(f"torch-pruning planned {found} where {expected} was expected "
                         "(a group it could not prune?)")
    return Plan(groups, {n: found[n] for n in names.values() if n in found},  # network order
                pruner.DG)


def apply(net: nn.Module, p: Plan, example: torch.Tensor) -> dict[str, list[int]]:
    """Remove the planned channels from ``net`` in place; returns {layer: [before, after]}.
    The pruned network is run once on ``example``: a shape that no longer fits fails here, with
    the layer named by torch, not later in the exporter."""
    for group in p.groups:
        group.prune()
    try:
        with torch.inference_mode():
            net(*args(example))
    except RuntimeError as e:
        raise StageError(f"the pruned {type(net).__name__} no longer runs: "
                         f"{str(e).splitlines()[0]}") from None
    return p.widths


def prune(net: nn.Module, example: torch.Tensor, cfg) -> dict[str, list[int]]:
    return apply(net, plan(net, example, cfg), example)


def history(p: Plan) -> list:
    """What ``apply`` removed, as JSON: [layer name, output channels?, [channel indices]] per
    group, in the order they were removed (Torch-Pruning's own pruning history)."""
    return [[name, bool(out), [int(getattr(i, "idx", i)) for i in idxs]]
            for name, out, idxs in p.graph.pruning_history()]


def rebuild(net: nn.Module, example, removed: list) -> nn.Module:
    """Remove from the unpruned ``net`` exactly the channels ``removed`` lists (``history``), so
    the pruned weights then load into it strictly; in place."""
    import torch_pruning as tp

    net.eval()
    graph = tp.DependencyGraph().build_dependency(net, args(example),
                                                  customized_pruners={nn.LSTM: _lstm_handler()})
    try:
        graph.load_pruning_history([[n, out, list(idxs)] for n, out, idxs in removed])
    except (AttributeError, IndexError, ValueError) as e:
        raise StageError(f"the pruning history does not fit {type(net).__name__}: "
                         f"{type(e).__name__}: {e}") from None
    return net


def output_layers(net: nn.Module, example) -> list[str]:
    """The prunable layers no other prunable layer consumes: their channels are the network's
    outputs (a classifier's classes), so pruning them would change what the network answers.
    Read off Torch-Pruning's dependency graph: the group of such a layer's output channels
    reaches no other layer's input channels."""
    import torch_pruning as tp

    net.eval()
    graph = tp.DependencyGraph().build_dependency(net, args(example),
                                                  customized_pruners={nn.LSTM: _lstm_handler()})
    names = {m: n for n, m in prunable_layers(net).items()}
    found = []
    for m, name in names.items():
        if m not in graph.module2node:
            continue
        pruner = graph.get_pruner_of_module(m)
        group = graph.get_pruning_group(m, pruner.prune_out_channels, [0])
        consumers = [dep.target.module for dep, _ in group
                     if dep.target.module is not m and dep.target.module in names
                     and graph.is_in_channel_pruning_fn(dep.handler)]
        if not consumers:
            found.append(name)
    return found
