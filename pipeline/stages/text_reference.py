"""text_reference: FP32 scored once on the evaluation text, for every candidate to be scored against.

In: the FP32 decoder folder (``decoder_export``) and the evaluation ``TextSet``. Out:
``reference.npz`` (``pipeline.metrics.generation.Reference``: per predicted position the next
token's NLL and the ``TOP_K`` most likely tokens with their log-probabilities over the whole
vocabulary; a few MB where the full logits would be GB) and FP32's perplexity on the text. Every
``score_text`` of a candidate reads this file instead of running FP32 again: one FP32 pass per
text set, keyed like every stage (the FP32 digest, the text's sha256, the threads, the machine).
FP32 has no MatMulNBits, so it is the reference at accuracy level 0 as built.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipeline.core.env import peak_rss_mb

FILE = "reference.npz"
CHUNK = 4  # sequences run together: their logits (sequence x vocabulary floats) stay small




@dataclass(frozen=True)
class TextReference:
    data: object           # TextSet: the evaluation text
    threads: int = 0       # intra-op threads of the session (0: onnxruntime's choice)
    name = "text_reference"
    version = 1
    hardware_dependent = True

    def run(self, parent, out_dir: Path) -> dict:
        import math

        import numpy as np

        from pipeline.core.progress import Progress
        from pipeline.metrics.generation import TOP_K, next_token_logits, reference, session

        ids = self.data.token_ids()
        sess = session(parent.path, threads=self.threads)
        bar = Progress(len(ids), "text_reference: FP32", unit="sequences")
        parts = []
        for i in range(0, len(ids), CHUNK):
            part = ids[i:i + CHUNK]
            parts.append(reference(next_token_logits(parent.path, part, sess=sess), part))
            bar.update(min(i + CHUNK, len(ids)))
        ref = _concat(parts)
        ref.save(out_dir / FILE)
        tail = 1.0 - np.exp(ref.top_logp.astype(np.float64)).sum(-1)
        return {"perplexity": math.exp(float(ref.nll.mean())), "sequences": len(ids),
                "tokens_scored": int(len(ref.nll)), "top_k": TOP_K,
                # the reference's mass outside its top k: what the top-k KL leaves out
                "tail_mass_mean": float(tail.mean()), "tail_mass_max": float(tail.max()),
                "bytes": (out_dir / FILE).stat().st_size, "peak_rss_mb": peak_rss_mb()}


def _concat(parts):
    import numpy as np

    from pipeline.metrics.generation import Reference

    offsets = [np.zeros(1, np.int64)]
    for p in parts:
        offsets.append(p.offsets[1:] + offsets[-1][-1])
    return Reference(np.concatenate(offsets), np.concatenate([p.nll for p in parts]),
                     np.concatenate([p.top_ids for p in parts]),
                     np.concatenate([p.top_logp for p in parts]))
