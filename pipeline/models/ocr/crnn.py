"""The OCR task as the pipeline sees it: network, data sets, decoding and metric.

In: a ``ModelConfig``. Out: the torch network (weights from safetensors, never pickles), the
calibration and evaluation sets as Hugging Face ``datasets`` built from the line generator with
fixed seeds, batches for a runtime, and scores (sequence accuracy, CER). Sets are saved under
``<data_dir>/ocr/`` with a sha256 over their samples; a set whose digest no longer matches is
rebuilt, never trusted. Deliberately not handled: loading real scans or any hub data.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import uuid
from pathlib import Path

import numpy as np

from pipeline.core.errors import StageError
from pipeline.models.ocr import data as ocr_data
from pipeline.models.ocr.decode import greedy_decode, score
from pipeline.task.serving import BuiltinImage, OcrImage

NAME = "ocr"
PRIMARY_METRIC = "sequence_accuracy"   # higher is better; the accuracy gate is judged on it
METRICS = ("sequence_accuracy", "cer")
INPUT_NAME, OUTPUT_NAME = "image", "logits"
SEEDS = {"calibration": 1, "evaluation": 2}  # training uses 1000+: no set overlaps another
GENERATOR_VERSION = 1  # bump when ocr_data changes what a seed renders
RANDOM_INIT_SEED = 0


def build_network(widths, hidden, weights: dict | None = None):
    from pipeline.models.ocr.net import CRNN

    return build_with(CRNN, widths, hidden, weights)


def build_with(network, widths, hidden, weights: dict | None = None):
    """``network(widths, hidden)`` from a seeded init, then ``weights`` (strict) if given; a
    checkpoint that does not fit is one line naming the network and its shape."""
    import torch

    torch.manual_seed(RANDOM_INIT_SEED)
    net = network(tuple(widths), hidden)
    if weights is not None:
        problem = misfit(net.state_dict(), weights)
        if problem:
            raise StageError(f"checkpoint does not fit {network.__name__}(widths={list(widths)}, "
                             f"hidden={hidden}): {problem}")
        net.load_state_dict(weights, strict=True)
    return net.eval()


def misfit(expected: dict, weights: dict) -> str | None:
    """The first tensor a checkpoint gets wrong (name, its shape, the expected shape), and how many
    others; torch's own message names only the network in its first line."""
    def shape(t):
        return list(t.shape)

    problems = [f"tensor {k} has shape {shape(weights[k])}, the network expects {shape(v)}"
                for k, v in expected.items() if k in weights and shape(weights[k]) != shape(v)]
    problems += [f"tensor {k} (shape {shape(v)}) is missing" for k, v in expected.items()
                 if k not in weights]
    problems += [f"tensor {k} (shape {shape(v)}) is not in the network" for k, v in weights.items()
                 if k not in expected]
    if not problems:
        return None
    more = len(problems) - 1
    return problems[0] + (f" (and {more} more tensor(s) do not fit)" if more else "")


def example_input(batch: int = 2, width: int = 8) -> np.ndarray:
    """A blank line of the shortest width export allows (``DYNAMIC_MIN``). Short, because export
    traces the network on it and torch unrolls the LSTM over its frames while tracing and
    decomposing: the tiny CRNN exported in 8.6 s from an 8-pixel line against 11.6 s from a
    40-pixel one (28 s from 128 pixels), with the same ops, the same weights and outputs equal
    within 1e-7 at widths 8 to 333. The width axis stays dynamic; parity checks real lines of
    every width."""
    return np.zeros((batch, 1, ocr_data.HEIGHT, width), dtype=np.float32)


def decode(logits) -> list[str]:
    return greedy_decode(logits)


