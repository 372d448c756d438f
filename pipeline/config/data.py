"""What a user's data set is and how its images become model inputs: the `data=` group's schema.

In: nothing (typed config). Out: ``DataConfig`` (where the data is, its format, which columns hold
inputs and labels, how many samples calibrate and evaluate) and ``ImagePrep`` (the declarative
image preprocessing). Loading lives in ``pipeline.data.load``, preprocessing in
``pipeline.data.images``. Every value is checked when the config is made, so a bad one ends before
any stage runs (exit 2).
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

from pipeline.core.errors import ConfigError


class DataFormat(str, enum.Enum):
    imagefolder = "imagefolder"  # <root>/<label>/<image>, or flat <root>/<image> (no labels)
    labels_file = "labels_file"  # a folder of images plus a CSV/JSONL of file name -> label
    saved = "saved"              # a folder written by datasets' save_to_disk
    csv = "csv"
    jsonl = "jsonl"
    parquet = "parquet"


class Resize(str, enum.Enum):
    none = "none"      # keep the image's own size (every image must then have the same size)
    fixed = "fixed"    # exactly height x width
    height = "height"  # height fixed, width scaled to keep the aspect ratio (text lines)
    letterbox = "letterbox"  # scaled to fit height x width keeping the aspect ratio, on a
                             # border of letterbox_fill (how YOLO detectors are fed)


# PIL's resampling filters by name: the one the model's own inference code resizes with
INTERPOLATIONS = ("nearest", "box", "bilinear", "hamming", "bicubic", "lanczos")


# data.image.resampler=opencv: each interpolation as cv2.resize names it (box: INTER_AREA, the
# average over each output pixel's source area; OpenCV has no Hamming filter)
OPENCV_FILTERS = {"nearest": "INTER_NEAREST", "bilinear": "INTER_LINEAR", "bicubic": "INTER_CUBIC",
                  "lanczos": "INTER_LANCZOS4", "box": "INTER_AREA"}


@dataclass
class ImagePrep:
    """Image -> float32 array, in this order: colour, resize, width cap, scale, normalize, pad,
    layout (colour after the resize with ``convert=after_resize``)."""
    color: str = "rgb"             # rgb or grey: grey gives one channel
    convert: str = "before_resize" # before_resize or after_resize: when the image becomes grey or
                                   # rgb (code that resizes the colour image, then greys it)
    resize: Resize = Resize.none
    height: int = 0                # for fixed and height
    width: int = 0                 # for fixed
    interpolation: str = "bilinear"  # PIL's resampling filter: nearest, box, bilinear, hamming,
                                   # bicubic, lanczos (what the training code resized with)
    resampler: str = "pillow"      # the library that resizes: pillow, or opencv for code that
                                   # calls cv2.resize (its filters differ: other pixels)
    width_rounding: str = "round"  # resize=height: the scaled width rounded (round), truncated
                                   # (floor, as int(w * h / H) does) or rounded up (ceil, as
                                   # PaddleOCR's recognizers do)
    max_width: int = 0             # a width cap after the resize; 0: none
    over_width: str = "squeeze"    # past max_width: squeeze (resize the width to the cap) or crop
                                   # (keep the left max_width columns)
    pad_width_multiple: int = 1    # pad the width up to a multiple: kernels like 8, 16
    min_width: int = 0             # pad every batch to at least this width (PaddleOCR's
                                   # recognizers: 320); 0: the widest image's
    pad: str = "edge"              # how batches pad narrower images: edge (repeat the last column)
                                   # or constant (pad_value)
    pad_value: float = 0.0         # pad=constant: the value, in pad_units
    letterbox_fill: float = 114.0  # resize=letterbox: the border's pixel value, 0..255
                                   # (Ultralytics' grey 114; 0 for code that pads black)
    letterbox_align: str = "center"  # resize=letterbox: center (each side rounded, the image
                                   # centred: Ultralytics) or top_left (each side truncated, the
                                   # image in the top-left corner: YOLOX's preproc)
    pad_units: str = "pixel"       # pixel: a 0..255 value normalized like the image (padding
                                   # before normalization); normalized: the value the model sees
                                   # (padding after normalization, e.g. zeros)
    scale: float = 1.0 / 255.0     # pixel values (0..255) are multiplied by it first
    mean: list[float] = field(default_factory=list)  # per channel, after scale; empty: none
    std: list[float] = field(default_factory=list)   # per channel, after scale; empty: none
    channel_order: str = "rgb"     # rgb or bgr (models trained with OpenCV read bgr)
    layout: str = "nchw"           # nchw or nhwc

    def _check_opencv(self) -> None:
        """At compose, not in a stage: the filter exists in OpenCV, and OpenCV is installed."""
        import importlib.util

        if self.interpolation not in OPENCV_FILTERS:
            raise ConfigError(f"data.image.interpolation={self.interpolation}: OpenCV has no such "
                              f"filter (data.image.resampler=opencv takes "
                              f"{', '.join(OPENCV_FILTERS)})")
        if importlib.util.find_spec("cv2") is None:
            raise ConfigError("data.image.resampler=opencv needs OpenCV: pip install -e "
                              "'.[opencv]' (opencv-python-headless)")

    def __post_init__(self):
        self.resize = Resize(self.resize)
        _choice("data.image.color", self.color, ("rgb", "grey"))
        _choice("data.image.channel_order", self.channel_order, ("rgb", "bgr"))
        _choice("data.image.layout", self.layout, ("nchw", "nhwc"))
        _choice("data.image.convert", self.convert, ("before_resize", "after_resize"))
        _choice("data.image.interpolation", self.interpolation, INTERPOLATIONS)
        _choice("data.image.width_rounding", self.width_rounding, ("round", "floor", "ceil"))
        _choice("data.image.over_width", self.over_width, ("squeeze", "crop"))
        _choice("data.image.resampler", self.resampler, ("pillow", "opencv"))
        if self.resampler == "opencv":
            self._check_opencv()
        _choice("data.image.pad", self.pad, ("edge", "constant"))
        _choice("data.image.letterbox_align", self.letterbox_align, ("center", "top_left"))
        _choice("data.image.pad_units", self.pad_units, ("pixel", "normalized"))
        if self.max_width < 0:
            raise ConfigError(f"data.image.max_width={self.max_width}: must be >= 0 (0: no cap)")
        if not math.isfinite(self.pad_value):
            raise ConfigError(f"data.image.pad_value={self.pad_value}: must be a finite number")
        if self.resize != Resize.none and self.height < 1:
            raise ConfigError(f"data.image.height={self.height}: resize={self.resize.value} needs a "
                              "height of at least 1")
        if self.resize in (Resize.fixed, Resize.letterbox) and self.width < 1:
            raise ConfigError(f"data.image.width={self.width}: resize={self.resize.value} needs a "
                              "width of at least 1")
        if not 0 <= self.letterbox_fill <= 255:  # NaN fails too
            raise ConfigError(f"data.image.letterbox_fill={self.letterbox_fill}: a pixel value, "
                              "0 to 255")
        if self.min_width < 0:
            raise ConfigError(f"data.image.min_width={self.min_width}: must be >= 0")
        if self.pad_width_multiple < 1:
            raise ConfigError(f"data.image.pad_width_multiple={self.pad_width_multiple}: must be "
                              ">= 1")
        if not (math.isfinite(self.scale) and self.scale > 0):
            raise ConfigError(f"data.image.scale={self.scale}: must be a positive number")
        channels = self.channels
        for name, values in (("mean", self.mean), ("std", self.std)):
            if values and len(values) != channels:
                raise ConfigError(f"data.image.{name}={list(values)}: needs {channels} value(s), "
                                  f"one per channel of a {self.color} image")
            if any(not math.isfinite(v) for v in values):
                raise ConfigError(f"data.image.{name}={list(values)}: values must be finite")
        if any(v <= 0 for v in self.std):
            raise ConfigError(f"data.image.std={list(self.std)}: values must be positive")

    @property
    def channels(self) -> int:
        return 1 if self.color == "grey" else 3


@dataclass
class DataConfig:
    """A user's data set. ``path`` is a folder or a file; nothing is ever downloaded."""
    format: DataFormat = DataFormat.imagefolder
    path: str = ""
    labels: str = ""               # labels_file: the CSV/JSONL with file and label columns
    input_column: str = "image"    # the column holding the model input (an image, text or array)
    pair_columns: list[str] = field(default_factory=list)  # model=hf embeddings: two text columns
                                   # holding sentence pairs (e.g. [sentence1,sentence2]), in place
                                   # of input_column; label_column then holds each pair's gold
                                   # similarity score, and Spearman's rho is reported
    label_column: str = "label"    # absent from the data: a label-free run (agreement metrics only)
    file_column: str = "file"      # labels_file: the column naming each image file
    calibration_samples: int = 128
    evaluation_samples: int = 512
    seed: int = 0                  # the shuffle that draws the two disjoint splits
    bucket_axis: str = ""          # the dynamic axis timing and calibration bucket batches by:
                                   # "" (the one whose sizes vary in the data), an axis of the
                                   # first input (3), of a named one (image:3) or a meaning (width)
    image: ImagePrep = field(default_factory=ImagePrep)

    def __post_init__(self):
        self.format = DataFormat(self.format)
        if isinstance(self.image, dict):
            self.image = ImagePrep(**self.image)
        if not self.path:
            raise ConfigError("data.path is empty: name the folder or file that holds your data")
        if self.format == DataFormat.labels_file and not self.labels:
            raise ConfigError("data.labels is empty: format=labels_file needs the CSV or JSONL "
                              "that maps each file to its label")
        if self.pair_columns and (len(self.pair_columns) != 2 or
                                  len(set(self.pair_columns)) != 2 or not all(self.pair_columns)):
            raise ConfigError(f"data.pair_columns={list(self.pair_columns)}: name two different "
                              "text columns, e.g. [sentence1,sentence2]")
        for key in ("calibration_samples", "evaluation_samples"):
            if getattr(self, key) < 1:
                raise ConfigError(f"data.{key}={getattr(self, key)}: must be at least 1")


def _choice(key: str, value: str, valid: tuple[str, ...]) -> None:
    if value not in valid:
        raise ConfigError(f"{key}={value!r}: valid choices are {', '.join(valid)}")
