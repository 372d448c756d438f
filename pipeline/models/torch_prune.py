"""What the ``prune`` stage needs to know about a torch factory's network: its trace input, a
held-out sample and its scores, and a recovery fine-tune, all from the user's own data and metric.

In: the ``TorchTask`` and its unpruned network. Out: a helper (``helper``) with the same calls as
the OCR one (``pipeline.models.ocr.prune``). The trace input is the task's example (a real sample,
every declared input). The held-out sample is the first ``count`` rows of the evaluation split,
scored in torch by the task's own metric; the recovery trains only on the other rows
(calibration and the rest), so the evaluation never sees its own training data. The loss: with a
classifier and labels, cross-entropy on them; otherwise (no labels, or outputs that are not a
class axis: CTC, agreement) distillation, the mean squared difference from the unpruned network's
outputs on the same batch. Without labels the held-out scores are agreement with the unpruned
network. The factory's params cannot describe pruned widths, so the stage saves the pruning
history with them (``rebuild_by_history``): ``pipeline.stages.load.network_from`` removes the
same channels from a freshly built network. Deliberately not handled: a loss of the user's own,
early stopping (a fixed step count keeps the time predictable).
"""
from __future__ import annotations

import copy

import numpy as np
import torch

from pipeline.core.errors import StageError
from pipeline.metrics import classification
from pipeline.config.metrics import MetricName

HELD_OUT_BATCH = 32


def helper(task, net) -> "FactoryPruning":
    return FactoryPruning(task, net)


class FactoryPruning:
    HELD_OUT_SEED = None          # the held-out rows are the data's own evaluation split
    rebuild_by_history = True     # net.json carries the pruning history (params cannot)

    def __init__(self, task, net):
        self.t = task
        # The unpruned network: the distillation teacher, and the reference of label-free scores.
        self.teacher = copy.deepcopy(net).eval()
        first = task.example(1)
        self.MAC_INPUT = "one sample of " + ", ".join(
            f"{i.name} {list(first[i.name].shape[1:])}" for i in task.inputs)

    def example(self) -> tuple:
        ex = self.t.example(2)
        return tuple(torch.from_numpy(np.ascontiguousarray(ex[i.name])) for i in self.t.inputs)

    def params_of(self, net) -> dict:
        return dict(self.t.params)

    def held_out_what(self, count: int) -> str:
        n = min(count, len(self.t.data().evaluation))
        return f"the first {n} samples of the evaluation split"

    # -- data ----------------------------------------------------------------------------------
    def _tensors(self, feeds: dict) -> tuple:
        return tuple(torch.from_numpy(np.ascontiguousarray(feeds[i.name])) for i in self.t.inputs)

    def _forward(self, net, feeds: dict) -> torch.Tensor:
        out = net(*self._tensors(feeds))
        return (out[0] if isinstance(out, (tuple, list)) else out).float()

    def held_out(self, count: int) -> list:
        data = self.t.data()
        rows = data.evaluation[:count]
        return list(self.t.batches(data.dataset.select(rows), HELD_OUT_BATCH, sort=False))

    def _labelled(self) -> bool:
        return self.t.data().has_labels and not self.t.label_free

    def score(self, net, held: list) -> dict[str, float]:
        predictions, labels = [], []
        net.eval()
        with torch.inference_mode():
            for batch in held:
                out = self._forward(net, batch.feeds).numpy()
                predictions += self.t.predictions(out)
                if self._labelled():
                    labels += list(batch.labels)
                else:  # agreement with the unpruned network's outputs
                    ref = self._forward(self.teacher, batch.feeds).numpy().astype(np.float64)
                    labels += [np.round(row, 6).tolist() for row in ref]
        return self.t.score(predictions, labels)

    # -- recovery ------------------------------------------------------------------------------
    def _training_rows(self) -> list[int]:
        data = self.t.data()
        held = set(data.evaluation)
        return [r for r in range(len(data.dataset)) if r not in held]

    def _loss(self, net, batch) -> torch.Tensor:
        out = self._forward(net, batch.feeds)
        m = self.t.metric_cfg
        if self._labelled() and m.name == MetricName.classification:
            y = classification.label_ids(batch.labels, m.class_names or None)
            return torch.nn.functional.cross_entropy(out, torch.from_numpy(y))
        with torch.no_grad():
            target = self._forward(self.teacher, batch.feeds)
        return torch.nn.functional.mse_loss(out, target)

    def recover(self, net, steps: int, lr: float, batch_size: int, seed: int, on_step=None,
                bf16: bool | None = None) -> float | None:
        """Fine-tune in place for ``steps`` batches drawn (seeded) from the training rows;
        one-cycle AdamW, bfloat16 autocast when ``bf16``. Returns the last loss (0 steps: None)."""
        if steps == 0:
            return None
        rows = self._training_rows()
        if not rows:
            raise StageError("prune: no rows outside the evaluation split to recover on; lower "
                             "data.evaluation_samples or set prune.recover_steps=0")
        data = self.t.data()
        torch.manual_seed(seed)
        rng = np.random.default_rng(seed)
        opt = torch.optim.AdamW(net.parameters(), lr=lr)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps)
        net.train()
        loss, step = None, 0
        try:
            while step < steps:
                order = [rows[int(i)] for i in rng.permutation(len(rows))]
                for batch in self.t.batches(data.dataset.select(order), batch_size, sort=False):
                    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bool(bf16)):
                        value = self._loss(net, batch)
                    opt.zero_grad()
                    value.backward()
                    opt.step()
                    sched.step()
                    step, loss = step + 1, float(value)
                    if on_step:
                        on_step(step, loss)
                    if step == steps:
                        break
        finally:
            net.eval()
        return loss
