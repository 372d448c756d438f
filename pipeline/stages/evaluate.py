"""evaluate: score a model on the held-out evaluation set, on the target runtime.

In: any artifact with a ``model.onnx``. Out: ``predictions.json`` (decoded strings in data-set
order), the task metrics (sequence accuracy and CER for OCR) and a sha256 over the decoded outputs:
the output-hash ledger the source article asks for, so two artifacts whose outputs differ in a
single line are told apart even when their accuracy is equal. Agreement with the FP16 baseline is
computed from two of these files (``pipeline.metrics.outputs``), so this stage needs only its own
model. Each sample's decision margin (``margins.json``) picks the hardest samples, on which quantization
choices are ranked cheaply; ``subset`` scores only those. The model runs on the stage's target
(``pipeline.runtimes``: runtime, precision, threads), and ``runtime`` in the result records the
engine, its settings and the precision its convolutions and matmuls executed in.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pipeline.metrics.outputs import output_hash


@dataclass(frozen=True)
class Evaluate:
    task: str
    eval_samples: int
    batch_size: int
    data_dir: str
    hardware: object
    subset: tuple = ()     # evaluation-set indices to score (the ranking subset); () = all
    name = "evaluate"
    version = 2
    hardware_dependent = True  # kernels differ per CPU, and so may the last bits of the outputs

    def run(self, parent, out_dir: Path) -> dict:
        from pipeline import runtimes
        from pipeline.models import task

        t = task(self.task)
        ds, digest = t.dataset("evaluation", self.eval_samples, self.data_dir)
        if self.subset:
            ds = ds.select(list(self.subset))
        # On the target's runtime and settings: the accuracy gated is the accuracy deployed.
        model = runtimes.load(parent.model, self.hardware)
        predictions: list[str | None] = [None] * len(ds)
        labels: list[str | None] = [None] * len(ds)
        margins = [0.0] * len(ds)
        for idx, images, texts in t.batches(ds, self.batch_size):
            logits = model.run(images)
            for i, pred, text, m in zip(idx, t.decode(logits), texts, t.margins(logits)):
                predictions[i], labels[i], margins[i] = pred, text, m
        (out_dir / "predictions.json").write_text(json.dumps(predictions))
        # How close each output came to changing: the hardest samples rank quantization choices.
        (out_dir / "margins.json").write_text(json.dumps([round(m, 5) for m in margins]))
        return {"metrics": t.metrics(predictions, labels), "output_sha256": output_hash(predictions),
                "evaluation_set": digest, "samples": len(ds),
                "runtime": model.describe(t.example_input(1))}


def hardest(evaluation, count: int) -> tuple[int, ...]:
    """Indices of the ``count`` samples with the smallest decision margin (ties by index)."""
    margins = json.loads((evaluation.path / "margins.json").read_text())
    return tuple(sorted(sorted(range(len(margins)), key=lambda i: (margins[i], i))[:count]))
