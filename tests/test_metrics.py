"""Generic metrics: top-k, CTC with a user's character set, label-free agreement, and directions."""
import math

import numpy as np
import onnx
import pytest

from pipeline.metrics import SPECS, agreement, classification, ctc


def test_topk_counts_hits_and_refuses_outputs_that_do_not_fit():
    logits = np.array([[0.1, 0.7, 0.2], [0.5, 0.1, 0.4], [0.2, 0.3, 0.5]])
    assert classification.topk(logits, [1, 2, 2], ks=(1, 2)) == pytest.approx(
        {"top1": 100 * 2 / 3, "top2": 100.0})
    with pytest.raises(ValueError, match="does not fit 3 classes"):
        classification.topk(logits, [0, 1, 3])
    with pytest.raises(ValueError, match=r"\[batch, classes\]"):
        classification.topk(logits[None], [0, 1, 2])
    assert list(classification.label_ids(["b", "a"], ["a", "b"])) == [1, 0]
    with pytest.raises(ValueError, match="not among"):
        classification.label_ids(["z"], ["a", "b"])


def _frames(indices, classes):
    out = np.full((len(indices), classes), -5.0)
    out[np.arange(len(indices)), indices] = 5.0
    return out


def test_ctc_decodes_with_the_users_charset_and_scores():
    charset = list("abc")
    # "a a _ b _ b c" -> "abbc"; blanks separate repeats
    logits = _frames([1, 1, 0, 2, 0, 2, 3], 4)[None]
    assert ctc.greedy_decode(logits, charset) == ["abbc"]
    assert ctc.greedy_decode(logits.transpose(1, 0, 2), charset, time_major=True) == ["abbc"]
    with pytest.raises(ValueError, match="a character set of 2 plus the blank needs 3"):
        ctc.greedy_decode(logits, list("ab"))
    s = ctc.score(["abbc", "ab"], ["abbc", "abc"])
    assert s["sequence_accuracy"] == 50.0 and s["cer"] == pytest.approx(100 * 1 / 7)


def test_charset_from_a_file_or_the_onnx_metadata(tmp_path):
    (tmp_path / "lines.txt").write_text("a\n \nb\n")
    assert ctc.charset_from_file(tmp_path / "lines.txt") == ["a", " ", "b"]
    (tmp_path / "one.txt").write_text("0123456789\n")
    assert ctc.charset_from_file(tmp_path / "one.txt") == list("0123456789")
    (tmp_path / "bad.txt").write_text("ab\ncd\n")
    with pytest.raises(ValueError, match="one character per line"):
        ctc.charset_from_file(tmp_path / "bad.txt")
    model = onnx.ModelProto()
    assert ctc.charset_from_onnx(model) is None
    onnx.helper.set_model_props(model, {"charset": "xyz"})
    assert ctc.charset_from_onnx(model) == list("xyz")


def test_agreement_without_labels():
    rng = np.random.default_rng(0)
    base = [rng.normal(size=(4, 10)) for _ in range(3)]
    same = agreement.agreement(base, [b.copy() for b in base])
    assert same["argmax_agreement"] == 100.0 and same["cosine_p1"] == pytest.approx(1.0)
    assert same["max_abs_diff"] == 0.0
    noisy = agreement.agreement(base, [b + rng.normal(scale=0.5, size=b.shape) for b in base])
    assert noisy["cosine_mean"] < 1.0 and noisy["cosine_p1"] <= noisy["cosine_mean"]
    assert 0 < noisy["mean_abs_diff"] < noisy["max_abs_diff"]
    flipped = agreement.agreement(base, [-b for b in base])
    assert flipped["cosine_mean"] == pytest.approx(-1.0)
    # A continuous one-value output has no class axis: no argmax agreement is claimed.
    assert "argmax_agreement" not in agreement.agreement([np.ones((2, 1))], [np.ones((2, 1))])
    with pytest.raises(ValueError, match="output shapes differ"):
        agreement.agreement([np.ones((2, 3))], [np.ones((2, 4))])


def test_a_row_of_nan_agrees_with_nothing_and_warns_nothing():
    """A kernel that overflowed (static INT8 of a DeBERTa on OpenVINO gave NaN on one row of a
    batch): that row's cosine is 0, so the mean and the 1st percentile are numbers the gate can
    judge and print, not NaN, and numpy prints no RuntimeWarning on the user's terminal."""
    import warnings

    base = [np.ones((4, 3))]
    bad = np.ones((4, 3))
    bad[1] = np.nan
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = agreement.agreement(base, [bad])
    assert out["cosine_mean"] == pytest.approx(0.75) and out["cosine_p1"] == pytest.approx(0.0,
                                                                                          abs=0.04)
    assert out["argmax_agreement"] <= 100.0


