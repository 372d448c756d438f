"""Scoring a decoder against FP32 once: the reference's top-k summary gives the scores the full
logits give (perplexity and agreement exactly, KL as a lower bound equal at k = vocabulary);
FP32's session is opened once however many candidates are scored; sequential scoring stops at its
floor on clear cases (a candidate far inside or far outside the limits) and runs to the end on a
borderline one (its full-text rise is the limit itself)."""
from __future__ import annotations

import math
from types import SimpleNamespace as NS

import numpy as np
import pytest

from pipeline.metrics import generation
from pipeline.metrics.generation import reference, row_sums, score


def _text(seed: int, sequences: int, length: int, vocab: int):
    rng = np.random.default_rng(seed)
    ids = [list(rng.integers(0, vocab, length)) for _ in range(sequences)]
    ref = [rng.normal(scale=2.0, size=(length, vocab)) for _ in ids]
    return rng, ids, ref


def test_the_top_k_summary_gives_the_full_logits_scores():
    rng, ids, ref = _text(0, 6, 9, 40)
    cand = [r + rng.normal(scale=0.7, size=r.shape) for r in ref]
    full = score(cand, ids, ref)
    rows = row_sums(cand, ids, reference(ref, ids, k=8))
    n = rows[:, 0].sum()
    assert n == sum(len(i) - 1 for i in ids)
    assert math.exp(rows[:, 1].sum() / n) == pytest.approx(full.perplexity)
    assert math.exp(rows[:, 2].sum() / n) == pytest.approx(score(ref, ids).perplexity)
    assert rows[:, 3].sum() / n == full.top1_agreement
    top8 = rows[:, 4].sum() / n
    assert 0 < top8 <= full.kl_mean  # k tokens and "the rest": never above the full KL
    everything = row_sums(cand, ids, reference(ref, ids, k=40))[:, 4].sum() / n
    assert everything == pytest.approx(full.kl_mean, rel=1e-4)  # log-probs kept as float32
    assert top8 < everything


class _Sessions:
    """``generation.session`` as it is, counting the sessions opened per folder."""

    def __init__(self, monkeypatch):
        self.opened: dict[str, int] = {}
        real = generation.session

        def counted(folder, *a, **k):
            self.opened[str(folder)] = self.opened.get(str(folder), 0) + 1
            return real(folder, *a, **k)

        monkeypatch.setattr(generation, "session", counted)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from llm_tiny import built, llama

    root = tmp_path_factory.mktemp("llm-scoring")
    return built(llama(root / "hf"), root / "onnx")


@pytest.mark.slow  # the builder's export and two quantizations
def test_fp32_runs_once_however_many_candidates_are_scored(tiny, tmp_path, monkeypatch):
    """text_reference opens FP32's session once; scoring an INT8 and an INT4 candidate against
    its file opens only their own, and gives the perplexity and agreement that both models'
    full logits give (FP32 at accuracy level 0, as before)."""
    from pipeline.core.artifact import digest_files
    from pipeline.stages.score_text import ScoreText
    from pipeline.stages.text_reference import TextReference
    from pipeline.stages.weight_only import WeightOnly, matmuls

    rng = np.random.default_rng(1)
    ids = [list(rng.integers(2, 300, int(n))) for n in rng.integers(6, 20, 10)]
    data = NS(token_ids=lambda: ids)
    fp32 = NS(path=tiny, model=tiny / "model.onnx", files=digest_files(tiny))
    cands = {}
    for bits in (8, 4):
        folder = tmp_path / f"int{bits}"
        folder.mkdir()
        WeightOnly(tuple((n, bits) for n in matmuls(tiny)), 32, True, "rtn", 4).run(fp32, folder)
        cands[bits] = folder
    sessions = _Sessions(monkeypatch)
    ref_dir = tmp_path / "reference"
    ref_dir.mkdir()
    meta = TextReference(data).run(fp32, ref_dir)
    assert meta["sequences"] == 10 and meta["tokens_scored"] == sum(len(i) - 1 for i in ids)
    got = {bits: ScoreText(data).run(NS(path=f), tmp_path, reference=NS(path=ref_dir))
           for bits, f in cands.items()}
    assert sessions.opened == {str(tiny): 1, str(cands[8]): 1, str(cands[4]): 1}
    ref_logits = generation.next_token_logits(tiny, ids)
    for bits, folder in cands.items():
        want = score(generation.next_token_logits(folder, ids), ids, ref_logits)
        assert got[bits]["perplexity"] == pytest.approx(want.perplexity, rel=1e-6)
        assert got[bits]["top1_agreement"] == pytest.approx(want.top1_agreement)
        assert got[bits]["kl_mean"] <= want.kl_mean + 1e-9
        assert got[bits]["reference_perplexity"] == pytest.approx(meta["perplexity"])
        assert got[bits]["sequences"] == 10 and got[bits]["mode"] == "full"


