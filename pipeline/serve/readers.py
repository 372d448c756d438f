"""How a served artifact reads a request and answers it: bytes to the model's feeds, its outputs to
the JSON a client gets, with the code its evaluation used.

In: a reader key (hashable and picklable, so a preprocessing worker process rebuilds the reader
from it): a built-in OCR task's key, or a ``TextKey`` (the folder holding the tokenizer files the
artifact carries, and the serving spec its run recorded). Out: a reader with ``prepare`` (one
request's bytes checked, decoded and preprocessed: a ``Prepared``, or ``BadInput``), ``stack``
(prepared requests of one shape class as one batch), ``answers`` (a batch's outputs as one answer
per request), ``example`` and ``warm_request`` (what warm-up sends).

An image model (OCR) reads PNG or JPEG through the task's own ``from_image`` and answers what the
task decodes (the text). A Hugging Face encoder reads UTF-8 text, or JSON ``{"text": ...}``,
tokenized by the folder's tokenizer through the evaluation's own ``encode`` (truncated to the same
``max_length``), and answers the vector (an embedding, rounded as the output-hash ledger rounds
it), or for a classifier its class, label, softmax score and top-k classes. Decoders are not read
here (they generate; no batch of one shape answers them).
"""
from __future__ import annotations

import functools
import io
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.serve.inputs import Limits, Prepared, check_input, open_image, read_text


@dataclass(frozen=True)
class TextKey:
    folder: str   # the tokenizer files (a pulled folder, or the run's model.path)
    spec: str     # the run's serving spec, as canonical JSON (hashable)


@functools.lru_cache(maxsize=None)
def reader(key):
    """The reader for ``key``; one per process (a worker builds its own on its first request)."""
    return TextReader(key) if isinstance(key, TextKey) else ImageReader(key)


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


class TextReader:
    """A Hugging Face encoder: text in; the vector, or a classifier's class and score, out."""

    def __init__(self, key: TextKey):
        from pipeline.models.hf_folder import folder_tokenizer

        self.spec = json.loads(key.spec)
        self.tokenizer = folder_tokenizer(Path(key.folder))
        self.names = tuple(self.spec["input_names"])

    def prepare(self, body: bytes, content_type: str, limits: Limits) -> Prepared:
        from pipeline.models.hf_folder import encode

        start = time.perf_counter()
        text = read_text(body, content_type, limits)
        decoded = time.perf_counter()
        sample, = encode(self.tokenizer, [text], self.spec["max_length"], self.names)
        check_input(sample, limits, f"a text of {len(text)} characters")
        done = time.perf_counter()
        return Prepared({n: a[None] for n, a in sample.items()}, int(sample["input_ids"].size),
                        (decoded - start) * 1000.0, (done - decoded) * 1000.0)

    def stack(self, feeds: list[dict]) -> dict:
        from pipeline.models.hf_folder import collate

        return collate([{n: a[0] for n, a in f.items()} for f in feeds], self.names,
                       self.spec["pad_token_id"])

    def answers(self, outputs) -> list:
        from pipeline.models.hf_folder import embedding_predictions
        from pipeline.models.user_task import top_classes

        out = np.asarray(outputs)
        if self.spec["task"] == "feature-extraction":
            return [p["output"] for p in embedding_predictions(out)]
        x = out.astype(np.float64)
        x = np.exp(x - x.max(axis=1, keepdims=True))
        probs = x / x.sum(axis=1, keepdims=True)
        labels = self.spec.get("labels") or []
        answers = []
        for row, top in zip(probs, top_classes(out, self.spec.get("top_k", 5))):
            best = top[0]
            answers.append({"class": best, "label": labels[best] if best < len(labels) else
                            str(best), "score": round(float(row[best]), 6), "top_k": top})
        return answers

    def example(self) -> dict:
        return self.prepare(b"warm up", "text/plain", Limits(1 << 20, 1, 1)).feeds

    def warm_request(self) -> tuple[bytes, str]:
        return b"a sentence to warm up with", "text/plain; charset=utf-8"


def prepare(body: bytes, content_type: str, limits: Limits, key) -> Prepared:
    """Decode and preprocess one request for the artifact ``key`` names: a worker's entry."""
    return reader(key).prepare(body, content_type, limits)

