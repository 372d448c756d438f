"""The serving record: what a run's evaluation fed the model and how its outputs read, written
into ``report.json`` and the manifest so a server reads a request as the evaluation read a sample.

In: what a task knows of its own preprocessing (``Task.serving_spec()`` builds one of these), or
the ``serving`` object of a report or manifest (``read``). Out: one of four typed records, each
written by ``pipeline.core.json_record`` key for key as runs have always written it:
- ``BuiltinImage``: a built-in OCR task (no ``reader`` key; ``kind: image``); a server compares
  it with what this code's task does now and refuses an artifact whose preprocessing changed;
- ``TextInput``: a Hugging Face encoder (``reader: text``): the tokenization and the digests of
  the tokenizer files that travel with the model;
- ``ImageInput``: the user's own model of one image input (``reader: image``): every
  ``data.image`` step (``ImagePrep``), the input's dtype and declared shape, the first
  evaluation image's size (what warm-up sends);
- ``ArrayInputs``: the user's own model of array inputs (``reader: arrays``): each input's name,
  dtype and declared shape, the axis batches are bucketed by, its padding, the first sample's
  shapes; and where one of its inputs is read from an image file beside the arrays (a detector
  fed its image and its scale factors), that input's ``ImagePart``: its steps and first size.
The user's records carry their ``Decoding`` in the same object: the metric, and per metric what
reads the first output (``ctc``: the character set, which travels inside the record, and the
layout; ``classification``: top-k and class names; ``agreement``: whether it ends in a class
axis). Records compare and hash by their JSON, so one is a reader's cache key as it is. A record
this code cannot read (a key it does not know: written by another version, or by hand) raises
``TypeError`` naming the key; the server turns that into one line.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from pipeline.config.data import ImagePrep
from pipeline.config.metrics import MetricName
from pipeline.core.json_record import from_json, inline, omitted, to_json


class _Record:
    """Equal and hashed by the JSON a run writes (dicts and lists inside stay plain)."""

    def to_dict(self) -> dict:
        return to_json(self)

    def canonical(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    def __eq__(self, other) -> bool:
        return type(other) is type(self) and other.canonical() == self.canonical()

    def __hash__(self) -> int:
        return hash(self.canonical())


@dataclass(frozen=True, kw_only=True, eq=False)
class OcrImage(_Record):
    """A built-in recognizer's image steps, as words (the code that does them is the task's)."""
    color: str
    resize: str
    height: int
    interpolation: str
    width_multiple: int
    normalize: str
    pad: str


@dataclass(frozen=True, kw_only=True, eq=False)
class BuiltinImage(_Record):
    kind: str = "image"
    input: str
    output: str
    image: OcrImage
    charset: str
    decoder: str
    blank: int
    prediction: str

    def describe(self) -> str:
        return f"images for a built-in recognizer, input {self.input}"


@dataclass(frozen=True, kw_only=True, eq=False)
class TextInput(_Record):
    reader: str = "text"
    task: str                          # feature-extraction or sequence-classification
    input_names: tuple[str, ...]
    max_length: int
    pad_token_id: int | None
    metric: MetricName
    top_k: int
    labels: tuple[str, ...] | None     # a classifier's class names, index by index
    files: dict[str, str]              # tokenizer file -> sha256: they travel with the model

    def describe(self) -> str:
        return f"text for a {self.task} encoder"


@dataclass(frozen=True, kw_only=True, eq=False)
class Decoding(_Record):
    """How the first output of the user's model reads, per metric."""
    metric: MetricName
    charset: tuple[str, ...] | None = omitted()   # ctc
    time_major: bool | None = omitted()           # ctc: [T, N, C] rather than [N, T, C]
    top_k: int | None = omitted()                 # classification
    labels: tuple[str, ...] | None = omitted()    # classification: names, index by index
    class_axis: bool | None = omitted()           # agreement: the output ends in classes
    detections: str | None = omitted()            # agreement: a detector's head (yolo) ...
    score_threshold: float | None = omitted()     # ... its detections kept from this score
    iou_threshold: float | None = omitted()       # ... after suppression at this overlap
    nms: str | None = omitted()                   # ... within a class (per_class) or across
    input_size: tuple[int, int] | None = omitted()  # yolox: the input's height and width, whose
                                                  # grids its raw boxes are on


@dataclass(frozen=True, kw_only=True, eq=False)
class ImageInput(_Record):
    reader: str = "image"
    input: str
    dtype: str
    shape: tuple[int | str, ...]       # fixed sizes, and what each dynamic axis is
    image: ImagePrep                   # every data.image step, as evaluated
    sample_size: tuple[int, int]       # the first evaluation image (width, height): warm-up's
    decoding: Decoding | None = inline()

    def describe(self) -> str:
        return (f"images for {self.decoding.metric.value}, input {self.input}, "
                f"data.image.resize={self.image.resize.value}")


@dataclass(frozen=True, kw_only=True, eq=False)
class ArrayInput(_Record):
    name: str
    dtype: str
    shape: tuple[int | str, ...]


@dataclass(frozen=True, kw_only=True, eq=False)
class ImagePart(_Record):
    """The input of a model of arrays that is read from an image file: a request sends the
    file's bytes as ``{"b64": ...}`` in that input's place."""
    name: str
    steps: ImagePrep                   # every data.image step, as evaluated
    sample_size: tuple[int, int]       # the first evaluation image (width, height): warm-up's


@dataclass(frozen=True, kw_only=True, eq=False)
class ArrayInputs(_Record):
    reader: str = "arrays"
    inputs: tuple[ArrayInput, ...]
    size_axis: tuple[str, int]         # the input and axis batches are bucketed by (0: none)
    pad_width_multiple: int
    example: dict[str, tuple[int, ...]]  # the first sample's shapes, no batch axis: warm-up's
    image_input: ImagePart | None = omitted()  # an input read from an image file, if one is
    decoding: Decoding | None = inline()

    def describe(self) -> str:
        image = f" ({self.image_input.name} an image file)" if self.image_input else ""
        return (f"JSON arrays for {self.decoding.metric.value}, inputs "
                f"{', '.join(i.name for i in self.inputs)}{image}")


Serving = BuiltinImage | TextInput | ImageInput | ArrayInputs
READERS: dict[str, type] = {"text": TextInput, "image": ImageInput, "arrays": ArrayInputs}


def read(record: dict | None) -> Serving | None:
    """The typed record of a report's or manifest's ``serving`` object (None: a run that
    recorded none). ``TypeError`` names what this code cannot read in it."""
    if record is None:
        return None
    if not isinstance(record, dict):
        raise TypeError(f"a serving record is a JSON object, not {type(record).__name__}")
    if "reader" not in record and record.get("kind") == "image":
        return from_json(BuiltinImage, record)
    cls = READERS.get(record.get("reader"))
    if cls is None:
        raise TypeError(f"a serving record of reader {record.get('reader')!r}, which this code "
                        f"does not know (it reads {', '.join(READERS)} and the built-in tasks')")
    out = from_json(cls, record)
    if getattr(out, "decoding", True) is None:
        raise TypeError(f"a {record['reader']} serving record without its metric")
    return out
