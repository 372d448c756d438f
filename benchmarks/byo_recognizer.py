"""The text recognizer of ``make bench``'s ``byo`` section: a model "another team trained", built
here only so that the pipeline can be handed its ONNX file and character set and nothing else.

In: a seed, a step count and a folder. Out: ``recognizer.onnx`` (opset 12, input ``image``
[batch, 3, 48, width], output ``logits`` [batch, time, 37] with class 0 the CTC blank),
``charset.txt`` (the 36 characters on one line), and a JSON card (steps, seconds, held-out
accuracy). ``write_lines`` writes a labelled data set as the pipeline reads it (``data=labels_file``:
a folder of PNGs plus ``labels.jsonl``).

The lines are the OCR task's synthetic ones (``pipeline.models.ocr.data``: Pillow's built-in font,
nothing downloaded), tinted to colour and saved at their rendered size; the network sees them
through the pipeline's own declarative preprocessing (``PREP``: resize to 48 pixels high keeping
the aspect, scale to [-1, 1], width padded to a multiple of 8), so training and the pipeline feed
it the same pixels. The network is a PP-OCR-style mobile recognizer without a recurrent neck:
a strided 3x3 stem, depthwise-separable blocks (a depthwise conv, then a pointwise one), HardSwish
in the later blocks, squeeze-excite (GlobalAveragePool -> 1x1 -> ReLU -> 1x1 -> HardSigmoid ->
Mul) in the low-resolution ones, a (3, 1) conv that folds the height, a 1x1 CTC head. Height
48 -> 1, width / 4. Exported with torch's legacy exporter at opset 12, as older deployment
exports are (HardSwish has no ONNX op before 14: it becomes ``x * HardSigmoid(x)``).
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from pipeline.config.data import ImagePrep
from pipeline.models.ocr.data import ALPHABET, render_line

HEIGHT, CHANNELS, OPSET = 48, 3, 12
PREP = ImagePrep(color="rgb", resize="height", height=HEIGHT, pad_width_multiple=8,
                 mean=[0.5, 0.5, 0.5], std=[0.5, 0.5, 0.5])
# What the pipeline is told about the data, matching PREP (the README of a real model would say).
DATA_ARGS = ["data=labels_file", "data.image.resize=height", f"data.image.height={HEIGHT}",
             "data.image.pad_width_multiple=8", "data.image.mean=[0.5,0.5,0.5]",
             "data.image.std=[0.5,0.5,0.5]"]
TRAIN_SEED, DATA_SEED = 3000, 3001  # the training stream and the bench's data never meet
# (out channels, depthwise kernel, stride (h, w), HardSwish, squeeze-excite) per block
BLOCKS = ((32, 3, (2, 2), False, False), (48, 3, (2, 1), False, False),
          (64, 5, (2, 1), True, True), (96, 5, (1, 1), True, True), (96, 5, (1, 1), True, True))
STEM = 16
VERSION = 1  # of the network, data and training above: a build of another version is redone


def line(rng: np.random.Generator):
    """One coloured text line (PIL RGB image at its rendered size) and its label."""
    from PIL import Image

    grey, text = render_line(rng)
    # A per-channel affine tint keeps the grey line's contrast pattern in each channel.
    gain = rng.uniform(0.55, 1.0, size=3)
    offset = rng.uniform(0, 255 * (1 - gain))
    rgb = grey[:, :, None].astype(np.float32) * gain + offset
    return Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8), "RGB"), text


def write_lines(folder: Path, count: int, seed: int = DATA_SEED) -> Path:
    """``folder/<n>.png`` and ``folder/labels.jsonl`` (``file``, ``label``); returns the labels."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for n in range(count):
        img, text = line(np.random.default_rng([seed, n]))
        img.save(folder / f"{n}.png")
        rows.append(json.dumps({"file": f"{n}.png", "label": text}))
    labels = folder / "labels.jsonl"
    labels.write_text("\n".join(rows) + "\n")
    return labels


