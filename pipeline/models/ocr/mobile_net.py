"""A MobileNetV3-style text recognizer: depthwise-separable blocks with HardSwish and
squeeze-excite, a bidirectional LSTM and a CTC head.

In: float32 images [N, 1, 32, W] in [-1, 1] (W divisible by 4). Out: logits [N, W/4, classes],
class 0 being the CTC blank: the same contract as ``ocr_net.CRNN``.
Why it exists: the op mix of mobile networks (depthwise convs, HardSwish/HardSigmoid, the
squeeze-excite's GlobalAveragePool and Mul) is where onnxruntime's default static quantization
loses to FP32 on a CPU, so it is the model the pipeline's latency-aware INT8 is judged on.

Layout: a stem conv (3x3, 32 channels, BN, ReLU), then five inverted-residual blocks whose
output channels are ``widths``: pointwise expansion (1x1 conv, BN, activation), depthwise 3x3
conv (BN, activation) followed by the block's max-pool, squeeze-excite (GlobalAveragePool -> 1x1
conv -> ReLU -> 1x1 conv -> HardSigmoid -> Mul) in the last three blocks, pointwise projection
(1x1 conv, BN, no activation), a residual add when shapes allow. The pools are CRNN's: height
32 -> 2, width / 4; a (2, 1) conv then folds the height into channels as in CRNN. The
activation is HardSwish in the last three blocks and ReLU before them, as in MobileNetV3: with
HardSwish everywhere, CTC training stayed on its loss plateau (3.8 after 1,000 steps; the CRNN
itself, given HardSwish instead of ReLU, did too), and with ReLU early it left it after ~300.
"""
from __future__ import annotations

import torch
from torch import nn

from pipeline.models.ocr.net import NUM_CLASSES

DEFAULT_WIDTHS = (32, 48, 96, 128, 160)
# Max-pool after each block's depthwise conv, (height, width): CRNN's POOLS.
STRIDES = ((2, 2), (2, 2), (1, 1), (2, 1), (2, 1))
EXPAND = (2, 3, 3, 3, 3)   # expansion ratio of each block (hidden channels = ratio x input)
STEM = 32
SE = (False, False, True, True, True)          # squeeze-excite in the low-resolution blocks
HARD_SWISH = (False, False, True, True, True)  # HardSwish there too, ReLU before (MobileNetV3)
LSTM_HIDDEN = 96


def global_average_pool(x: torch.Tensor) -> torch.Tensor:
    """Mean over height and width, [N, C, 1, 1]. Exported as ONNX ``GlobalAveragePool``, as
    MobileNets are usually deployed (and what onnxruntime's quantizer knows): torch's dynamo
    exporter would otherwise decompose it into a ``ReduceMean``."""
    if torch.onnx.is_in_onnx_export():
        return torch.onnx.ops.symbolic("::GlobalAveragePool", (x,), dtype=x.dtype,
                                       shape=(x.shape[0], x.shape[1], 1, 1), version=1)
    return x.mean((2, 3), keepdim=True)


def _squeezed(c: int) -> int:
    return max(8, (c // 4 + 7) // 8 * 8)


class SqueezeExcite(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        s = _squeezed(c)
        self.fc1 = nn.Conv2d(c, s, 1)
        self.relu = nn.ReLU()
        self.fc2 = nn.Conv2d(s, c, 1)
        self.gate = nn.Hardsigmoid()
        # The gate starts as a constant 0.5 (zero-initialised last layer of the branch), so
        # the untrained squeeze-excite does not scale channels at random per line.
        nn.init.zeros_(self.fc2.weight)
        nn.init.zeros_(self.fc2.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gate(self.fc2(self.relu(self.fc1(global_average_pool(x)))))


def _conv_bn(c_in: int, c_out: int, k, stride=1, groups: int = 1, act: str | None = "hs") -> list[nn.Module]:
    pad = (k[0] // 2, k[1] // 2) if isinstance(k, tuple) else k // 2
    layers = [nn.Conv2d(c_in, c_out, k, stride, pad, groups=groups, bias=False), nn.BatchNorm2d(c_out)]
    if act:
        layers.append(nn.Hardswish() if act == "hs" else nn.ReLU())
    return layers


class InvertedResidual(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: tuple[int, int], expand: int, se: bool = True,
                 hard_swish: bool = True):
        super().__init__()
        mid, act = c_in * expand, "hs" if hard_swish else "relu"
        self.expand = nn.Sequential(*_conv_bn(c_in, mid, 1, act=act)) if expand != 1 else nn.Identity()
        dw = _conv_bn(mid, mid, 3, 1, groups=mid, act=act)
        if stride != (1, 1):  # downsampled as CRNN does, by max-pooling
            dw.append(nn.MaxPool2d(stride, stride))
        self.dw = nn.Sequential(*dw)
        self.se = SqueezeExcite(mid) if se else nn.Identity()
        self.project = nn.Sequential(*_conv_bn(mid, c_out, 1, act=None))
        self.residual = stride == (1, 1) and c_in == c_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.project(self.se(self.dw(self.expand(x))))
        return x + y if self.residual else y


class MobileCRNN(nn.Module):
    def __init__(self, widths: tuple[int, ...] = DEFAULT_WIDTHS, hidden: int = LSTM_HIDDEN):
        super().__init__()
        if len(widths) != len(STRIDES):
            raise ValueError(f"widths={list(widths)}: expected {len(STRIDES)} block widths")
        self.stem = nn.Sequential(*_conv_bn(1, STEM, 3, act="relu"))
        blocks, c_in = [], STEM
        for c_out, stride, ratio, se, hs in zip(widths, STRIDES, EXPAND, SE, HARD_SWISH):
            blocks.append(InvertedResidual(c_in, c_out, stride, ratio, se, hs))
            c_in = c_out
        self.blocks = nn.Sequential(*blocks)
        # Height is 2 after the last block; a (2, 1) conv folds it into channels.
        self.collapse = nn.Sequential(nn.Conv2d(c_in, c_in, (2, 1), bias=False),
                                      nn.BatchNorm2d(c_in), nn.ReLU())
        self.rnn = nn.LSTM(c_in, hidden, batch_first=True, bidirectional=True)
        self.head = nn.Linear(2 * hidden, NUM_CLASSES)
        self.widths = tuple(widths)
        self.hidden = hidden

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = self.collapse(self.blocks(self.stem(x)))  # [N, C, 1, T]
        f = f.squeeze(2).permute(0, 2, 1)             # [N, T, C]
        f, _ = self.rnn(f)
        return self.head(f)                            # [N, T, classes]