def test_every_metric_has_a_direction_and_drop_is_positive_when_worse():
    assert SPECS["top1"].drop(90.0, 89.5) == pytest.approx(0.5)
    assert SPECS["cer"].drop(1.0, 1.5) == pytest.approx(0.5)  # lower is better: a rise is a drop
    assert SPECS["max_abs_diff"].higher_is_better is False
    assert not SPECS["cosine_mean"].needs_labels and SPECS["top1"].needs_labels
    assert math.isnan(SPECS["top1"].drop(90.0, float("nan")))


def test_spearman_of_sentence_pairs_ranks_ties_and_pairs_up_sides():
    from pipeline.metrics import pairs

    # average ranks for ties, then Pearson of the ranks (scipy.stats.spearmanr's definition)
    assert list(pairs.ranks([3.0, 1.0, 3.0, 2.0])) == [3.5, 1.0, 3.5, 2.0]
    assert pairs.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert pairs.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert pairs.spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(0.9486832980505138)
    assert math.isnan(pairs.spearman([1, 1, 1], [1, 2, 3]))   # a constant has no ranking
    assert math.isnan(pairs.spearman([1, 2], [1, 2]))         # too few pairs to rank
    # two sides per pair, in any order; a pair with one side in the subset is left out
    e = {"a": [1.0, 0.0], "b": [1.0, 0.1], "c": [0.0, 1.0], "d": [1.0, 1.0]}
    emb = [e["a"], e["b"], e["a"], e["c"], e["d"], e["a"], e["c"]]
    lab = [{"pair": 7, "gold": 5.0}, {"pair": 7, "gold": 5.0}, {"pair": 8, "gold": 0.0},
           {"pair": 8, "gold": 0.0}, {"pair": 9, "gold": 2.0}, {"pair": 9, "gold": 2.0},
           {"pair": 10, "gold": 1.0}]
    cos, gold = pairs.pair_cosines(emb, lab)
    assert gold == [5.0, 0.0, 2.0] and cos == pytest.approx([1 / math.sqrt(1.01), 0.0,
                                                            1 / math.sqrt(2)])
    assert pairs.score(emb, lab) == {"spearman": pytest.approx(1.0)}


def test_a_dense_map_is_compared_within_a_tolerance_not_by_the_argmax_of_its_width():
    """A text detector's probability map [batch, 1, height, width] ends in a dynamic width: its
    argmax along the width is no decision, and counting identical ones read 0 % agreement for an
    INT8 map 44 % of whose rows were within the tolerance. The output's declaration says whether
    it ends in a class axis; without one the rows are compared as continuous outputs."""
    from pipeline.metrics.outputs import agrees
    from pipeline.models.user_task import agreement_predictions

    rng = np.random.default_rng(0)
    maps = rng.uniform(size=(2, 1, 4, 6))
    close = maps * 1.01
    dense = agreement_predictions(maps, classes=False)
    assert all(p["decision"] is None for p in dense)
    assert all(agrees(a, b) for a, b in zip(agreement_predictions(close, classes=False), dense))
    logits = agreement_predictions(rng.normal(size=(2, 5)), classes=True)
    assert all(p["decision"] is not None for p in logits)


def test_an_output_of_boxes_and_scores_is_judged_part_by_part():
    """A detector's [batch, 4 + classes, anchors] output: the per-sample cosine is the boxes'
    (hundreds of pixels), so scores all rounded to 0 read 0.999; ``cosine_parts`` compares the
    scores on their own, pooled over the samples."""
    from pipeline.metrics.agreement import agreement

    rng = np.random.default_rng(0)
    refs, dead, noisy = [], [], []
    for _ in range(20):
        boxes = rng.uniform(0, 320, (1, 4, 50))
        scores = 1 / (1 + np.exp(-rng.normal(-6, 2, (1, 3, 50))))  # mostly near 0, some peaks
        refs.append(np.concatenate([boxes, scores], axis=1))
        dead.append(np.concatenate([boxes + rng.normal(0, 0.5, boxes.shape), 0 * scores], axis=1))
        noisy.append(np.concatenate([boxes + rng.normal(0, 0.5, boxes.shape),
                                     np.round(scores * 255) / 255], axis=1))
    broken = agreement(refs, dead, parts=True)
    assert broken["cosine_mean"] > 0.999 and broken["cosine_parts"] == 0.0
    fine = agreement(refs, noisy, parts=True)
    assert fine["cosine_parts"] > 0.99, fine
    assert "cosine_parts" not in agreement(refs, noisy)  # only where the task declares the axis
    one = [np.full((1, 3, 4), 2.0)]  # channels of one range: one part, the pooled cosine
    assert agreement(one, [np.full((1, 3, 4), 3.0)], parts=True)["cosine_parts"] == \
        pytest.approx(1.0)
    assert agreement(one, [np.full((1, 3, 4), np.nan)], parts=True)["cosine_parts"] == 0.0
