"""score_text: a decoder scored on the user's text, against the FP32 reference.

In: a decoder folder (FP32 or weight-only), the evaluation ``TextSet`` and, for a candidate, the
FP32 folder as ``reference``. Out: perplexity of the text's next tokens, and against the
reference run at ``accuracy_level`` 0 (``pipeline.metrics.generation``): top-1 agreement (the
share of positions whose most likely next token is the reference's) and the mean KL divergence
of the candidate's next-token distribution from the reference's; the candidate's perplexity rise
over the reference's, in percent. Machine-dependent: MatMulNBits' int8-activation kernels
(accuracy level 4) differ between AVX2, VNNI and AMX, and so can the scores.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

CHUNK = 4  # sequences scored together: their logits (sequence x vocabulary floats) stay small


@dataclass(frozen=True)
class ScoreText:
    data: object           # TextSet: the evaluation text
    threads: int = 0       # intra-op threads of the scoring sessions (0: onnxruntime's choice)
    name = "score_text"
    version = 1
    hardware_dependent = True

    def run(self, parent, out_dir: Path, reference=None) -> dict:
        import numpy as np

        from pipeline.metrics.generation import from_sums, next_token_logits, session, sums

        ids = self.data.token_ids()
        sess = session(parent.path, threads=self.threads)
        ref_sess = None if reference is None else \
            session(reference.path, accuracy_level=0, threads=self.threads)
        cand, base = np.zeros(4), np.zeros(4)
        for i in range(0, len(ids), CHUNK):  # a few sequences' logits in memory at a time
            part = ids[i:i + CHUNK]
            logits = next_token_logits(parent.path, part, sess=sess)
            ref = None if ref_sess is None else next_token_logits(reference.path, part,
                                                                  sess=ref_sess)
            cand += sums(logits, part, ref)
            if ref is not None:
                base += sums(ref, part)
        s = from_sums(cand, ref_sess is not None)
        out = {"perplexity": s.perplexity, "top1_agreement": s.top1_agreement,
               "kl_mean": s.kl_mean, "sequences": len(ids),
               "tokens_scored": sum(len(i) - 1 for i in ids)}
        if ref_sess is not None:
            ref_perplexity = from_sums(base, False).perplexity
            out["reference_perplexity"] = ref_perplexity
            out["perplexity_rise_pct"] = 100.0 * (s.perplexity / ref_perplexity - 1.0)
        return out
