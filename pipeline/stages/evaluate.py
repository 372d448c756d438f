"""evaluate: score a model on the held-out evaluation set, on the target runtime.

In: any artifact with a ``model.onnx``. Out: ``predictions.json`` (decoded strings in data-set
order), the task's metrics (its contract's ``metrics``) and a sha256 over the decoded outputs:
the output-hash ledger the source article asks for, so two artifacts whose outputs differ in a
single line are told apart even when their accuracy is equal. Agreement with the FP16 baseline is
computed from two of these files (``pipeline.metrics.outputs``), so this stage needs only its own
model, except in a label-free run (``metric=agreement``): there each sample's label is the FP16
baseline's output for it, read from the baseline's own evaluation (the ``reference``, whose
digest is in this stage's key; ``against`` says which evaluations take it), and the baseline's
evaluation scores itself (100 % argmax agreement, cosine 1 by construction); the task may also
score the data's own labels there (sentence pairs' gold similarity scores). Each sample's
decision margin (``margins.json``) picks the hardest samples, on which quantization
choices are ranked cheaply; ``subset`` scores only those. The model runs on the stage's target
(``pipeline.runtimes``: runtime, precision, threads), and ``runtime`` in the result records the
engine, its settings and the precision its convolutions and matmuls executed in.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.errors import StageError
from pipeline.metrics.outputs import non_finite_samples, output_hash


@dataclass(frozen=True)
class Evaluate:
    data: object           # DataSplit: the evaluation samples
    batch_size: int
    hardware: object
    subset: tuple = ()     # evaluation-set indices to score (the ranking subset); () = all
    name = "evaluate"
    version = 7  # 7: agreement judges an output's parts (cosine_parts); 6: samples whose
                 # outputs hold NaN or inf are counted (non_finite); 5: label-free runs also
                 # score the data's own labels where the task reads them (Spearman's rho of
                 # sentence pairs); 4: against the FP16 baseline
    hardware_dependent = True  # kernels differ per CPU, and so may the last bits of the outputs

    def run(self, parent, out_dir: Path, reference=None) -> dict:
        from pipeline import runtimes
        from pipeline.models import task

        t = task(self.data.task)
        ds = t.dataset(self.data)
        full = len(ds)  # samples of the whole set (a sentence pair is two)
        if self.subset:
            ds = ds.select(list(self.subset))
        # On the target's runtime and settings: the accuracy gated is the accuracy deployed.
        model = runtimes.load(parent.model, self.hardware)
        predictions: list = [None] * len(ds)
        labels: list = [None] * len(ds)
        margins = [0.0] * len(ds)
        non_finite = 0
        for idx, feeds, truth in t.batches(ds, self.batch_size):
            outputs = model.run(feeds)
            non_finite += non_finite_samples(outputs, len(idx))
            for i, pred, label, m in zip(idx, t.predictions(outputs), truth, t.margins(outputs)):
                predictions[i], labels[i], margins[i] = pred, label, m
        truth = labels
        if t.label_free:
            labels = self._baseline_outputs(reference, predictions, full)
        (out_dir / "predictions.json").write_text(json.dumps(predictions))
        # How close each output came to changing: the hardest samples rank quantization choices.
        (out_dir / "margins.json").write_text(json.dumps([round(m, 5) for m in margins]))
        scores = t.score(predictions, labels, truth) if t.label_free else t.score(predictions, labels)
        return {"metrics": scores, "output_sha256": output_hash(predictions),
                "evaluation_set": self.data.digest, "samples": len(ds),
                "non_finite": non_finite,  # samples whose outputs held NaN or inf
                "runtime": model.describe(t.example(1)),
                **({"reference": reference.digest if reference else "itself (the baseline)"}
                   if t.label_free else {})}

    def _baseline_outputs(self, reference, predictions: list, full: int) -> list:
        """Label-free: each sample's label is the baseline's output for it (this model's own
        outputs when it is the baseline)."""
        if reference is None:
            return [p["output"] for p in predictions]
        if reference.meta.get("evaluation_set") != self.data.digest:
            raise StageError("evaluate: the reference evaluation was made on another data set "
                             f"({str(reference.meta.get('evaluation_set'))[:12]} != "
                             f"{self.data.digest[:12]})")
        ref = json.loads((reference.path / "predictions.json").read_text())
        rows = list(self.subset) if self.subset else range(len(predictions))
        if len(ref) != full or max(rows, default=0) >= len(ref):
            raise StageError(f"evaluate: the reference evaluation holds {len(ref)} samples, "
                             f"not the {full} of the evaluation set")
        return [ref[i]["output"] for i in rows]


def against(t, baseline) -> dict:
    """The references an evaluation takes (``runner.run(..., **against(t, fp16_eval))``): in a
    label-free run, the FP16 baseline's evaluation; none otherwise, so labelled runs' keys do not
    depend on the baseline."""
    return {"reference": baseline} if t.label_free else {}


def hardest(evaluation, count: int) -> tuple[int, ...]:
    """Indices of the ``count`` samples with the smallest decision margin (ties by index)."""
    margins = json.loads((evaluation.path / "margins.json").read_text())
    return tuple(sorted(sorted(range(len(margins)), key=lambda i: (margins[i], i))[:count]))


def baselines(runner, plan, evaluate, t, exported, fp32, fp16) -> dict:
    """The float artifacts' evaluations. The FP16 one first: a label-free run scores every other
    evaluation against its outputs (``against``)."""
    ref = runner.run(plan.evaluation(evaluate, "fp16"), fp16, label="evaluate[fp16]")
    evals = {role: runner.run(plan.evaluation(evaluate, role), art, label=f"evaluate[{role}]",
                              **against(t, ref))
             for role, art in (("export", exported), ("fp32", fp32))}
    return {**evals, "fp16": ref}
