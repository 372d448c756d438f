"""A request's bytes to the model's input, in process (no server): the OCR task's ``from_image``
is the evaluation's own preprocessing for an evaluation line, and brings any other image to the
model's height; ``open_image`` judges a header before decoding it."""
from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from pipeline.models.ocr import crnn
from pipeline.models.ocr import data as ocr_data
from pipeline.serve.inputs import BadInput, Limits, open_image
from pipeline.serve.readers import prepare
from tests.serve_helpers import png, png_claiming

LIMITS = Limits(max_body_bytes=1 << 20, max_pixels=1 << 22, max_side=1 << 13)


def _lines(n: int = 8):
    return [ocr_data.to_array(s) for s in ocr_data.generate(seed=2, count=n)]


def test_an_evaluation_line_reaches_the_model_as_the_evaluation_feeds_it():
    for line in _lines():
        image = open_image(png(line), "image/png", LIMITS)
        assert np.array_equal(crnn.from_image(image), ocr_data.collate([line]))


@pytest.mark.parametrize("scale,mode", [(4.0, "L"), (2.5, "RGB"), (0.5, "RGB")])
def test_any_size_is_brought_to_the_models_height_keeping_the_aspect(scale, mode):
    line = _lines(1)[0]
    img = Image.fromarray(line).convert(mode)
    img = img.resize((round(img.width * scale), round(img.height * scale)))
    feeds = crnn.from_image(img)
    assert feeds.shape[:3] == (1, 1, ocr_data.HEIGHT)
    assert feeds.shape[3] % ocr_data.WIDTH_MULTIPLE == 0
    assert abs(feeds.shape[3] - line.shape[1]) <= ocr_data.WIDTH_MULTIPLE + 1
    assert feeds.dtype == np.float32 and -1.0 <= feeds.min() and feeds.max() <= 1.0


def test_prepare_reports_the_size_the_batcher_groups_by():
    line = _lines(1)[0]
    p = prepare(png(line), "image/png", LIMITS, "ocr")
    assert p.size == line.shape[1] and p.feeds["image"].shape == (1, 1, 32, line.shape[1])


def test_a_bomb_is_refused_from_its_header_alone():
    with pytest.raises(BadInput) as e:
        open_image(png_claiming(40000, 40000), "image/png", LIMITS)
    assert e.value.status == 413 and "40000x40000" in e.value.line


@pytest.mark.parametrize("body,ctype,status", [
    (b"", "image/png", 400), (b"GIF89a" + b"\0" * 32, "image/gif", 415),
    (b"\xff\xfe\xfd", "text/plain", 400), ("plain words".encode(), "text/plain", 415)])
def test_other_bodies_are_refused_with_their_status(body, ctype, status):
    with pytest.raises(BadInput) as e:
        open_image(body, ctype, LIMITS)
    assert e.value.status == status and "\n" not in e.value.line


def test_a_gif_is_not_served():
    buf = io.BytesIO()
    Image.new("L", (8, 8)).save(buf, format="GIF")
    with pytest.raises(BadInput) as e:
        open_image(buf.getvalue(), "image/gif", LIMITS)
    assert e.value.status == 415 and "GIF" in e.value.line


def test_a_text_classifier_reads_text_as_its_tokenizer_does_and_answers_class_and_score(tmp_path):
    """The text reader in process: a tiny BERT classifier's folder (no model run: the outputs are
    given), its tokenizer reading plain text and JSON alike, padding a batch with the pad id, and
    logits decoded into the top class, its label and its softmax score."""
    import json

    from tests import hf_tiny
    from pipeline.models.hf_folder import folder_tokenizer
    from pipeline.config.metrics import MetricName
    from pipeline.serve.readers import TextKey, reader
    from pipeline.task.serving import TextInput

    folder = hf_tiny.bert(tmp_path / "cls", task="sequence-classification", num_labels=3)
    tok = folder_tokenizer(folder)
    spec = TextInput(task="sequence-classification",
                     input_names=("input_ids", "attention_mask", "token_type_ids"), max_length=8,
                     pad_token_id=tok.pad_token_id, metric=MetricName.classification, top_k=2,
                     labels=("neg", "mid", "pos"), files={})
    r_key = TextKey(str(folder), spec)
    r = reader(r_key)
    text = "the quick brown fox jumps over a lazy dog while seven small birds sing"
    plain = prepare(text.encode(), "text/plain", LIMITS, r_key)
    as_json = prepare(json.dumps({"text": text}).encode(), "application/json", LIMITS, r_key)
    expected = tok(text, truncation=True, max_length=8)["input_ids"]
    assert plain.feeds["input_ids"].tolist() == [expected] == as_json.feeds["input_ids"].tolist()
    assert plain.size == 8  # truncated to max_length, as the evaluation truncates
    short = prepare(b"the fox", "text/plain", LIMITS, r_key)
    batch = r.stack([plain.feeds, short.feeds])
    assert batch["input_ids"].shape == (2, 8)
    assert (batch["input_ids"][1, short.size:] == tok.pad_token_id).all()
    assert (batch["attention_mask"][1, short.size:] == 0).all()
    logits = np.log(np.array([[0.2, 0.7, 0.1], [0.6, 0.1, 0.3]]))
    answers = r.answers(logits)
    assert answers[0] == {"class": 1, "label": "mid", "score": 0.7, "top_k": [1, 0]}
    assert answers[1]["label"] == "neg" and answers[1]["top_k"] == [0, 2]
    with pytest.raises(BadInput, match="UTF-8"):
        prepare(b"\xff\xfe", "text/plain", LIMITS, r_key)
    with pytest.raises(BadInput, match="reads text") as e:
        prepare(png(_lines(1)[0]), "image/png", LIMITS, r_key)
    assert e.value.status == 415
