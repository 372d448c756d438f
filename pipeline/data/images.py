"""Declarative image preprocessing: a PIL image becomes the float32 array a model expects, and a
list of them becomes one batch.

In: PIL images and an ``ImagePrep``. Out: arrays [C, H, W] (or [H, W, C]) per image and batches
[N, ...] padded to the widest image (width rounded up to ``pad_width_multiple``; edge values or a
constant, in pixel or normalized units), so text lines of different widths batch as a serving
engine would batch them. Every step a model's own inference code may do differently is a knob
(``ImagePrep``): when colour is converted, PIL's resampling filter, how the scaled width is
rounded, a width cap, and which library resizes: Pillow, or OpenCV where the model's own code
calls ``cv2.resize``; the rest is numpy. Not handled: crops and augmentation (inference only).
"""
from __future__ import annotations

import io
import math
import warnings
from pathlib import Path

import numpy as np

from pipeline.config.data import OPENCV_FILTERS, ImagePrep, Resize
from pipeline.core.errors import StageError

# The most pixels an image's header may claim: checked before it is decoded. 40 MP holds a 24 MP
# camera photo and an 8K frame (33 MP); decoded RGB it is 120 MB. PIL's own limit comes too late
# and too high: it warns from 89 MP, refuses only from 179 MP, and a 10000x10000 header it lets
# through grows the process to 3.7 GB before anything can refuse it. Every caller that decodes an
# image it was handed (the data loader here, a server) uses this one value.
MAX_PIXELS = 40_000_000
# past MAX_PIXELS the image is refused in one line anyway: PIL's warning for 89-179 MP would only
# add a second line to it
try:
    from PIL import Image as _PIL
    warnings.filterwarnings("ignore", category=_PIL.DecompressionBombWarning)
except ImportError:  # pragma: no cover - Pillow is a dependency
    pass


class ImageTooLarge(StageError):
    """An image whose header claims more than ``max_pixels`` pixels; nothing was decoded."""


def open_checked(source: str | Path | bytes, max_pixels: int = MAX_PIXELS,
                 name: str | None = None):
    """The image in ``source`` (a path or the file's bytes), decoded and turned upright by its
    EXIF orientation (as ``datasets`` decodes one), as a ``PIL.Image``. Its
    header is read first (``Image.open`` decodes nothing) and an image claiming more than
    ``max_pixels`` pixels is refused before a byte of it is decoded (``ImageTooLarge``); a file
    that is not a whole image is one ``StageError`` line. ``name`` names it in the line
    (default: the path, or "an image" for bytes)."""
    from PIL import Image

    what = name or (str(source) if isinstance(source, (str, Path)) else "an image")
    try:
        img = Image.open(io.BytesIO(source) if isinstance(source, (bytes, bytearray))
                         else source)
    except Image.DecompressionBombError as e:  # past PIL's own ceiling (179 MP): say the same
        import re

        n = re.search(r"\((\d+) pixels\)", str(e))
        claims = f"{int(n.group(1)):,} pixels" if n else "more pixels than PIL opens"
        raise ImageTooLarge(f"{what}: its header claims {claims}, more than {max_pixels:,} "
                            "(pipeline.data.images.MAX_PIXELS); nothing was decoded") from None
    except (OSError, SyntaxError, ValueError) as e:  # what Pillow raises for a bad file
        raise StageError(f"{what}: cannot be read as an image ({e or type(e).__name__})") from None
    w, h = img.size
    if w * h > max_pixels:
        img.close()
        raise ImageTooLarge(f"{what}: its header claims {w}x{h} = {w * h:,} pixels, more than "
                            f"{max_pixels:,} (pipeline.data.images.MAX_PIXELS); nothing was "
                            "decoded")
    try:
        img.load()
        # turned upright by its EXIF orientation, as datasets' own decoding does
        if img.getexif().get(Image.ExifTags.Base.Orientation) is not None:
            from PIL import ImageOps

            img = ImageOps.exif_transpose(img)
    except (OSError, SyntaxError, ValueError) as e:
        raise StageError(f"{what}: cannot be read as an image ({e or type(e).__name__})") from None
    return img


