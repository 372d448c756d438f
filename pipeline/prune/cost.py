"""Parameters and multiply-accumulates of a torch network, counted on one forward pass.

In: an ``nn.Module`` and an example input (a tensor, or a tuple of them). Out: the parameter count,
the MACs of that input (total and per layer name) for Conv, Linear and LSTM/GRU/RNN layers, the ops
that carry nearly all of the compute here. Forward hooks read each layer's real input and output
shapes, so pooling, strides and sequence lengths are what the network actually does. Counted
ourselves rather than with Torch-Pruning's op counter, whose recurrent-layer hook takes the batch
size from the wrong axis of a ``batch_first`` LSTM. Deliberately not counted: normalisation,
activations, pooling and element-wise ops (memory-bound, a few percent of the total), so this is a
lower bound.
"""
from __future__ import annotations

import math

import torch
from torch import nn

RECURRENT_GATES = {nn.LSTM: 4, nn.GRU: 3, nn.RNN: 1}


def parameters(net: nn.Module) -> int:
    return sum(p.numel() for p in net.parameters())


def _conv(m: nn.Conv2d, out: torch.Tensor) -> int:
    return out.numel() * (m.in_channels // m.groups) * math.prod(m.kernel_size)


def _linear(m: nn.Linear, out: torch.Tensor) -> int:
    return out.numel() * m.in_features


def _recurrent(m: nn.RNNBase, inp: torch.Tensor) -> int:
    gates = RECURRENT_GATES[type(m)]
    steps = inp.numel() // inp.shape[-1]  # batch x time, whichever axis holds which
    h, dirs = m.hidden_size, 2 if m.bidirectional else 1
    macs = 0
    for layer in range(m.num_layers):
        width_in = m.input_size if layer == 0 else h * dirs
        macs += dirs * steps * gates * h * (width_in + h)
    return macs


def macs(net: nn.Module, example: torch.Tensor) -> dict:
    """{"total": MACs of one forward pass on ``example``, "layers": {name: MACs}}."""
    per_layer: dict[str, int] = {}
    hooks = []

    def hook(name):
        def record(m, inputs, output):
            if isinstance(m, nn.Conv2d):
                n = _conv(m, output)
            elif isinstance(m, nn.Linear):
                n = _linear(m, output)
            else:
                n = _recurrent(m, inputs[0])
            per_layer[name] = per_layer.get(name, 0) + n
        return record

    for name, m in net.named_modules():
        if isinstance(m, (nn.Conv2d, nn.Linear, *RECURRENT_GATES)):
            hooks.append(m.register_forward_hook(hook(name)))
    was_training = net.training
    try:
        net.eval()
        with torch.inference_mode():
            net(*(example if isinstance(example, tuple) else (example,)))
    finally:
        for h in hooks:
            h.remove()
        net.train(was_training)
    return {"total": sum(per_layer.values()), "layers": per_layer}
