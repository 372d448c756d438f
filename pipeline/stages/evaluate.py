"""evaluate: score a model on the held-out evaluation set, on the target runtime.

In: any artifact with a ``model.onnx``. Out: ``predictions.json`` (decoded strings in data-set
order), the task metrics (sequence accuracy and CER for OCR) and a sha256 over the decoded outputs:
the output-hash ledger the source article asks for, so two artifacts whose outputs differ in a
single line are told apart even when their accuracy is equal. Agreement with the FP16 baseline is
computed from two of these files by the gate, so this stage needs only its own model.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path


def output_hash(predictions: list[str]) -> str:
    return hashlib.sha256("\n".join(predictions).encode()).hexdigest()


@dataclass(frozen=True)
class Evaluate:
    task: str
    eval_samples: int
    batch_size: int
    data_dir: str
    hardware: object
    name = "evaluate"
    version = 1
    hardware_dependent = True  # kernels differ per CPU, and so may the last bits of the outputs

    def run(self, parent, out_dir: Path) -> dict:
        from pipeline import ort
        from pipeline.models import task

        t = task(self.task)
        ds, digest = t.dataset("evaluation", self.eval_samples, self.data_dir)
        sess = ort.session(parent.model, self.hardware)
        predictions: list[str | None] = [None] * len(ds)
        labels: list[str | None] = [None] * len(ds)
        for idx, images, texts in t.batches(ds, self.batch_size):
            for i, pred, text in zip(idx, t.decode(ort.run(sess, images)), texts):
                predictions[i], labels[i] = pred, text
        (out_dir / "predictions.json").write_text(json.dumps(predictions))
        return {"metrics": t.metrics(predictions, labels), "output_sha256": output_hash(predictions),
                "evaluation_set": digest, "samples": len(ds)}


def agreement(a, b) -> float:
    """Share of identical decoded outputs between two evaluate artifacts."""
    pa = json.loads((a.path / "predictions.json").read_text())
    pb = json.loads((b.path / "predictions.json").read_text())
    if len(pa) != len(pb):
        return 0.0
    return sum(x == y for x, y in zip(pa, pb)) / len(pa)