def to_array(image, prep: ImagePrep) -> np.ndarray:
    """One image, channel-first (``nchw``) or channel-last (``nhwc``), without padding."""
    mode = "L" if prep.color == "grey" else "RGB"
    img = image.convert(mode) if prep.convert == "before_resize" else image
    if prep.resize == Resize.fixed:
        img = _resize(img, (prep.width, prep.height), prep)
    elif prep.resize == Resize.letterbox:
        img = _letterbox(img, prep)
    elif prep.resize == Resize.height:
        exact = img.width * prep.height / img.height
        w = max(1, int(exact) if prep.width_rounding == "floor" else
                # PaddleOCR's ceil(H * (w / h)), in its order of operations, so that a
                # product a rounding error above a whole number goes up as it does there
                math.ceil(prep.height * (img.width / img.height))
                if prep.width_rounding == "ceil" else round(exact))
        img = _resize(img, (w, prep.height), prep)
    if prep.max_width and img.width > prep.max_width:
        img = (_resize(img, (prep.max_width, img.height), prep) if prep.over_width == "squeeze"
               else img.crop((0, 0, prep.max_width, img.height)))
    img = img.convert(mode)  # after_resize: now; before_resize: already this mode, a no-op
    a = np.asarray(img, dtype=np.float32) * np.float32(prep.scale)
    a = a[:, :, None] if a.ndim == 2 else a                    # H, W, C
    if prep.channel_order == "bgr" and a.shape[2] == 3:
        a = a[:, :, ::-1]
    return _layout(_normalize(a, prep), prep)


def _resize(img, size: tuple[int, int], prep: ImagePrep):
    """``img`` (PIL) resized to ``size`` (width, height) by Pillow's filter, or by OpenCV's
    ``cv2.resize`` on its 8-bit pixels (``resampler=opencv``), as code built on OpenCV resizes
    (OpenCV's bilinear and bicubic do not smooth a downscale as Pillow's do: other pixels)."""
    from PIL import Image

    if prep.resampler != "opencv":
        return img.resize(size, getattr(Image.Resampling, prep.interpolation.upper()))
    import cv2  # installed: ImagePrep checks it at compose

    if img.mode not in ("L", "RGB", "RGBA"):  # palette, 16-bit, CMYK: as PIL converts them
        img = img.convert("RGBA" if "A" in img.getbands() else "RGB")
    pixels = cv2.resize(np.asarray(img), size,
                        interpolation=getattr(cv2, OPENCV_FILTERS[prep.interpolation]))
    return Image.fromarray(pixels, img.mode)


def letterbox_placement(width: int, height: int, prep: ImagePrep) -> tuple[int, int, int, int]:
    """Where a ``width`` x ``height`` image lands in the letterbox: its scaled size and its left
    and top margins. One factor fits it in ``prep.width`` x ``prep.height`` (up or down), each
    side at least 1 pixel. ``center``: each side rounded, the margins split, an odd one's extra
    pixel after the image (Ultralytics' LetterBox); ``top_left``: each side truncated, no margin
    before the image (YOLOX's preproc)."""
    r = min(prep.height / height, prep.width / width)
    if prep.letterbox_align == "top_left":
        return max(int(width * r), 1), max(int(height * r), 1), 0, 0
    w, h = max(round(width * r), 1), max(round(height * r), 1)
    return w, h, round((prep.width - w) / 2 - 0.1), round((prep.height - h) / 2 - 0.1)


