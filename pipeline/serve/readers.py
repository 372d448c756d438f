"""How a served artifact reads a request and answers it: bytes to the model's feeds, its outputs to
the JSON a client gets, with the code its evaluation used.

In: a reader key (hashable and picklable, so a preprocessing worker process rebuilds the reader
from it): a built-in OCR task's key, a ``TextKey`` (the folder holding the tokenizer files the
artifact carries, and the serving spec its run recorded), or the spec a run of the user's own
image or array model recorded (``pipeline.task.serving.ImageInput`` / ``ArrayInputs``). Out: a
reader with ``prepare`` (one request's bytes checked, decoded and preprocessed: a ``Prepared``,
or ``BadInput``), ``stack`` (prepared requests of one shape class as one batch), ``answers`` (a
batch's outputs as one answer per request), ``example`` and ``warm_request`` (what warm-up
sends).

A built-in image model (OCR) reads PNG or JPEG through the task's own ``from_image`` and answers
what the task decodes (the text). The user's own image model reads them through the recorded
``data.image`` steps (``pipeline.data.images``, the functions its evaluation used) and answers what
its metric decodes: the text (``ctc``), the classes (``classification``) or the output
(``agreement``); a model of arrays reads one sample as JSON (an input read from an image file
beside them: that file's bytes in base64, through the same steps) and answers the same way. A
Hugging Face encoder reads UTF-8 text, or JSON ``{"text": ...}``, tokenized by the folder's
tokenizer through the evaluation's own ``encode`` (truncated to the same ``max_length``), and
answers the vector (an embedding, rounded as the output-hash ledger rounds it), or for a classifier
its class, label, softmax score and top-k classes. Decoders are not read here (they generate; no
batch of one shape answers them).
"""
from __future__ import annotations

import functools
import io
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.config.metrics import MetricName
from pipeline.serve.inputs import BadInput, Limits, Prepared, check_input, open_image, read_text
from pipeline.task.serving import ArrayInputs, Decoding, ImageInput, TextInput


@dataclass(frozen=True)
class TextKey:
    folder: str       # the tokenizer files (a pulled folder, or the run's model.path)
    spec: TextInput   # the run's serving spec


@functools.lru_cache(maxsize=None)
def reader(key):
    """The reader for ``key``; one per process (a worker builds its own on its first request)."""
    if isinstance(key, TextKey):
        return TextReader(key)
    if isinstance(key, ArrayInputs):
        return UserArraysReader(key)
    return UserImageReader(key) if isinstance(key, ImageInput) else ImageReader(key)


class ImageReader:
    """A built-in OCR task: PNG/JPEG bytes in, the decoded text out."""

    def __init__(self, task_key: str):
        from pipeline.models import task

        self.task = task(task_key)

    def prepare(self, body: bytes, content_type: str, limits: Limits) -> Prepared:
        from pipeline.task.contract import size_of

        start = time.perf_counter()
        image = open_image(body, content_type, limits)
        decoded = time.perf_counter()
        feeds = self.task.from_image(image)
        check_input(feeds, limits, "a {}x{} image".format(*image.size))
        done = time.perf_counter()
        return Prepared({k: np.ascontiguousarray(v) for k, v in feeds.items()},
                        size_of(self.task, feeds), (decoded - start) * 1000.0,
                        (done - decoded) * 1000.0)

    def stack(self, feeds: list[dict]) -> dict:
        return self.task.stack(feeds)

    def answers(self, outputs) -> list:
        return self.task.predictions(outputs)

    def example(self) -> dict:
        return self.task.example(1)

    def warm_request(self) -> tuple[bytes, str]:
        from PIL import Image

        buf = io.BytesIO()
        Image.new("L", (64, 32), color=255).save(buf, format="PNG")
        return buf.getvalue(), "image/png"