def network():
    import torch
    from torch import nn

    def conv_bn(c_in, c_out, k, stride=1, groups=1, act=None):
        k = k if isinstance(k, tuple) else (k, k)
        layers = [nn.Conv2d(c_in, c_out, k, stride, (k[0] // 2, k[1] // 2), groups=groups,
                            bias=False), nn.BatchNorm2d(c_out)]
        if act:
            layers.append(nn.Hardswish() if act == "hs" else nn.ReLU())
        return layers

    class SqueezeExcite(nn.Module):
        def __init__(self, c):
            super().__init__()
            s = max(8, c // 4)
            self.branch = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(c, s, 1), nn.ReLU(),
                                        nn.Conv2d(s, c, 1), nn.Hardsigmoid())

        def forward(self, x):
            return x * self.branch(x)

    class Block(nn.Module):
        """Depthwise-separable: depthwise k x k (strided), optional squeeze-excite, pointwise."""

        def __init__(self, c_in, c_out, k, stride, hs, se):
            super().__init__()
            act = "hs" if hs else "relu"
            self.dw = nn.Sequential(*conv_bn(c_in, c_in, k, stride, groups=c_in, act=act))
            self.se = SqueezeExcite(c_in) if se else nn.Identity()
            self.pw = nn.Sequential(*conv_bn(c_in, c_out, 1, act=act))
            self.residual = stride == (1, 1) and c_in == c_out

        def forward(self, x):
            y = self.pw(self.se(self.dw(x)))
            return x + y if self.residual else y

    class Recognizer(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(*conv_bn(CHANNELS, STEM, 3, 2, act="relu"))  # 24 x W/2
            blocks, c = [], STEM
            for c_out, k, stride, hs, se in BLOCKS:  # height 24 -> 3, width W/2 -> W/4
                blocks.append(Block(c, c_out, k, stride, hs, se))
                c = c_out
            self.blocks = nn.Sequential(*blocks)
            self.fold = nn.Sequential(nn.Conv2d(c, 128, (HEIGHT // 16, 1), bias=False),
                                      nn.BatchNorm2d(128), nn.Hardswish())  # height 3 -> 1
            self.head = nn.Conv2d(128, len(ALPHABET) + 1, 1)

        def forward(self, x):
            y = self.head(self.fold(self.blocks(self.stem(x))))  # [N, classes, 1, T]
            return y.squeeze(2).permute(0, 2, 1)                  # [N, T, classes]

    torch.manual_seed(0)
    return Recognizer()


def _batch(samples, multiple: int = 32):
    """Training batches through the pipeline's own preprocessing, padded wider (fewer shapes)."""
    import torch

    from pipeline.data.images import collate, to_array

    prep = ImagePrep(**{**PREP.__dict__, "pad_width_multiple": multiple})
    x = collate([to_array(img, prep) for img, _ in samples], prep)
    flat = [ALPHABET.index(c) + 1 for _, t in samples for c in t]
    return (torch.from_numpy(x), torch.tensor(flat, dtype=torch.long),
            torch.tensor([len(t) for _, t in samples], dtype=torch.long))


def decode(logits) -> list[str]:
    from pipeline.metrics.ctc import greedy_decode

    return greedy_decode(np.asarray(logits), list(ALPHABET))


def train(steps: int, batch_size: int = 24, lr: float = 4e-3, seed: int = TRAIN_SEED,
          pool: int = 6000, log=print):
    """AdamW with a one-cycle schedule and CTC loss on a pool of generated lines."""
    import torch

    net = network()
    lines = [line(np.random.default_rng([seed, n])) for n in range(pool)]
    opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.1)
    ctc = torch.nn.CTCLoss(blank=0, zero_infinity=True)
    rng = np.random.default_rng(seed)
    net.train()
    t0 = time.time()
    for step in range(1, steps + 1):
        x, tgt, tgt_len = _batch([lines[i] for i in rng.integers(0, pool, batch_size)])
        logp = net(x).log_softmax(-1).permute(1, 0, 2)  # CTC wants [T, N, C]
        loss = ctc(logp, tgt, torch.full((x.shape[0],), logp.shape[0], dtype=torch.long), tgt_len)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 5.0)
        opt.step()
        sched.step()
        if step % 100 == 0 or step == steps:
            log(f"byo recognizer: step {step}/{steps} loss {loss.item():.3f} "
                f"({step / (time.time() - t0):.1f} steps/s)")
    return net.eval(), time.time() - t0


def held_out(net, count: int = 300, seed: int = DATA_SEED + 1) -> dict:
    import torch

    from pipeline.metrics.ctc import score

    samples = [line(np.random.default_rng([seed, n])) for n in range(count)]
    preds = []
    with torch.inference_mode():
        for k in range(0, count, 32):
            x, _, _ = _batch(samples[k:k + 32], 8)
            preds += decode(net(x).numpy())
    return score(preds, [t for _, t in samples])


def build(folder: Path, steps: int = 1500, threads: int | None = None) -> dict:
    """Train, export to ONNX at opset 12, write the character set; returns the card. Reuses a
    build of the same ``VERSION`` and steps found in ``folder``."""
    import torch

    card_path = folder / "card.json"
    if card_path.exists():
        card = json.loads(card_path.read_text())
        if card.get("version") == VERSION and card.get("steps") == steps and \
                (folder / "recognizer.onnx").exists():
            return {**card, "reused": True}
    folder.mkdir(parents=True, exist_ok=True)
    if threads:
        torch.set_num_threads(threads)
    net, seconds = train(steps)
    onnx_path = folder / "recognizer.onnx"
    torch.onnx.export(net, (torch.zeros(1, CHANNELS, HEIGHT, 160),), str(onnx_path),
                      dynamo=False, opset_version=OPSET, input_names=["image"],
                      output_names=["logits"],
                      dynamic_axes={"image": {0: "batch", 3: "width"},
                                    "logits": {0: "batch", 1: "time"}})
    (folder / "charset.txt").write_text(ALPHABET + "\n")
    card = {"version": VERSION, "steps": steps, "train_seconds": round(seconds, 1),
            "threads": torch.get_num_threads(), "opset": OPSET,
            "parameters": sum(p.numel() for p in net.parameters()),
            "held_out_torch": held_out(net), "reused": False}
    card_path.write_text(json.dumps(card, indent=2))
    return card


if __name__ == "__main__":  # python -m benchmarks.byo_recognizer <folder> [steps]
    import sys

    print(json.dumps(build(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 1500),
                     indent=2))
