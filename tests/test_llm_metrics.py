"""The decoder scores' arithmetic (perplexity, top-1 agreement, KL) on hand-made logits, and the
teacher-forced logits of a built tiny decoder against its own step-by-step decode."""
from __future__ import annotations

import math

import numpy as np
import pytest

from pipeline.metrics.generation import next_token_logits, score


def test_uniform_logits_have_the_vocabulary_as_perplexity():
    ids = [[1, 2, 3, 4], [0, 5]]
    logits = [np.zeros((4, 7)), np.zeros((2, 7))]
    s = score(logits, ids)
    assert s.perplexity == pytest.approx(7.0)
    assert s.top1_agreement is None and s.kl_mean is None


def test_perplexity_is_exp_of_the_mean_nll_of_each_next_token():
    # position t predicts token t+1: the last row is never scored
    lg = np.log(np.array([[0.5, 0.25, 0.25], [0.1, 0.8, 0.1], [1 / 3, 1 / 3, 1 / 3]]))
    s = score([lg], [[0, 0, 1]])
    assert s.perplexity == pytest.approx(math.exp(-(math.log(0.5) + math.log(0.8)) / 2))


def test_agreement_and_kl_against_a_reference():
    ref = np.log(np.array([[0.7, 0.2, 0.1], [0.1, 0.6, 0.3], [0.3, 0.3, 0.4]]))
    cand = np.log(np.array([[0.6, 0.3, 0.1], [0.2, 0.3, 0.5], [0.3, 0.3, 0.4]]))
    ids = [[0, 1, 2]]
    same = score([ref], ids, [ref])
    assert same.top1_agreement == 1.0 and same.kl_mean == pytest.approx(0.0, abs=1e-12)
    s = score([cand], ids, [ref])
    assert s.top1_agreement == 0.5  # row 0 agrees (0), row 1 does not (1 vs 2)
    pr, pc = np.exp(ref[:2]), np.exp(cand[:2])
    assert s.kl_mean == pytest.approx(float((pr * np.log(pr / pc)).sum()) / 2)


def test_nothing_to_score_is_refused():
    with pytest.raises(ValueError, match="two tokens"):
        score([np.zeros((1, 3))], [[1]])


@pytest.fixture(scope="module")
def tiny_built(tmp_path_factory):
    from llm_tiny import built, llama

    root = tmp_path_factory.mktemp("llm")
    return built(llama(root / "hf"), root / "onnx")


@pytest.mark.slow  # the builder's import and export
def test_teacher_forced_logits_match_the_kv_cache_decode(tiny_built):
    """One pass over the sequence gives the logits a token-by-token decode with the KV cache
    gives (what generation runs), so perplexity measures the model users get."""
    from pipeline.metrics.generation import empty_past, session

    ids = [0, 5, 17, 42, 9, 3]
    full = next_token_logits(tiny_built, [ids])[0]
    assert full.shape == (len(ids), 300)
    sess = session(tiny_built)
    names = [o.name for o in sess.get_outputs()]
    feeds = empty_past(tiny_built, sess)
    for t, tok in enumerate(ids):
        outs = dict(zip(names, sess.run(None, {"input_ids": np.array([[tok]], np.int64),
                                               "attention_mask": np.ones((1, t + 1), np.int64),
                                               **feeds})))
        np.testing.assert_allclose(outs["logits"][0, 0], full[t], rtol=1e-4, atol=1e-4)
        feeds = {k: outs[k.replace("past_key_values", "present")] for k in feeds}


def test_scores_of_parts_add_up_to_the_whole():
    from pipeline.metrics.generation import from_sums, sums

    rng = np.random.default_rng(0)
    ids = [list(rng.integers(0, 9, n)) for n in (5, 3, 7)]
    cand = [rng.normal(size=(len(i), 9)) for i in ids]
    ref = [c + rng.normal(scale=0.5, size=c.shape) for c in cand]
    whole = score(cand, ids, ref)
    parts = sums(cand[:1], ids[:1], ref[:1]) + sums(cand[1:], ids[1:], ref[1:])
    got = from_sums(parts, True)
    assert (got.perplexity, got.top1_agreement, got.kl_mean) == pytest.approx(
        (whole.perplexity, whole.top1_agreement, whole.kl_mean))


@pytest.mark.slow  # the builder's import and export, two quantizations
def test_the_reference_runs_at_accuracy_level_0(tiny_built, tmp_path):
    """A model quantized at level 4, run with accuracy_level=0, gives the logits of the same
    weights built at level 0 (the attribute is what changes, nothing else), and its file on
    disk is left as built."""
    from types import SimpleNamespace

    from pipeline.core.artifact import digest_files
    from pipeline.stages.weight_only import WeightOnly, matmuls

    parent = SimpleNamespace(path=tiny_built, model=tiny_built / "model.onnx",
                             files=digest_files(tiny_built))
    plan = tuple((n, 8) for n in matmuls(tiny_built))
    folders = {}
    for level in (4, 0):
        folders[level] = tmp_path / f"level{level}"
        folders[level].mkdir()
        WeightOnly(plan, 32, True, "rtn", level).run(parent, folders[level])
    before = digest_files(folders[4])
    ids = [[0, 5, 17, 42, 9, 3, 88, 120]]
    as_level0 = next_token_logits(folders[4], ids, accuracy_level=0)[0]
    np.testing.assert_array_equal(as_level0, next_token_logits(folders[0], ids)[0])
    # (on a CPU with int8 kernels level 4 itself differs: then the override is what matched)
    assert digest_files(folders[4]) == before