class ImageSteps:
    """One model input read from an image through the evaluation's ``data.image`` steps
    (``pipeline.data.images``, the functions the evaluation used): the image alone as a batch of
    one, checked against the input's fixed sizes, and several of them padded into one batch as
    the evaluation's batches were."""

    def __init__(self, name: str, dtype: str, shape: tuple, prep):
        from pipeline.config.data import Resize

        self.name, self.dtype, self.declared, self.prep = name, dtype, tuple(shape[1:]), prep
        # a fixed resize bounds the input by itself; other images are bounded per request
        self.bounded = prep.resize in (Resize.fixed, Resize.letterbox)

    def geometry(self, image) -> tuple | None:
        """How ``image``'s pixels land in the input: (sx, sy, left, top, width, height), for a
        resize that keeps the whole image (none, fixed, letterbox, as ``images.to_array`` does
        them); None for the others (a text line's width rounding and cap)."""
        from pipeline.config.data import Resize

        p, (w, h) = self.prep, image.size
        if p.resize == Resize.none:
            return (1.0, 1.0, 0.0, 0.0, w, h)
        if p.resize == Resize.fixed:
            return (p.width / w, p.height / h, 0.0, 0.0, w, h)
        if p.resize == Resize.letterbox:
            from pipeline.data.images import letterbox_placement

            nw, nh, left, top = letterbox_placement(w, h, p)
            return (nw / w, nh / h, float(left), float(top), w, h)
        return None

    def feed(self, image, limits: Limits) -> np.ndarray:
        """``image`` (decoded, PIL) as the input of a batch of one."""
        from pipeline.data import images

        a = images.to_array(image, self.prep)
        # padded alone as a batch of one is (width multiple, min_width): an exact shape class
        a = images.pad(a, images.padded_shape([a], self.prep), self.prep)
        feed = np.ascontiguousarray(a[None].astype(self.dtype, copy=False))
        what = "a {}x{} image".format(*image.size)
        if not self.bounded:
            check_input({self.name: feed}, limits, what)
        self._fits(a.shape, what)
        return feed

    def _fits(self, shape: tuple, what: str) -> None:
        """The preprocessed image against the model's fixed sizes (a classifier's 3x224x224
        without a resize): one 400 line, where the runtime would answer a 500."""
        if any(isinstance(d, int) and d != s for d, s in zip(self.declared, shape)):
            sizes = "x".join(str(d) if isinstance(d, int) else "any" for d in self.declared)
            raise BadInput(400, f"{what} becomes an input of {'x'.join(map(str, shape))}; the "
                                f"model takes {sizes} (data.image.resize="
                                f"{self.prep.resize.value} as evaluated): send an image of "
                                "that size")

    def width(self, feed: np.ndarray) -> int:
        from pipeline.data import images

        return images.width(feed[0], self.prep)

    def stack(self, feeds: list[np.ndarray]) -> np.ndarray:
        """One batch; images of one shape class share their width, so none is padded (images
        of other heights, without a resize, are padded as the evaluation's batches were)."""
        from pipeline.data import images

        arrays = [f[0] for f in feeds]
        shape = images.padded_shape(arrays, self.prep)
        return np.stack([images.pad(a, shape, self.prep) for a in arrays])


def grey_png(size: tuple[int, int]) -> bytes:
    """A grey PNG of ``size`` (width, height): what warm-up sends a model that reads images."""
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", tuple(size), color=(128, 128, 128)).save(buf, format="PNG")
    return buf.getvalue()


WARM_LIMITS = Limits(1 << 30, 1 << 30, 1 << 20, 1 << 30)  # warm-up's own request, not a client's


class UserImageReader:
    """The user's own image model: PNG/JPEG bytes through the evaluation's ``data.image`` steps;
    out, what its metric reads: the text (``ctc``), the top classes with their names and the best
    one's score (``classification``), or the output itself (``agreement``)."""

    def __init__(self, spec: ImageInput):
        self.spec = spec
        self.steps = ImageSteps(spec.input, spec.dtype, spec.shape, spec.image)

    def prepare(self, body: bytes, content_type: str, limits: Limits) -> Prepared:
        start = time.perf_counter()
        image = open_image(body, content_type, limits)
        decoded = time.perf_counter()
        feed = self.steps.feed(image, limits)
        done = time.perf_counter()
        return Prepared({self.spec.input: feed}, self.steps.width(feed),
                        (decoded - start) * 1000.0, (done - decoded) * 1000.0,
                        self.steps.geometry(image) if self.spec.decoding.detections else None)

    def stack(self, feeds: list[dict]) -> dict:
        return {self.spec.input: self.steps.stack([f[self.spec.input] for f in feeds])}

    def answers(self, outputs) -> list:
        return metric_answers(self.spec.decoding, outputs)

    def example(self) -> dict:
        body, kind = self.warm_request()
        return self.prepare(body, kind, WARM_LIMITS).feeds

    def warm_request(self) -> tuple[bytes, str]:
        """A grey PNG of the first evaluation image's size: every model takes that one."""
        return grey_png(self.spec.sample_size), "image/png"


