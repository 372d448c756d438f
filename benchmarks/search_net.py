"""The network of ``make bench``'s ``search`` section: deep enough that ranking node by node is
slow (over 250 INT8 nodes), with a few layers INT8 really hurts.

In: a depth, a width, the blocks to harm and a seed. Out: a ``torch.nn.Module`` (``deep``, a
``model=torch`` factory: ``model.factory=benchmarks.search_net:deep``) and a folder of images for
it (``write_images``: smooth random colour images, saved as PNG in one folder per class, labelled
by the float network itself, so no training is needed: ``metric=classification`` then measures
exactly what quantization costs).

The network: a strided stem, then ``depth`` residual blocks (1x1 conv, ReLU, depthwise 3x3, ReLU,
1x1 conv, add), a 4x4 average pool, a LayerNorm and a 10-class linear head: four INT8 nodes per block. Its
weights are a seeded initialisation, scaled so that activations stay in range through the depth.
In the ``harmed`` blocks one expanded channel is made ``OUTLIER`` times larger and the project
conv ignores it, as an outlier channel of a real network's activations: a per-tensor INT8 range
then rounds the block's other channels to a few levels, so that block costs accuracy in INT8
and floating it (its three convs) gives the accuracy back, while the residual stream keeps its
range. (An earlier version put a large weight in the first conv's row instead: the outlier then
reached the residual stream, every Add after it rounded the stream coarsely, and no mix short of
floating almost every node met the budget: 97.3 % with all 258 reported nodes float.)
"""
from __future__ import annotations

from pathlib import Path

HARMED = (7, 23, 41)
OUTLIER = 200.0  # the harmed blocks' outlier channel, times the rest
LOUD = 80.0      # how much stronger the harmed blocks' output is than a plain block's
MARGIN = 0.05    # least (top1 - top2) / (top1 - last) of the float logits an image is kept with


def deep(depth: int = 64, width: int = 16, harmed: list[int] | None = None, seed: int = 0):
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self, c: int):
            super().__init__()
            self.expand = nn.Conv2d(c, 2 * c, 1)
            self.act1 = nn.ReLU()
            self.dw = nn.Conv2d(2 * c, 2 * c, 3, padding=1, groups=2 * c)
            self.act2 = nn.ReLU()
            self.project = nn.Conv2d(2 * c, c, 1)

        def forward(self, x):
            return x + self.project(self.act2(self.dw(self.act1(self.expand(x)))))

    class Deep(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, width, 3, stride=2, padding=1)
            self.blocks = nn.Sequential(*[Block(width) for _ in range(depth)])
            self.pool = nn.AdaptiveAvgPool2d(4)
            self.norm = nn.LayerNorm(16 * width, elementwise_affine=False)
            self.head = nn.Linear(16 * width, 10, bias=False)

        def forward(self, image):
            f = self.pool(self.blocks(self.stem(image)))
            return self.head(self.norm(torch.flatten(f, 1)))

    torch.manual_seed(seed)
    net = Deep().eval()
    with torch.no_grad():
        for m in net.modules():  # no biases: the outputs follow the image, not a constant
            if isinstance(m, nn.Conv2d):
                m.bias.zero_()
        for k, b in enumerate(net.blocks):
            b.project.weight.mul_(0.3 / depth ** 0.5)  # the residual sum stays in range
            if k in (HARMED if harmed is None else harmed):
                # One expanded channel OUTLIER times larger than the rest, which the project
                # conv then ignores: the float block computes what it did, but the tensors
                # inside it get a per-tensor INT8 range that rounds every other channel to a
                # few levels. The block's output (its project, made LOUD times stronger so that
                # the error shows in the labels) goes wrong in INT8 and is right again with
                # the block float; the residual stream keeps its range, so the rest is not hurt.
                b.expand.weight[0].mul_(OUTLIER)
                b.project.weight[:, 0] = 0
                b.project.weight.mul_(LOUD)
    return net


def write_images(folder: Path, count: int, seed: int = 0) -> Path:
    """``count`` 32x32 PNGs in ``<folder>/<class>/``: a random 4x4 colour grid, smoothly
    upsampled, plus a little noise; each labelled with the float network's own class for it (as
    the pipeline will feed it: RGB, scaled to [-1, 1]), so FP32 scores 100 % and every point
    lost is lost to quantization. Only images the float network classifies with a relative
    margin of ``MARGIN`` are kept: on the rest (about a fifth) the rounding of any INT8 layer
    flips the label, which no choice of float blocks could give back; on those kept, only the
    harmed blocks do (measured with onnxruntime's quantize_static, 512 of them: 93.4 % all-INT8,
    100 % with the harmed blocks' convs float, 98.6 % with two of the three)."""
    import numpy as np
    import torch
    from PIL import Image

    rng = np.random.default_rng(seed)
    net = deep()
    kept = tried = 0
    while kept < count:  # in batches of 64: one image at a time took 4 minutes on 2 cores
        imgs = []
        for _ in range(64):
            grid = rng.integers(0, 256, (4, 4, 3), dtype=np.uint8)
            img = np.asarray(Image.fromarray(grid).resize((32, 32), Image.BICUBIC), dtype=np.float32)
            imgs.append(np.clip(img + rng.normal(0, 8, img.shape), 0, 255).astype(np.uint8))
        x = (np.stack(imgs).astype(np.float32).transpose(0, 3, 1, 2) / 255 - 0.5) / 0.5
        with torch.no_grad():
            logits = net(torch.from_numpy(x))
        top = torch.sort(logits, 1, descending=True).values
        for img, row, t in zip(imgs, logits, top):
            tried += 1
            if kept == count or (t[0] - t[1]) < MARGIN * (t[0] - t[-1]):
                continue
            label = int(row.argmax())
            (folder / str(label)).mkdir(parents=True, exist_ok=True)
            Image.fromarray(img).save(folder / str(label) / f"{tried:05d}.png")
            kept += 1
    return folder
