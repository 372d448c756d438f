"""text_reference: FP32 scored once on the evaluation text. Its file holds, per predicted
position, the next token's NLL and the top-k log-probabilities of FP32's own logits: the
perplexity it reports is the one FP32's full logits give, each sequence's positions are where its
offsets say, and a top-k list is FP32's most likely tokens, most likely first."""
from __future__ import annotations

import numpy as np
import pytest

from pipeline.metrics.generation import TOP_K, Reference
from pipeline.stages.text_reference import FILE, TextReference
from tests.stages.support import run

# Every test here stands on the tiny Llama's export by the model builder (tiny_decoder: about
# ten seconds, once per worker): out of make test-fast's edit loop.
pytestmark = pytest.mark.slow


def _full_logits(folder, ids):
    from pipeline.metrics.generation import next_token_logits

    return next_token_logits(folder, ids)


def test_the_reference_summarizes_fp32s_own_logits(tiny_decoder, tmp_path):
    from pipeline.core import isolate
    from pipeline.metrics.generation import score

    fp32, ids = tiny_decoder.fp32, tiny_decoder.text.token_ids()
    meta = run(TextReference(tiny_decoder.text), fp32, tmp_path / "ref")
    logits = isolate.call("fp32 logits", _full_logits, fp32.path, ids)
    ref = Reference.load(tmp_path / "ref" / FILE)

    positions = sum(len(s) - 1 for s in ids)
    assert meta["sequences"] == len(ids) and meta["tokens_scored"] == positions == len(ref.nll)
    assert list(np.diff(ref.offsets)) == [len(s) - 1 for s in ids]
    assert meta["perplexity"] == pytest.approx(score(logits, ids).perplexity, rel=1e-6)
    assert meta["top_k"] == TOP_K == ref.top_ids.shape[1]
    assert meta["bytes"] == (tmp_path / "ref" / FILE).stat().st_size
    # the last sequence's last position: its top-k are FP32's most likely tokens, in order
    last = logits[-1][-2]  # the logits that predict the final token
    assert list(ref.top_ids[-1]) == list(np.argsort(-last, kind="stable")[:TOP_K])
    assert np.all(np.diff(ref.top_logp[-1]) <= 0)
    assert 0.0 <= meta["tail_mass_mean"] <= meta["tail_mass_max"] < 1.0
