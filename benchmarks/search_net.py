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
In the ``harmed`` blocks one weight of the first conv is made 60 times its row's largest: a
per-channel INT8 scale then rounds the rest of that row to a few levels, so that block costs
accuracy in INT8 and floating it gives the accuracy back, as a badly conditioned layer of a real
network does.
"""
from __future__ import annotations

from pathlib import Path

HARMED = (7, 23, 41)


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
                w = b.expand.weight  # [2c, c, 1, 1]
                w[0, 0] = 60 * w[0].abs().max()
    return net


def write_images(folder: Path, count: int, seed: int = 0) -> Path:
    """``count`` 32x32 PNGs in ``<folder>/<class>/``: a random 4x4 colour grid, smoothly
    upsampled, plus a little noise; each labelled with the float network's own class for it (as
    the pipeline will feed it: RGB, scaled to [-1, 1]), so FP32 scores 100 % and every point
    lost is lost to quantization. Smooth, varied images give every class some images."""
    import numpy as np
    import torch
    from PIL import Image

    rng = np.random.default_rng(seed)
    net = deep()
    for i in range(count):
        grid = rng.integers(0, 256, (4, 4, 3), dtype=np.uint8)
        img = np.asarray(Image.fromarray(grid).resize((32, 32), Image.BICUBIC), dtype=np.float32)
        img = np.clip(img + rng.normal(0, 8, img.shape), 0, 255).astype(np.uint8)
        x = (img.astype(np.float32).transpose(2, 0, 1)[None] / 255 - 0.5) / 0.5
        with torch.no_grad():
            label = int(net(torch.from_numpy(x)).argmax(1))
        (folder / str(label)).mkdir(parents=True, exist_ok=True)
        Image.fromarray(img).save(folder / str(label) / f"{i:05d}.png")
    return folder
