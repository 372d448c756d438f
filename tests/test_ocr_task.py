"""The OCR task: generator determinism, disjoint sets, decoding and metrics, the checkpoint."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from pipeline.models.ocr import crnn as ocr
from pipeline.models.ocr import data as ocr_data
from pipeline.models.ocr.decode import edit_distance, greedy_decode, score

CHECKPOINT = Path(__file__).resolve().parent.parent / "pipeline/models/checkpoints/ocr_crnn.safetensors"


def test_generator_is_deterministic_and_in_spec():
    a, b = list(ocr_data.generate(7, 50)), list(ocr_data.generate(7, 50))
    assert a == b
    assert a != list(ocr_data.generate(8, 50))
    for s in a:
        img = ocr_data.to_array(s)
        assert img.shape[0] == ocr_data.HEIGHT and img.shape[1] % ocr_data.WIDTH_MULTIPLE == 0
        assert ocr_data.MIN_LEN <= len(s["text"]) <= ocr_data.MAX_LEN
        assert set(s["text"]) <= set(ocr_data.ALPHABET)
    assert len({s["width"] for s in a}) > 10, "widths should vary"


def test_collate_pads_with_edge_pixels():
    ims = [np.full((32, 8), 200, np.uint8), np.full((32, 16), 10, np.uint8)]
    x = ocr_data.collate(ims)
    assert x.shape == (2, 1, 32, 16) and x.dtype == np.float32
    assert np.allclose(x[0, 0, :, 8:], 200 / 127.5 - 1)


def test_calibration_and_evaluation_sets_share_no_sample(tmp_path):
    cal, cal_digest = ocr.dataset("calibration", 300, tmp_path)
    ev, ev_digest = ocr.dataset("evaluation", 300, tmp_path)
    assert cal_digest != ev_digest
    assert not set(ocr.sample_hashes(cal)) & set(ocr.sample_hashes(ev))


def test_dataset_is_rebuilt_when_damaged(tmp_path):
    ds, digest = ocr.dataset("evaluation", 20, tmp_path)
    folder = next((tmp_path / "ocr").iterdir())
    (folder / "digest.json").write_text(json.dumps({"sha256": "0" * 64}))
    again, digest2 = ocr.dataset("evaluation", 20, tmp_path)
    assert digest2 == digest and json.loads((folder / "digest.json").read_text())["sha256"] == digest


def test_greedy_decode_merges_repeats_and_drops_blanks():
    # frames: A A blank A B B blank  -> "AAB"
    idx = [11, 11, 0, 11, 12, 12, 0]
    logits = np.full((1, len(idx), 37), -5.0)
    logits[0, np.arange(len(idx)), idx] = 5.0
    assert greedy_decode(logits) == ["AAB"]


def test_metrics():
    assert edit_distance("ABC", "ABD") == 1 and edit_distance("", "AB") == 2
    m = score(["ABC", "XY"], ["ABC", "XYZ"])
    assert m["sequence_accuracy"] == 50.0
    assert m["cer"] == pytest.approx(100 * 1 / 6)
    with pytest.raises(ValueError):
        score(["A"], [])


def test_checkpoint_matches_its_card():
    card = json.loads(CHECKPOINT.with_suffix(".json").read_text())
    assert hashlib.sha256(CHECKPOINT.read_bytes()).hexdigest() == card["sha256"]
    assert 1_000_000 <= card["parameters"] <= 5_000_000
    assert CHECKPOINT.stat().st_size < 20e6
    assert "ocr_train" in card["command"]


@pytest.mark.slow
def test_checkpoint_accuracy_on_a_held_out_sample(tmp_path):
    """The committed weights read held-out lines (a sample of the 2,000-line evaluation set)."""
    import torch
    from safetensors.torch import load_file

    card = json.loads(CHECKPOINT.with_suffix(".json").read_text())
    net = ocr.build_network(card["widths"], card["hidden"], load_file(str(CHECKPOINT)))
    ds, _ = ocr.dataset("evaluation", 300, tmp_path)
    preds, labels = [], []
    with torch.inference_mode():
        for _, images, texts in ocr.batches(ds, 50):
            preds += ocr.decode(net(torch.from_numpy(images)).numpy())
            labels += texts
    assert score(preds, labels)["sequence_accuracy"] >= 96.0


def test_bounded_batches_follow_the_median_line_not_the_widest():
    import numpy as np

    from pipeline.models.ocr.crnn import _cut

    rng = np.random.default_rng(0)
    for n in (64, 1024):
        widths = rng.integers(60, 60 + n // 2, size=n)  # a bigger set reaches wider lines
        order = np.arange(n)
        cuts = list(_cut(order, widths, 32, bounded=True))
        assert sorted(i for c in cuts for i in c) == list(range(n))  # each line once, in order
        budget = 32 * np.median(widths)
        assert all(len(c) <= 32 and (len(c) == 1 or len(c) * widths[c].max() <= budget) for c in cuts)
    assert [len(c) for c in _cut(np.arange(70), np.full(70, 100), 32, bounded=False)] == [32, 32, 6]
