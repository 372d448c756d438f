"""A MobileNetV3-style text recognizer: depthwise-separable blocks with HardSwish and
squeeze-excite, a bidirectional LSTM and a CTC head.

In: float32 images [N, 1, 32, W] in [-1, 1] (W divisible by 4). Out: logits [N, W/4, classes],
class 0 being the CTC blank: the same contract as ``ocr_net.CRNN``.
Why it exists: the op mix of mobile networks (depthwise convs, HardSwish/HardSigmoid, the
squeeze-excite's GlobalAveragePool and Mul) is where onnxruntime's default static quantization
loses to FP32 on a CPU, so it is the model the pipeline's latency-aware INT8 is judged on.

Layout: a stem conv (3x3, 16 channels, BN, HardSwish), then five inverted-residual blocks whose
output channels are ``widths``: pointwise expansion (1x1 conv, BN, HardSwish; skipped when the
ratio is 1), depthwise 3x3 conv (BN, HardSwish) with the block's stride, squeeze-excite
(GlobalAveragePool -> 1x1 conv -> ReLU -> 1x1 conv -> HardSigmoid -> Mul), pointwise projection
(1x1 conv, BN), a residual add when shapes allow. The strides play the role of CRNN's pools:
height 32 -> 2, width / 4; a (2, 1) conv then folds the height into channels as in CRNN.
"""
from __future__ import annotations

import torch
from torch import nn

from pipeline.models.ocr_net import NUM_CLASSES

DEFAULT_WIDTHS = (32, 48, 96, 128, 160)
# Depthwise stride of each block, (height, width): the same downsampling as CRNN's POOLS.
STRIDES = ((2, 2), (2, 2), (1, 1), (2, 1), (2, 1))
EXPAND = (2, 3, 3, 3, 3)   # expansion ratio of each block (hidden channels = ratio x input)
STEM = 16
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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gate(self.fc2(self.relu(self.fc1(global_average_pool(x)))))


def _conv_bn(c_in: int, c_out: int, k, stride=1, groups: int = 1, act: bool = True) -> list[nn.Module]:
    pad = (k[0] // 2, k[1] // 2) if isinstance(k, tuple) else k // 2
    layers = [nn.Conv2d(c_in, c_out, k, stride, pad, groups=groups, bias=False), nn.BatchNorm2d(c_out)]
    if act:
        layers.append(nn.Hardswish())
    return layers


class InvertedResidual(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: tuple[int, int], expand: int):
        super().__init__()
        mid = c_in * expand
        self.expand = nn.Sequential(*_conv_bn(c_in, mid, 1)) if expand != 1 else nn.Identity()
        self.dw = nn.Sequential(*_conv_bn(mid, mid, 3, stride, groups=mid))
        self.se = SqueezeExcite(mid)
        self.project = nn.Sequential(*_conv_bn(mid, c_out, 1, act=False))
        self.residual = stride == (1, 1) and c_in == c_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.project(self.se(self.dw(self.expand(x))))
        return x + y if self.residual else y


class MobileCRNN(nn.Module):
    def __init__(self, widths: tuple[int, ...] = DEFAULT_WIDTHS, hidden: int = LSTM_HIDDEN):
        super().__init__()
        if len(widths) != len(STRIDES):
            raise ValueError(f"widths={list(widths)}: expected {len(STRIDES)} block widths")
        self.stem = nn.Sequential(*_conv_bn(1, STEM, 3))
        blocks, c_in = [], STEM
        for c_out, stride, ratio in zip(widths, STRIDES, EXPAND):
            blocks.append(InvertedResidual(c_in, c_out, stride, ratio))
            c_in = c_out
        self.blocks = nn.Sequential(*blocks)
        # Height is 2 after the last block; a (2, 1) conv folds it into channels.
        self.collapse = nn.Sequential(nn.Conv2d(c_in, c_in, (2, 1), bias=False),
                                      nn.BatchNorm2d(c_in), nn.Hardswish())
        self.rnn = nn.LSTM(c_in, hidden, batch_first=True, bidirectional=True)
        self.head = nn.Linear(2 * hidden, NUM_CLASSES)
        self.widths = tuple(widths)
        self.hidden = hidden

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = self.collapse(self.blocks(self.stem(x)))  # [N, C, 1, T]
        f = f.squeeze(2).permute(0, 2, 1)             # [N, T, C]
        f, _ = self.rnn(f)
        return self.head(f)                            # [N, T, classes]