class UserArraysReader:
    """The user's own model of array inputs: a JSON body ``{"inputs": {name: nested list}}``
    holding one sample (no batch axis), checked against each input's dtype and declared shape;
    an input read from an image file (``spec.image_input``) is that file's bytes in base64,
    ``{"b64": "..."}``, read as the evaluation read it; out, what its metric reads, as for an
    image model."""

    def __init__(self, spec: ArrayInputs):
        self.spec = spec
        self.size_input, axis = spec.size_axis
        self.size_dim = axis - 1 if axis > 0 else None
        part = spec.image_input
        self.image = None if part is None else ImageSteps(
            part.name, *next((i.dtype, i.shape) for i in spec.inputs if i.name == part.name),
            part.steps)
        self.arrays = tuple(i for i in spec.inputs if part is None or i.name != part.name)
        # an input of fixed sizes is as large as the model makes it whatever the body says
        # (array_feeds checks each size): only one that can grow is held to the input limit
        self.growing = {i.name for i in self.arrays
                        if any(not isinstance(d, int) for d in i.shape[1:])}

    def prepare(self, body: bytes, content_type: str, limits: Limits) -> Prepared:
        from pipeline.serve.inputs import array_feeds, json_inputs

        start = time.perf_counter()
        given = json_inputs(body, content_type, limits, [i.name for i in self.spec.inputs],
                            self.image.name if self.image else None)
        feeds = array_feeds(given, self.arrays)
        # the image is bounded by its own steps, a fixed-size array by the model
        check_input({n: a for n, a in feeds.items() if n in self.growing}, limits, "the JSON body")
        decoded = time.perf_counter()
        if self.image is not None:
            name = self.image.name
            try:
                image = open_image(image_bytes(given[name], name), "", limits)
            except BadInput as e:  # said of the input, and a 400: the body itself is JSON
                raise BadInput(400, e.line if e.line.startswith(f"input {name}:")
                               else f"input {name}: {e.line}") from None
            feeds[name] = self.image.feed(image, limits)  # checked unless a fixed resize
            geometry = self.image.geometry(image) if self.spec.decoding.detections else None
        else:
            geometry = None
        done = time.perf_counter()
        size = (feeds[self.size_input].shape[self.size_dim + 1] if self.size_dim is not None
                else 1)
        return Prepared(feeds, int(size), (decoded - start) * 1000.0, (done - decoded) * 1000.0,
                        geometry)

    def stack(self, feeds: list[dict]) -> dict:
        """One batch, padded as the evaluation's batches were (``stack_arrays``; an image input
        by its ``data.image`` padding)."""
        from pipeline.models.user_task import stack_arrays

        out = {i.name: stack_arrays([f[i.name][0] for f in feeds],
                                    self.size_dim if i.name == self.size_input else None,
                                    self.spec.pad_width_multiple) for i in self.arrays}
        if self.image is not None:
            out[self.image.name] = self.image.stack([f[self.image.name] for f in feeds])
        return {i.name: out[i.name] for i in self.spec.inputs}

    def answers(self, outputs) -> list:
        return metric_answers(self.spec.decoding, outputs)

    def example(self) -> dict:
        if self.image is not None:  # the image goes through its steps: warm-up's own request
            return self.prepare(*self.warm_request(), WARM_LIMITS).feeds
        return {i.name: np.zeros([1, *self.spec.example[i.name]], dtype=i.dtype)
                for i in self.spec.inputs}

    def warm_request(self) -> tuple[bytes, str]:
        """The first evaluation sample's shapes, as zeros (an image input: a grey image of the
        first evaluation image's size)."""
        import base64

        inputs = {i.name: np.zeros(self.spec.example[i.name], dtype=i.dtype).tolist()
                  for i in self.arrays}
        if self.image is not None:
            inputs[self.image.name] = {"b64": base64.b64encode(
                grey_png(self.spec.image_input.sample_size)).decode()}
        return json.dumps({"inputs": inputs}).encode(), "application/json"


def image_bytes(value, name: str) -> bytes:
    """An image input's value in a JSON body: ``{"b64": "..."}``, the file's bytes in base64."""
    import base64
    import binascii

    if not (isinstance(value, dict) and set(value) == {"b64"} and isinstance(value["b64"], str)):
        raise BadInput(400, f'input {name}: an image file is sent as {{"b64": "<its bytes in '
                            'base64>"}')
    try:
        return base64.b64decode(value["b64"], validate=True)
    except (binascii.Error, ValueError) as e:
        raise BadInput(400, f"input {name}: not valid base64 ({e})") from None


def metric_answers(decoding: Decoding, outputs) -> list:
    """A user's model's answers, as its metric decodes its first output: the text (``ctc``),
    the classes (``classification``), a detector's boxes (``agreement`` with ``detections``),
    or the output itself rounded (``agreement``)."""
    from pipeline.metrics import ctc
    from pipeline.models.user_task import agreement_predictions

    out = np.asarray(outputs)
    if decoding.metric == MetricName.ctc:
        return ctc.greedy_decode(out, list(decoding.charset), decoding.time_major)
    if decoding.metric == MetricName.classification:
        return classes_answers(out, decoding.labels, decoding.top_k)
    if decoding.detections:  # the boxes, as the evaluation decoded them; not the raw head
        from pipeline.metrics.detection import Head
        from pipeline.models.user_task import detection_predictions

        read = Head(decoding.detections, decoding.score_threshold, decoding.iou_threshold,
                    decoding.nms or "per_class", decoding.input_size)
        return [{"detections": p["detections"], "decision": p["decision"]}
                for p in detection_predictions(out, read)]
    return agreement_predictions(out, decoding.class_axis)


