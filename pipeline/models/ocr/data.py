"""Synthetic text lines for the OCR task.

In: a seed and a count. Out: grayscale uint8 line images of height ``HEIGHT`` and variable width,
with their label strings (4-10 digits and capital letters). Pillow's built-in FreeType font does
the drawing, so nothing is downloaded and every machine renders the same pixels for the same seed.
Each sample draws from its own ``numpy`` generator seeded by (seed, index), so a set is
reproducible sample by sample and two sets built from different seeds do not share a stream.
Deliberately not handled: other alphabets, multi-line text, real fonts from the system.
"""
from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"
HEIGHT = 32
MIN_LEN, MAX_LEN = 4, 10
WIDTH_MULTIPLE = 4  # the network downsamples width by 4; widths stay divisible so no column is lost

_fonts: dict[int, ImageFont.FreeTypeFont] = {}


def _font(size: int) -> ImageFont.FreeTypeFont:
    if size not in _fonts:
        _fonts[size] = ImageFont.load_default(size=size)
    return _fonts[size]


def render_line(rng: np.random.Generator) -> tuple[np.ndarray, str]:
    """One random line: returns (uint8 image [HEIGHT, W], label)."""
    n = int(rng.integers(MIN_LEN, MAX_LEN + 1))
    text = "".join(rng.choice(list(ALPHABET), size=n))
    size = int(rng.integers(20, 37))
    font = _font(size)
    spacing = int(rng.integers(0, 4))  # letter spacing in pixels, drawn char by char
    left, top, right, bottom = font.getbbox(text)
    pad_l, pad_r = int(rng.integers(2, 16)), int(rng.integers(2, 16))
    pad_t, pad_b = int(rng.integers(1, 8)), int(rng.integers(1, 8))
    width = right - left + pad_l + pad_r + spacing * (n - 1)
    height = bottom - top + pad_t + pad_b
    bg = int(rng.integers(0, 256))
    # Contrast between 60 and 255 grey levels, text darker or lighter than the background.
    contrast = int(rng.integers(60, 256))
    fg = bg - contrast if bg - contrast >= 0 else min(255, bg + contrast)
    img = Image.new("L", (width, height), color=bg)
    draw = ImageDraw.Draw(img)
    x = pad_l - left
    for ch in text:
        draw.text((x, pad_t - top), ch, fill=fg, font=font)
        x += font.getlength(ch) + spacing
    blur = float(rng.uniform(0.0, 1.2))
    if blur > 0.3:
        img = img.filter(ImageFilter.GaussianBlur(blur))
    # Fixed height, width follows the aspect ratio (with a small random stretch).
    stretch = float(rng.uniform(0.8, 1.2))
    new_w = max(WIDTH_MULTIPLE, int(round(width * HEIGHT / height * stretch)))
    new_w = -(-new_w // WIDTH_MULTIPLE) * WIDTH_MULTIPLE
    img = img.resize((new_w, HEIGHT), Image.BILINEAR)
    arr = np.asarray(img, dtype=np.float32)
    arr += rng.normal(0.0, float(rng.uniform(0, 12)), size=arr.shape)
    return np.clip(arr, 0, 255).astype(np.uint8), text


def generate(seed: int, count: int, start: int = 0):
    """Yield ``count`` samples as dicts; sample i depends only on (seed, start + i)."""
    for i in range(start, start + count):
        rng = np.random.default_rng([seed, i])
        image, text = render_line(rng)
        yield {"image": image.tobytes(), "width": image.shape[1], "text": text}


def line_from_image(image: Image.Image) -> np.ndarray:
    """Any image as a line the generator would have drawn: grey uint8 [HEIGHT, W], the height
    brought to HEIGHT keeping the aspect with the bilinear filter ``render_line`` ends with, the
    width rounded up to ``WIDTH_MULTIPLE``. A line already HEIGHT tall and a multiple wide (every
    line of the evaluation set) is returned pixel for pixel."""
    grey = image.convert("L")
    w, h = grey.size
    if h != HEIGHT or w % WIDTH_MULTIPLE:
        new_w = max(WIDTH_MULTIPLE, int(round(w * HEIGHT / h)))
        new_w = -(-new_w // WIDTH_MULTIPLE) * WIDTH_MULTIPLE
        grey = grey.resize((new_w, HEIGHT), Image.BILINEAR)
    return np.asarray(grey, dtype=np.uint8)


def to_array(sample: dict) -> np.ndarray:
    return np.frombuffer(sample["image"], dtype=np.uint8).reshape(HEIGHT, sample["width"])


def collate(images: list[np.ndarray], multiple: int = WIDTH_MULTIPLE) -> np.ndarray:
    """Normalise to [-1, 1] and right-pad to the batch's widest line with edge pixels.

    Edge padding continues the background, so padded columns look like empty margin, which
    the network learned during training; zero padding would draw a dark bar.
    ``multiple`` rounds the padded width up, to limit the number of distinct shapes.
    Returns float32 [N, 1, HEIGHT, W_max].
    """
    w_max = max(im.shape[1] for im in images)
    w_max = -(-w_max // multiple) * multiple
    out = np.empty((len(images), 1, HEIGHT, w_max), dtype=np.float32)
    for k, im in enumerate(images):
        padded = np.pad(im, ((0, 0), (0, w_max - im.shape[1])), mode="edge")
        out[k, 0] = padded.astype(np.float32) / 127.5 - 1.0
    return out
