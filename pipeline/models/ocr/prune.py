"""What the ``prune`` stage needs to know about the OCR CRNN: its widths, data and recovery.

In: a (pruned) ``CRNN``. Out: the per-layer widths and hidden size that rebuild it from its
safetensors file (``ocr.build_network``), a held-out sample and its scores, and a recovery
fine-tune on freshly generated lines through the training loop of ``ocr_train`` (``fit``).
Every line comes from the generator with a fixed seed: the held-out sample from seed 3 (no other
set uses it), the recovery stream from ``RECOVER_SEED + seed`` (training uses 1000+), so the same
seed gives the same weights on the same torch build and thread count. Deliberately not handled:
early stopping or validation during recovery (a fixed step count keeps the time predictable).
"""
from __future__ import annotations

import sys

import torch

from pipeline.models.ocr.data import generate
from pipeline.models.ocr.net import POOLS, CRNN
from pipeline.models.ocr.train import batches, evaluate_samples, fit

HELD_OUT_SEED = 3       # calibration 1, evaluation 2, training 1000+: this sample meets none
RECOVER_SEED = 2000     # recovery lines: a stream the checkpoint was never trained on
TRACE_INPUT = (2, 1, 32, 128)  # [N, C, H, W] the dependency graph and MAC counts use
MAC_INPUT = "one line of width 128"  # what the MAC counts are per (the trace input, batch 1)
rebuild_by_history = False  # the params (widths, hidden) rebuild the pruned CRNN


def helper(task, net):
    """The prune stage's helper: this module (its data are generated, not the task's)."""
    return sys.modules[__name__]


def held_out_what(count: int) -> str:
    return f"{count} generated lines (seed {HELD_OUT_SEED})"


def example() -> torch.Tensor:
    return torch.zeros(TRACE_INPUT)


def widths_of(net: CRNN) -> tuple[list[int], int]:
    """(conv widths including the collapse conv, LSTM hidden size), as ``CRNN`` takes them."""
    convs = [m for m in net.cnn if isinstance(m, torch.nn.Conv2d)]
    assert len(convs) == len(POOLS), "not the CRNN layout"
    return [c.out_channels for c in convs] + [net.collapse[0].out_channels], net.rnn.hidden_size


def params_of(net: CRNN) -> dict:
    """The params ``ocr.build_network`` rebuilds the (pruned) network from."""
    widths, hidden = widths_of(net)
    return {"widths": widths, "hidden": hidden}


def held_out(count: int) -> list[dict]:
    return list(generate(HELD_OUT_SEED, count))


def score(net: CRNN, samples: list[dict]) -> dict[str, float]:
    metrics = evaluate_samples(net, samples)
    net.eval()
    return metrics


def recover(net: CRNN, steps: int, lr: float, batch_size: int, seed: int,
            on_step=None, bf16: bool | None = None) -> float | None:
    """Fine-tune in place on ``steps`` fresh batches; returns the last loss (0 steps: None).
    ``bf16=None``: the precision from the CPU's flags, as in training."""
    if steps == 0:
        return None
    torch.manual_seed(seed)
    return fit(net, batches(RECOVER_SEED + seed, batch_size), steps, lr, bf16, on_step=on_step)
