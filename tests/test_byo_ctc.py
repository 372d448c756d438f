"""Bring your own model: a text recognizer that exists only as an ONNX file plus a character set,
end to end (the README's second worked example).

The test trains a tiny CTC recognizer in a few seconds on generated "text lines": each character
of ``CHARS`` is a coloured band at its own height, a few columns wide, with background columns
between characters, on a noisy background of random colour. It exports it at opset 12 (the
pipeline upgrades it), writes a labels file and a character-set file, and runs
``model=onnx metric=ctc metric.charset=...`` through the real command line. A second case reads
the character set from the model's metadata instead.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.test_byo import _report, _run  # the FAST settings of test_byo

CHARS = "ABCD"
HEIGHT = 16
DATA = ["data=labels_file", "data.image.resize=height", f"data.image.height={HEIGHT}",
        "data.image.pad_width_multiple=4", "data.calibration_samples=40",
        "data.evaluation_samples=80"]


def line(rng: np.random.Generator) -> tuple[np.ndarray, str]:
    """An RGB uint8 image [HEIGHT, W] of 2-5 characters and its label."""
    text = "".join(rng.choice(list(CHARS), size=int(rng.integers(2, 6))))
    bg, fg = rng.uniform(0, 90, 3), rng.uniform(160, 255, 3)
    cols = [np.broadcast_to(bg, (HEIGHT, int(rng.integers(1, 4)), 3))]
    band = HEIGHT // len(CHARS)
    for ch in text:
        glyph = np.broadcast_to(bg, (HEIGHT, int(rng.integers(3, 6)), 3)).copy()
        k = CHARS.index(ch)
        glyph[k * band:(k + 1) * band] = fg
        cols += [glyph, np.broadcast_to(bg, (HEIGHT, int(rng.integers(1, 4)), 3))]
    img = np.concatenate(cols, axis=1) + rng.normal(0, 12, (HEIGHT, sum(c.shape[1] for c in cols), 3))
    return np.clip(img, 0, 255).astype(np.uint8), text


def recognizer():
    import torch
    from torch import nn

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.features = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(),
                                          nn.Conv2d(16, 16, 3, padding=1, stride=(2, 1)), nn.ReLU())
            self.head = nn.Conv2d(16, len(CHARS) + 1, (HEIGHT // 2, 1))  # folds the height

        def forward(self, x):
            return self.head(self.features(x)).squeeze(2).permute(0, 2, 1)  # [N, W, classes]

    torch.manual_seed(0)
    return Tiny()


def train(steps: int = 150):
    """CTC on fresh lines, preprocessed as the pipeline will (scale 1/255, width padded)."""
    import torch

    net = recognizer()
    opt = torch.optim.Adam(net.parameters(), lr=0.01)
    ctc = torch.nn.CTCLoss(blank=0, zero_infinity=True)
    rng = np.random.default_rng(7)
    for _ in range(steps):
        lines = [line(rng) for _ in range(32)]
        w = max(im.shape[1] for im, _ in lines)
        x = np.stack([np.pad(im, ((0, 0), (0, w - im.shape[1]), (0, 0)), mode="edge")
                      for im, _ in lines]).astype(np.float32).transpose(0, 3, 1, 2) / 255.0
        tgt = torch.tensor([CHARS.index(c) + 1 for _, t in lines for c in t])
        logp = net(torch.from_numpy(x)).log_softmax(-1).permute(1, 0, 2)
        loss = ctc(logp, tgt, torch.full((32,), logp.shape[0]), torch.tensor([len(t) for _, t in lines]))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return net.eval()


@pytest.fixture(scope="module")
def lines(tmp_path_factory):
    """The trained recognizer as ``ctc.onnx`` (and ``ctc-meta.onnx``, the character set in its
    metadata), ``chars.txt``, and ``lines/`` with ``labels.jsonl``."""
    import onnx
    import torch
    from PIL import Image

    root = tmp_path_factory.mktemp("byo-ctc")
    net = train()
    torch.onnx.export(net, (torch.zeros(1, 3, HEIGHT, 40),), str(root / "ctc.onnx"), dynamo=False,
                      opset_version=12, input_names=["image"], output_names=["logits"],
                      dynamic_axes={"image": {0: "batch", 3: "width"},
                                    "logits": {0: "batch", 1: "time"}})
    model = onnx.load(str(root / "ctc.onnx"))
    onnx.helper.set_model_props(model, {"charset": CHARS})
    onnx.save(model, str(root / "ctc-meta.onnx"))
    (root / "chars.txt").write_text(CHARS + "\n")
    folder = root / "lines"
    folder.mkdir()
    rng, rows = np.random.default_rng(11), []
    for n in range(120):
        img, text = line(rng)
        Image.fromarray(img, "RGB").save(folder / f"{n}.png")
        rows.append(json.dumps({"file": f"{n}.png", "label": text}))
    (folder / "labels.jsonl").write_text("\n".join(rows) + "\n")
    return root


def _data(root: Path) -> list[str]:
    return [*DATA, f"data.path={root / 'lines'}", f"data.labels={root / 'lines' / 'labels.jsonl'}"]


@pytest.mark.slow
def test_onnx_text_recognizer_with_a_charset_file(lines):
    # one label with a character outside the set: warned on the terminal and in both reports
    rows = (lines / "lines" / "labels.jsonl").read_text().splitlines()
    first = json.loads(rows[0])
    rows[0] = json.dumps({**first, "label": first["label"] + "z"})
    labels = lines / "lines" / "labels-z.jsonl"
    labels.write_text("\n".join(rows) + "\n")
    proc = _run(lines, "ctc", "model=onnx", f"model.path={lines / 'ctc.onnx'}",
                *_data(lines)[:-1], f"data.labels={labels}",
                "metric=ctc", f"metric.charset={lines / 'chars.txt'}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rep = _report(lines, "ctc")
    assert rep["labels_outside_charset"] == {"labels": 1, "of": 120, "characters": "z"}
    warning = next(w for w in rep["warnings"] if "outside the character set" in w)
    assert "1 of 120 labels" in warning and warning in proc.stderr
    assert f"**Warning:** {warning}" in (lines / "ctc" / "runs" / "latest" / "report.md").read_text()
    assert [(m["name"], m["primary"]) for m in rep["metrics"]] == [
        ("sequence_accuracy", True), ("cer", False)]
    rows = {r["role"]: r for r in rep["rows"]}
    # The model really reads the lines: most are exact, few characters wrong.
    assert rows["fp32"]["sequence_accuracy"] >= 80.0 and rows["fp32"]["cer"] <= 5.0
    assert rows["candidate"]["sequence_accuracy"] >= rows["fp16"]["sequence_accuracy"] - 10.0
    check = next(c for c in rep["verdict"]["checks"] if c["check"] == "accuracy_drop")
    assert "sequence_accuracy" in check["detail"]
    stages = {s["label"] for s in rep["stages"]}
    assert "import" in stages and "calibrate[minmax]" in stages and "load" not in stages
    contract = rep["timing"]["input_contract"]
    assert contract["input"] == "image" and contract["shape"][1:3] == [
        {"min": 3, "max": 3}, {"min": HEIGHT, "max": HEIGHT}]
    assert contract["shape"][3]["max"] > contract["shape"][3]["min"]  # widths from the data


@pytest.mark.slow
def test_charset_from_the_onnx_metadata(lines):
    """No ``metric.charset``: the task reads the character set from the model's metadata and
    decodes the file's outputs with it (in process: the decoding is all that differs from the
    run above)."""
    import onnxruntime as ort

    from pipeline.engine.compose import compose
    from pipeline.models import task
    from pipeline.task.contract import check
    from pipeline.models.sources import task_key

    cfg = compose(["model=onnx", f"model.path={lines / 'ctc-meta.onnx'}", *_data(lines),
                   "metric=ctc"])
    t = task(task_key(cfg.model, cfg.data, cfg.metric, str(lines / "meta")))
    assert check(t) == [] and t.charset == list(CHARS)
    session = ort.InferenceSession(str(lines / "ctc-meta.onnx"), providers=["CPUExecutionProvider"])
    predictions, labels = [], []
    for batch in t.batches(t.dataset(t.split("evaluation", 80, "")), 16):
        predictions += t.predictions(session.run(None, batch.feeds)[0])
        labels += batch.labels
    scores = t.score(predictions, labels)
    assert scores["sequence_accuracy"] >= 80.0 and scores["cer"] <= 5.0


def test_a_charset_edited_in_place_is_a_new_key(lines, tmp_path):
    """The file's contents key the task, as a data file's do: swapping two lines of the set in
    place reused every stage and reported the old accuracy."""
    from pipeline.engine.compose import compose
    from pipeline.models.sources import task_key

    chars = tmp_path / "chars.txt"
    chars.write_text("\n".join(CHARS) + "\n")

    def key():
        cfg = compose(["model=onnx", f"model.path={lines / 'ctc.onnx'}", *_data(lines),
                       "metric=ctc", f"metric.charset={chars}"])
        return task_key(cfg.model, cfg.data, cfg.metric, str(tmp_path / "cache"))

    before = key()
    chars.write_text("\n".join(CHARS[::-1]) + "\n")
    assert key() != before and key().metric == before.metric  # the same path, other contents


@pytest.mark.slow
def test_paddleocrs_character_metadata_gets_the_space_its_decoder_appends(lines, tmp_path):
    """PaddleOCR's exports keep their dictionary under ``character``, one per line, and their
    decoder appends a space as the last class: with 5 classes (the blank and 4), a list of 3
    is A, B, C and the space. A list of as many lines given as a file says what it lacks."""
    import onnx

    from pipeline.core.errors import ConfigError
    from pipeline.engine.compose import compose
    from pipeline.models import task
    from pipeline.models.sources import task_key

    model = onnx.load(str(lines / "ctc.onnx"))
    onnx.helper.set_model_props(model, {"character": "\n".join(CHARS[:3])})
    onnx.save(model, str(tmp_path / "paddle.onnx"))
    (tmp_path / "dict.txt").write_text("\n".join(CHARS[:3]) + "\n")

    def made(*extra):
        cfg = compose(["model=onnx", f"model.path={tmp_path / 'paddle.onnx'}", *_data(lines),
                       "metric=ctc", *extra])
        return task(task_key(cfg.model, cfg.data, cfg.metric, str(tmp_path / "cache")))

    assert made().charset == [*CHARS[:3], " "]
    with pytest.raises(ConfigError, match="has 5 classes.*needs 4 .PaddleOCR's recognizers "
                                          "have a space"):
        made(f"metric.charset={tmp_path / 'dict.txt'}").metrics