def margins(logits) -> list[float]:
    """Per sample, the smallest gap between the best and second-best class over its frames
    (log-softmax): small means one frame nearly decoded differently."""
    x = np.asarray(logits, dtype=np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    logp = x - np.log(np.exp(x).sum(axis=-1, keepdims=True))
    top2 = np.sort(logp, axis=-1)[..., -2:]
    return [float(v) for v in (top2[..., 1] - top2[..., 0]).min(axis=-1)]


def metrics(predictions: list[str], labels: list[str]) -> dict[str, float]:
    return score(predictions, labels)


def dataset(split: str, count: int, data_dir: str | Path):
    """Load (or build) a split; returns (datasets.Dataset, sha256 over its samples)."""
    import datasets
    from datasets import Dataset, load_from_disk

    datasets.disable_progress_bars()  # the pipeline prints its own one line per stage

    if split not in SEEDS:
        raise StageError(f"unknown OCR split {split!r}; valid: {', '.join(SEEDS)}")
    folder = Path(data_dir) / NAME / f"{split}-seed{SEEDS[split]}-n{count}-v{GENERATOR_VERSION}"
    if folder.exists():
        try:
            ds = load_from_disk(str(folder))
            recorded = json.loads((folder / "digest.json").read_text())["sha256"]
            if sample_digest(ds) == recorded:
                return ds, recorded
        except Exception:  # noqa: BLE001 - any damage means: rebuild from the seed
            pass
        shutil.rmtree(folder)
    samples = list(ocr_data.generate(SEEDS[split], count))
    ds = Dataset.from_dict({k: [s[k] for s in samples] for k in ("image", "width", "text")})
    digest = sample_digest(ds)
    tmp = folder.with_name(f".tmp-{folder.name}-{uuid.uuid4().hex[:8]}")
    try:
        ds.save_to_disk(str(tmp))
        (tmp / "digest.json").write_text(json.dumps({"sha256": digest, "split": split,
                                                     "seed": SEEDS[split], "count": count}))
    except BaseException:  # a full disk: no half-written set left behind
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    try:
        tmp.rename(folder)
    except OSError:  # another run built it first
        shutil.rmtree(tmp, ignore_errors=True)
    return load_from_disk(str(folder)), digest


def sample_hashes(ds) -> list[str]:
    return [hashlib.sha256(img + b"\0" + txt.encode()).hexdigest()
            for img, txt in zip(ds["image"], ds["text"])]


def sample_digest(ds) -> str:
    return hashlib.sha256("".join(sample_hashes(ds)).encode()).hexdigest()


def from_image(image) -> np.ndarray:
    """A served request: a PIL image of any size as the float32 batch of one [1, 1, HEIGHT, W]
    the evaluation feeds the model. The evaluation's lines are grey, HEIGHT tall and a multiple of
    ``WIDTH_MULTIPLE`` wide (``ocr_data.render_line``); any other image is brought there the same
    way (grey, height to HEIGHT keeping the aspect, bilinear, width rounded up to the multiple),
    and then goes through ``collate``, the function every evaluation batch goes through. An image
    already of the evaluation's size is not resampled, so its pixels reach the model unchanged."""
    line = ocr_data.line_from_image(image)
    return ocr_data.collate([line])


def serving_spec() -> BuiltinImage:
    """What the evaluation fed the model and how its outputs read, recorded in the manifest so a
    server can refuse an artifact whose preprocessing this code no longer reproduces."""
    return BuiltinImage(
        input=INPUT_NAME, output=OUTPUT_NAME,
        image=OcrImage(color="grey", resize="height", height=ocr_data.HEIGHT,
                       interpolation="bilinear", width_multiple=ocr_data.WIDTH_MULTIPLE,
                       normalize="x / 127.5 - 1", pad="edge"),
        charset=ocr_data.ALPHABET, decoder="ctc_greedy", blank=0, prediction="text")


def stack(requests: list[np.ndarray]) -> np.ndarray:
    """Join single-line inputs [1, 1, H, W_i] into one batch, edge-padded to the widest
    (the same padding ``collate`` uses), as a serving batcher must."""
    w_max = max(r.shape[-1] for r in requests)
    if all(r.shape[-1] == w_max for r in requests):  # a batcher's exact shape class: no padding
        return np.concatenate(requests)
    return np.concatenate([np.pad(r, ((0, 0), (0, 0), (0, 0), (0, w_max - r.shape[-1])), mode="edge")
                           for r in requests])


def batches(ds, batch_size: int, sort_by_width: bool = True, bounded: bool = False):
    """Yield (indices, float32 images, labels). Sorting by width keeps padding small.

    ``bounded``: a batch also holds at most ``batch_size`` lines of the set's median width in
    padded pixels, so a batch of wide lines has fewer of them. Memory then follows the median
    line, not the widest one, which grows with the size of the set (calibration)."""
    widths = np.asarray(ds["width"])
    order = np.argsort(widths, kind="stable") if sort_by_width else np.arange(len(widths))
    for idx in _cut(order, widths, batch_size, bounded):
        rows = ds.select(idx)
        images = [ocr_data.to_array(r) for r in rows]
        yield idx, ocr_data.collate(images), [r["text"] for r in rows]


def _cut(order, widths, batch_size: int, bounded: bool):
    if not bounded:
        for k in range(0, len(order), batch_size):
            yield [int(i) for i in order[k:k + batch_size]]
        return
    budget = batch_size * float(np.median(widths)) if len(widths) else 0.0
    idx: list[int] = []
    for i in order:
        # padded to the widest line in the batch, as collate does
        if idx and (len(idx) + 1) * max(widths[idx + [i]]) > budget or len(idx) == batch_size:
            yield idx
            idx = []
        idx.append(int(i))
    if idx:
        yield idx
