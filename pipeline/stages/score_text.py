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


@dataclass(frozen=True)
class ScoreText:
    data: object           # TextSet: the evaluation text
    threads: int = 0       # intra-op threads of the scoring sessions (0: onnxruntime's choice)
    name = "score_text"
    version = 1
    hardware_dependent = True

    def run(self, parent, out_dir: Path, reference=None) -> dict:
        from pipeline.metrics.generation import next_token_logits, score, session

        ids = self.data.token_ids()
        sess = session(parent.path, threads=self.threads)
        logits = next_token_logits(parent.path, ids, sess=sess)
        del sess
        ref = None
        if reference is not None:
            ref_sess = session(reference.path, accuracy_level=0, threads=self.threads)
            ref = next_token_logits(reference.path, ids, sess=ref_sess)
        s = score(logits, ids, ref)
        out = {"perplexity": s.perplexity, "top1_agreement": s.top1_agreement,
               "kl_mean": s.kl_mean, "sequences": len(ids),
               "tokens_scored": sum(len(i) - 1 for i in ids)}
        if ref is not None:
            base = score(ref, ids).perplexity
            out["reference_perplexity"] = base
            out["perplexity_rise_pct"] = 100.0 * (s.perplexity / base - 1.0)
        return out