def in_image(answer, geometry: tuple | None):
    """A detector's answer with each box also in the posted image's pixels (``image_box``),
    mapped back through the request's ``geometry`` and clipped to the image; any other answer
    as it is."""
    if not geometry or not isinstance(answer, dict) or "detections" not in answer:
        return answer
    sx, sy, left, top, w, h = geometry
    for d in answer["detections"]:
        x1, y1, x2, y2 = d["box"]
        d["image_box"] = [round(min(max(v, 0.0), hi), 2) for v, hi in
                          (((x1 - left) / sx, w), ((y1 - top) / sy, h),
                           ((x2 - left) / sx, w), ((y2 - top) / sy, h))]
    return answer


def classes_answers(outputs, labels: tuple[str, ...] | None, top_k: int) -> list[dict]:
    """A classifier's answer per row: its best class, the class's name (``labels``, else the
    index), its score and the top-k classes. The score is the output itself where the rows are
    already probabilities (none negative, each summing to 1), else the softmax of the row."""
    from pipeline.models.user_task import top_classes

    x = np.asarray(outputs, dtype=np.float64)
    sums = x.sum(axis=1)
    if not ((x >= 0).all() and np.allclose(sums, 1.0, atol=1e-3)):
        x = np.exp(x - x.max(axis=1, keepdims=True))
        x = x / x.sum(axis=1, keepdims=True)
    labels = labels or []
    answers = []
    for row, top in zip(x, top_classes(outputs, top_k)):
        best = top[0]
        answers.append({"class": best, "label": labels[best] if best < len(labels) else str(best),
                        "score": round(float(row[best]), 6), "top_k": top})
    return answers


class TextReader:
    """A Hugging Face encoder: text in; the vector, or a classifier's class and score, out."""

    def __init__(self, key: TextKey):
        from pipeline.models.hf_folder import folder_tokenizer

        self.spec = key.spec
        self.tokenizer = folder_tokenizer(Path(key.folder))
        self.names = key.spec.input_names

    def prepare(self, body: bytes, content_type: str, limits: Limits) -> Prepared:
        from pipeline.models.hf_folder import encode

        start = time.perf_counter()
        text = read_text(body, content_type, limits)
        decoded = time.perf_counter()
        sample, = encode(self.tokenizer, [text], self.spec.max_length, self.names)
        check_input(sample, limits, f"a text of {len(text)} characters")
        done = time.perf_counter()
        return Prepared({n: a[None] for n, a in sample.items()}, int(sample["input_ids"].size),
                        (decoded - start) * 1000.0, (done - decoded) * 1000.0)

    def stack(self, feeds: list[dict]) -> dict:
        from pipeline.models.hf_folder import collate

        return collate([{n: a[0] for n, a in f.items()} for f in feeds], self.names,
                       self.spec.pad_token_id)

    def answers(self, outputs) -> list:
        from pipeline.models.hf_folder import embedding_predictions

        out = np.asarray(outputs)
        if self.spec.task == "feature-extraction":
            return [p["output"] for p in embedding_predictions(out)]
        return classes_answers(out, self.spec.labels, self.spec.top_k)

    def example(self) -> dict:
        return self.prepare(b"warm up", "text/plain", Limits(1 << 20, 1, 1)).feeds

    def warm_request(self) -> tuple[bytes, str]:
        return b"a sentence to warm up with", "text/plain; charset=utf-8"


def prepare_ms(key, limits: Limits, runs: int = 5) -> float | None:
    """Decode and preprocess time of the reader's warm-up request, the median of ``runs`` after
    one that warms its imports: the preprocessing side of a request, before any worker starts.
    None when the limits refuse it (the warm-up then says so)."""
    r = reader(key)
    body, content_type = r.warm_request()
    try:
        r.prepare(body, content_type, limits)
        times = [(lambda p: p.decode_ms + p.preprocess_ms)(r.prepare(body, content_type, limits))
                 for _ in range(runs)]
    except BadInput:
        return None
    return float(np.median(times))


def prepare(body: bytes, content_type: str, limits: Limits, key) -> Prepared:
    """Decode and preprocess one request for the artifact ``key`` names: a worker's entry."""
    return reader(key).prepare(body, content_type, limits)

