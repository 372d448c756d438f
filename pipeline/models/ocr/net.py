"""The CRNN text recognizer: convolution blocks, a bidirectional LSTM and a CTC head.

In: float32 images [N, 1, 32, W] in [-1, 1] (W divisible by 4). Out: logits [N, W/4, classes],
class 0 being the CTC blank. Sized like a production line recognizer (1.5 M parameters):
the convolutions carry nearly all of the compute, which is what INT8 accelerates; the LSTM is
kept narrow because static INT8 in ONNX Runtime leaves it in float.
``widths`` makes the channel counts explicit so a pruned network can be rebuilt from its
safetensors file plus this list, without pickles: five conv blocks, and optionally a sixth entry
for the height-collapsing conv, whose output a pruner may narrow independently (default: the
fifth block's width).
"""
from __future__ import annotations

import torch
from torch import nn

from pipeline.models.ocr.data import ALPHABET

NUM_CLASSES = len(ALPHABET) + 1  # + CTC blank at index 0
DEFAULT_WIDTHS = (32, 64, 128, 256, 256)
# Pooling after each conv block, (height, width). Height 32 -> 2, width / 4.
POOLS = ((2, 2), (2, 2), None, (2, 1), (2, 1))
LSTM_HIDDEN = 128


class CRNN(nn.Module):
    def __init__(self, widths: tuple[int, ...] = DEFAULT_WIDTHS, hidden: int = LSTM_HIDDEN):
        super().__init__()
        layers: list[nn.Module] = []
        c_in = 1
        if len(widths) not in (len(POOLS), len(POOLS) + 1):
            raise ValueError(f"widths={list(widths)}: expected {len(POOLS)} conv widths, plus "
                             "optionally the collapse conv's")
        for c_out, pool in zip(widths, POOLS):
            layers += [nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out),
                       nn.ReLU(inplace=True)]
            if pool is not None:
                layers.append(nn.MaxPool2d(pool, pool))
            c_in = c_out
        self.cnn = nn.Sequential(*layers)
        # Height is 2 after the last pool; a (2, 1) conv folds it into channels, which keeps
        # the vertical layout information a mean over height would throw away.
        c_out = widths[len(POOLS)] if len(widths) > len(POOLS) else c_in
        self.collapse = nn.Sequential(nn.Conv2d(c_in, c_out, (2, 1), bias=False),
                                      nn.BatchNorm2d(c_out), nn.ReLU(inplace=True))
        self.rnn = nn.LSTM(c_out, hidden, batch_first=True, bidirectional=True)
        self.head = nn.Linear(2 * hidden, NUM_CLASSES)
        self.widths = tuple(widths)
        self.hidden = hidden

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = self.collapse(self.cnn(x))          # [N, C, 1, T]
        f = f.squeeze(2).permute(0, 2, 1)       # [N, T, C]
        f, _ = self.rnn(f)
        return self.head(f)                      # [N, T, classes]
