"""Declarative image preprocessing: a PIL image becomes the float32 array a model expects, and a
list of them becomes one batch.

In: PIL images and an ``ImagePrep``. Out: arrays [C, H, W] (or [H, W, C]) per image and batches
[N, ...] padded to the widest image (edge values, width rounded up to ``pad_width_multiple``), so
text lines of different widths batch as a serving engine would batch them. Pillow does the
resizing; the rest is numpy. Not handled: crops and augmentation (inference only).
"""
from __future__ import annotations

import math

import numpy as np

from pipeline.data.spec import ImagePrep, Resize


def to_array(image, prep: ImagePrep) -> np.ndarray:
    """One image, channel-first (``nchw``) or channel-last (``nhwc``), without padding."""
    from PIL import Image

    img = image.convert("L" if prep.color == "grey" else "RGB")
    if prep.resize == Resize.fixed:
        img = img.resize((prep.width, prep.height), Image.BILINEAR)
    elif prep.resize == Resize.height:
        w = max(1, round(img.width * prep.height / img.height))
        img = img.resize((w, prep.height), Image.BILINEAR)
    a = np.asarray(img, dtype=np.float32) * np.float32(prep.scale)
    a = a[:, :, None] if a.ndim == 2 else a                    # H, W, C
    if prep.channel_order == "bgr" and a.shape[2] == 3:
        a = a[:, :, ::-1]
    if prep.mean:
        a = a - np.asarray(prep.mean, dtype=np.float32)
    if prep.std:
        a = a / np.asarray(prep.std, dtype=np.float32)
    a = np.ascontiguousarray(a)
    return a if prep.layout == "nhwc" else np.ascontiguousarray(a.transpose(2, 0, 1))


def collate(arrays: list[np.ndarray], prep: ImagePrep) -> np.ndarray:
    """Stack images into one batch, padding the width (edge values) to the widest image rounded up
    to ``pad_width_multiple``. Heights must agree: resize them, or the error names the sizes."""
    w_axis = 2 if prep.layout == "nchw" else 1
    h_axis = 1 if prep.layout == "nchw" else 0
    heights = {a.shape[h_axis] for a in arrays}
    if len(heights) > 1:
        raise ValueError(f"images of different heights {sorted(heights)} cannot share a batch; "
                         "set data.image.resize=height or fixed")
    widest = max(a.shape[w_axis] for a in arrays)
    target = math.ceil(widest / prep.pad_width_multiple) * prep.pad_width_multiple
    padded = []
    for a in arrays:
        pad = [(0, 0)] * a.ndim
        pad[w_axis] = (0, target - a.shape[w_axis])
        padded.append(np.pad(a, pad, mode="edge"))
    return np.stack(padded).astype(np.float32, copy=False)


def width(array: np.ndarray, prep: ImagePrep) -> int:
    """The dynamic axis a batch is bucketed by: the image's width after preprocessing."""
    return int(array.shape[2 if prep.layout == "nchw" else 1])