def _score_injected(monkeypatch, tmp_path, ref_logits, cand_logits, ids, limits, floor):
    """ScoreText(mode=sequential) on logits injected in place of onnxruntime's: the stage's
    chunks, interval and stop are what run."""
    from pipeline.stages.score_text import ScoreText
    from pipeline.stages.text_reference import FILE

    reference(ref_logits, ids).save(tmp_path / FILE)
    monkeypatch.setattr(generation, "session", lambda *a, **k: None)
    where = {id(ids[i]): i for i in range(len(ids))}

    def logits(folder, part, sess=None):
        return [cand_logits[where[id(p)]] for p in part]

    monkeypatch.setattr(generation, "next_token_logits", logits)
    stage = ScoreText(NS(token_ids=lambda: ids), mode="sequential",
                      limits=tuple(limits.items()), min_sequences=floor)
    return stage.run(NS(path=tmp_path), tmp_path, reference=NS(path=tmp_path))


@pytest.mark.parametrize("noise,verdict", [(0.002, "clear pass"), (2.0, "clear fail")])
def test_sequential_scoring_stops_at_its_floor_on_a_clear_case(monkeypatch, tmp_path, noise,
                                                               verdict):
    rng, ids, ref = _text(2, 200, 17, 30)
    cand = [r + rng.normal(scale=noise, size=r.shape) for r in ref]
    out = _score_injected(monkeypatch, tmp_path, ref, cand, ids,
                          {"perplexity_rise": 2.0, "top1_agreement": 10.0}, floor=16)
    assert out["stopped"].startswith(verdict)
    assert out["sequences"] == 16 and out["sequences_total"] == 200
    assert out["tokens_scored"] == 16 * 16
    lo, hi = out["intervals"]["perplexity_rise"]
    assert (hi <= 2.0) if verdict == "clear pass" else (lo > 2.0)


def test_sequential_scoring_runs_to_the_end_on_a_borderline_candidate(monkeypatch, tmp_path):
    """The limit is the candidate's own full-text rise: no interval can lie wholly on one side
    of it, and every sequence is scored; the scores are then the full text's."""
    rng, ids, ref = _text(3, 120, 17, 30)
    cand = [r + rng.normal(scale=0.25, size=r.shape) for r in ref]
    full = 100 * (score(cand, ids).perplexity / score(ref, ids).perplexity - 1)
    assert 0.5 < full < 20  # a rise with room on both sides of it
    out = _score_injected(monkeypatch, tmp_path, ref, cand, ids,
                          {"perplexity_rise": full, "top1_agreement": 100.0}, floor=16)
    assert out["stopped"] == "all sequences scored"
    assert out["sequences"] == 120 and out["tokens_scored"] == 120 * 16
    assert out["perplexity_rise_pct"] == pytest.approx(full)
    lo, hi = out["intervals"]["perplexity_rise"]
    assert lo < full < hi


def test_the_interval_narrows_as_sequences_come_in_and_the_floor_holds():
    from pipeline.metrics.sequential import decide, intervals

    rng = np.random.default_rng(4)
    n = np.full(400, 50.0)
    diff = rng.normal(0.01, 0.05, 400) * n  # a rise of about 1 % per token
    rows = np.column_stack([n, 100 + diff, np.full(400, 100.0), 0.95 * n, 0.01 * n])
    widths = [intervals(rows[:m])["perplexity_rise"] for m in (10, 40, 400)]
    assert [w.high - w.low for w in widths] == sorted([w.high - w.low for w in widths],
                                                      reverse=True)
    limits = {"perplexity_rise": 2.0, "top1_agreement": 10.0}
    assert decide(rows[:400], limits, 32) == "inside"
    assert decide(rows[:10], limits, 32) is None  # under the floor: never a verdict
