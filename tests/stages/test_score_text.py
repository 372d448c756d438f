"""score_text: a candidate scored on the evaluation text against text_reference's FP32 summary.
FP32 scored against itself rises by nothing, agrees everywhere and diverges by nothing; a
4-bit candidate diverges, its scores those its own full logits give; a candidate without the
reference, or with the reference of another text, is refused in one line before any session."""
from __future__ import annotations

import math
from types import SimpleNamespace as NS

import pytest

from pipeline.core.errors import StageError
from pipeline.stages.score_text import ScoreText
from pipeline.stages.text_reference import TextReference
from pipeline.stages.weight_only import WeightOnly, matmuls
from tests.stages.support import run

# Every test here stands on the tiny Llama's export by the model builder (tiny_decoder: about
# ten seconds, once per worker): out of make test-fast's edit loop.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def reference(tiny_decoder, tmp_path_factory):
    out = tmp_path_factory.mktemp("text-reference")
    return NS(path=out, meta=run(TextReference(tiny_decoder.text), tiny_decoder.fp32, out))


def test_fp32_against_its_own_reference_loses_nothing(tiny_decoder, reference, tmp_path):
    meta = run(ScoreText(tiny_decoder.text), tiny_decoder.fp32, tmp_path / "s",
               reference=reference)
    assert meta["perplexity"] == pytest.approx(reference.meta["perplexity"], rel=1e-6)
    assert meta["reference_perplexity"] == pytest.approx(reference.meta["perplexity"])
    assert abs(meta["perplexity_rise_pct"]) < 1e-4
    assert meta["top1_agreement"] == 1.0 and abs(meta["kl_mean"]) < 1e-5
    ids = tiny_decoder.text.token_ids()
    assert meta["mode"] == "full" and meta["sequences"] == meta["sequences_total"] == len(ids)
    assert meta["tokens_scored"] == sum(len(s) - 1 for s in ids)
    assert meta["stopped"] == "all sequences scored"


def _full_scores(folder, ref_folder, ids):
    from pipeline.metrics.generation import next_token_logits, score

    return score(next_token_logits(folder, ids), ids, next_token_logits(ref_folder, ids))


def test_a_4_bit_candidate_is_scored_as_its_full_logits_score_it(tiny_decoder, reference,
                                                                 tmp_path):
    from pipeline.core import isolate

    fp32 = tiny_decoder.fp32
    int4 = tmp_path / "int4"
    run(WeightOnly(tuple((n, 4) for n in matmuls(fp32.path)), 32, True, "rtn", 0), fp32, int4)
    meta = run(ScoreText(tiny_decoder.text), NS(path=int4), tmp_path / "s", reference=reference)
    ids = tiny_decoder.text.token_ids()
    want = isolate.call("full scores", _full_scores, int4, fp32.path, ids)
    assert meta["perplexity"] == pytest.approx(want.perplexity, rel=1e-6)
    assert meta["top1_agreement"] == pytest.approx(want.top1_agreement)
    assert 0 < meta["kl_mean"] <= want.kl_mean + 1e-9  # top-k and the rest: a lower bound
    assert meta["perplexity_rise_pct"] == pytest.approx(
        100 * (want.perplexity / reference.meta["perplexity"] - 1), rel=1e-4)
    assert all(math.isfinite(v) for iv in meta["intervals"].values() for v in iv)


def test_without_its_reference_or_with_another_texts_it_is_refused(tiny_decoder, reference,
                                                                   tmp_path):
    from pipeline.models.decoder import _token_file

    stage = ScoreText(tiny_decoder.text)
    with pytest.raises(StageError, match="scored against text_reference's FP32"):
        stage.run(tiny_decoder.fp32, tmp_path)
    ids = tiny_decoder.text.token_ids()
    shorter = _token_file(ids[:-1], tmp_path / "tokens", "evaluation")
    with pytest.raises(StageError, match=rf"reference has {len(ids)} sequences, the text "
                                         rf"{len(ids) - 1}$"):
        ScoreText(shorter).run(tiny_decoder.fp32, tmp_path, reference=reference)