def _letterbox(img, prep: ImagePrep):
    """``img`` scaled and placed on a ``letterbox_fill`` canvas of ``width`` x ``height``, as
    ``letterbox_placement`` says. The boxes a detector finds are in the canvas's pixels."""
    from PIL import Image

    if img.mode not in ("L", "RGB"):  # palette, alpha (convert=after_resize): a plain fill
        img = img.convert("RGB")
    w, h, left, top = letterbox_placement(img.width, img.height, prep)
    if (w, h) != img.size:
        img = _resize(img, (w, h), prep)
    fill = round(prep.letterbox_fill)
    canvas = Image.new(img.mode, (prep.width, prep.height),
                       fill if len(img.getbands()) == 1 else (fill,) * len(img.getbands()))
    canvas.paste(img, (left, top))
    return canvas


def _normalize(a: np.ndarray, prep: ImagePrep) -> np.ndarray:
    """Scaled H, W, C values minus ``mean``, over ``std`` (each when given)."""
    if prep.mean:
        a = a - np.asarray(prep.mean, dtype=np.float32)
    if prep.std:
        a = a / np.asarray(prep.std, dtype=np.float32)
    return a


def _layout(a: np.ndarray, prep: ImagePrep) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a if prep.layout == "nhwc" else np.ascontiguousarray(a.transpose(2, 0, 1))


def pad_values(prep: ImagePrep) -> np.ndarray:
    """``pad=constant``: the value of each channel as the model sees it. A pixel value goes
    through the image's own scale, mean and std (padding before normalization equals padding
    after it with the normalized value); a normalized one is taken as it is."""
    v = np.full((1, 1, prep.channels), prep.pad_value, dtype=np.float32)
    if prep.pad_units == "pixel":
        v = _normalize(v * np.float32(prep.scale), prep)
    return v.reshape(-1)


def pad(array: np.ndarray, shape: tuple[int, ...], prep: ImagePrep) -> np.ndarray:
    """One image ([C, H, W] or [H, W, C]) padded at the end of each axis up to ``shape``: edge
    values, or each channel's constant (``pad_values``)."""
    widths = [(0, t - s) for s, t in zip(array.shape, shape)]
    if prep.pad == "edge" or not any(w for _, w in widths):
        return np.pad(array, widths, mode="edge")
    c_axis = 0 if prep.layout == "nchw" else 2
    out = np.empty(shape, dtype=array.dtype)
    values = pad_values(prep)
    for c in range(shape[c_axis]):
        idx = [slice(None)] * 3
        idx[c_axis] = c
        out[tuple(idx)] = values[c if values.size > 1 else 0]
    out[tuple(slice(0, s) for s in array.shape)] = array
    return out


def padded_shape(arrays: list[np.ndarray], prep: ImagePrep) -> tuple[int, ...]:
    """The shape a batch of these images is padded to: the largest of each axis, the width at
    least ``min_width`` and rounded up to ``pad_width_multiple``."""
    w_axis = 2 if prep.layout == "nchw" else 1
    target = [max(a.shape[d] for a in arrays) for d in range(arrays[0].ndim)]
    width = max(target[w_axis], prep.min_width)
    target[w_axis] = math.ceil(width / prep.pad_width_multiple) * prep.pad_width_multiple
    return tuple(target)


def collate(arrays: list[np.ndarray], prep: ImagePrep) -> np.ndarray:
    """Stack images into one batch, each padded (``data.image.pad``) to ``padded_shape``.
    Heights must agree: resize them, or the error names the sizes."""
    heights = {a.shape[1 if prep.layout == "nchw" else 0] for a in arrays}
    if len(heights) > 1:
        raise ValueError(f"images of different heights {sorted(heights)} cannot share a batch; "
                         "set data.image.resize=height or fixed")
    shape = padded_shape(arrays, prep)
    return np.stack([pad(a, shape, prep) for a in arrays]).astype(np.float32, copy=False)


def width(array: np.ndarray, prep: ImagePrep) -> int:
    """The image's width after preprocessing."""
    return int(array.shape[2 if prep.layout == "nchw" else 1])
