"""score_text: a decoder candidate scored on the user's text, against FP32's reference.

In: a weight-only decoder folder, the evaluation ``TextSet`` and, as ``reference``, the
``text_reference`` artifact (FP32 scored once on the same text: each position's next-token NLL
and top-k log-probabilities). Out: perplexity of the text's next tokens, the rise over FP32's on
the same sequences in percent, top-1 agreement (the share of positions whose most likely next
token is FP32's) and the mean KL divergence of the candidate's next-token distribution from
FP32's over FP32's top-k tokens plus the rest as one outcome (a lower bound of the full KL,
``pipeline.metrics.generation.row_sums``). FP32 itself is never run here.

``mode``: ``full`` scores every sequence; ``sequential`` scores a chunk at a time and stops once
the gate's verdict is clear at the 99 % level (``pipeline.metrics.sequential``), after at least
``min_sequences``. The result says how many sequences and tokens were scored and why it stopped;
its scores are those of the sequences scored (FP32's perplexity on the same ones beside them).
Machine-dependent: MatMulNBits' int8-activation kernels (accuracy level 4) differ between AVX2,
VNNI and AMX, and so can the scores.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipeline.core.errors import StageError

CHUNK = 4  # sequences scored together: their logits (sequence x vocabulary floats) stay small
MODES = ("full", "sequential")
STOPPED = {"inside": "clear pass: every interval inside the gate's limits",
           "outside": "clear fail: an interval wholly past its limit",
           None: "all sequences scored"}


@dataclass(frozen=True)
class ScoreText:
    data: object           # TextSet: the evaluation text
    threads: int = 0       # intra-op threads of the scoring sessions (0: onnxruntime's choice)
    mode: str = "full"     # full | sequential (stop once the verdict is clear)
    limits: tuple = ()     # sequential: ((metric, largest drop that passes), ...), the gate's
    min_sequences: int = 0  # sequential: sequences scored before any stop
    name = "score_text"
    version = 2  # 2: against text_reference's summary (top-k KL); sequential mode
    hardware_dependent = True

    def run(self, parent, out_dir: Path, reference=None) -> dict:
        import math

        import numpy as np

        from pipeline.core.progress import Progress
        from pipeline.metrics.generation import Reference, next_token_logits, row_sums, session
        from pipeline.metrics.sequential import CONFIDENCE, decide, intervals
        from pipeline.core.env import peak_rss_mb
        from pipeline.stages.text_reference import FILE

        if reference is None:
            raise StageError("score_text: a candidate is scored against text_reference's FP32")
        ids = self.data.token_ids()
        ref = Reference.load(reference.path / FILE)
        if len(ref.offsets) != len(ids) + 1:
            raise StageError(f"score_text: the reference has {len(ref.offsets) - 1} sequences, "
                             f"the text {len(ids)}")
        sess = session(parent.path, threads=self.threads)
        limits = dict(self.limits)
        rows, done, stop = np.zeros((len(ids), 5)), 0, None
        bar = Progress(len(ids), f"score_text ({self.mode})", unit="sequences")
        while done < len(ids):  # a few sequences' logits in memory at a time
            part = ids[done:done + CHUNK]
            logits = next_token_logits(parent.path, part, sess=sess)
            rows[done:done + len(part)] = row_sums(logits, part, ref.part(done, done + len(part)))
            done += len(part)
            bar.update(done)
            if self.mode == "sequential":
                stop = decide(rows[:done], limits, self.min_sequences)
                if stop:
                    bar.done()
                    break
        r = rows[:done]
        n, nll, ref_nll, agree, kl = r.sum(0)
        got = intervals(r)
        perplexity, ref_perplexity = math.exp(nll / n), math.exp(ref_nll / n)
        return {"perplexity": perplexity, "reference_perplexity": ref_perplexity,
                "perplexity_rise_pct": 100.0 * (perplexity / ref_perplexity - 1.0),
                "top1_agreement": agree / n, "kl_mean": kl / n, "kl": "top-k",
                "mode": self.mode, "sequences": done, "sequences_total": len(ids),
                "tokens_scored": int(n), "stopped": STOPPED[stop],
                # each gated drop's interval (the gate's scale) at the sequences scored
                "intervals": {m: [v if math.isfinite(v) else None for v in (iv.low, iv.high)]
                              for m, iv in got.items()},
                "confidence": CONFIDENCE, "peak_rss_mb": peak_rss_mb()}
