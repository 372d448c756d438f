"""prune: channels physically removed, then a recovery fine-tune; a smaller ``load`` artifact.

In: a ``load`` artifact and a ``PruneConfig``. Out: the ``load`` format (``model.safetensors`` plus
``net.json`` with the params that rebuild the network: the per-layer widths for the OCR CRNN; for a
torch factory, whose arguments cannot say what was pruned, the factory's params plus the pruning
history, the channels removed per layer as JSON), so ``export`` and every stage after it see the
smaller network without pickles and without knowing it was pruned. Meta: parameters and MACs before
and after, each pruned layer's width, held-out accuracy of the unpruned, the pruned and the
recovered network, and the recovery's seconds, steps per second and precision (float32 or bfloat16
autocast, from the CPU's flags: ``env.training_precision``). Torch-Pruning does the pruning
(``pipeline.prune.channels``); the task's pruning helper (what its ``pruning_helper`` gives, the
task contract's ``Prunable``: ``pipeline.models.ocr.prune`` for the CRNN, with its own generated
data and training loop; ``pipeline.models.torch_prune`` for a torch factory, on the user's data and metric) gives the trace
input, the held-out scores and the recovery. The plan (ignored names, whole-layer removal, the
trace) is checked before any minute is spent on recovery, and the written files are rebuilt and
must give the recovered network's outputs bit for bit. Deliberately not handled: tasks without a
pruning helper (an ONNX-only model has no network to prune: refused with one line), and choosing
the ratio (``make bench`` measures what one buys).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from pipeline.core.env import training_precision
from pipeline.core.errors import StageError
from pipeline.prune.helper import helper, with_ignored

@dataclass(frozen=True)
class Prune:
    task: object           # the task's key (pipeline.models.task)
    prune: object          # PruneConfig, ignored names resolved (with_ignored)
    # float32 or bfloat16 recovery, from the CPU's flags: part of the key, as it changes weights
    precision: str = field(default_factory=lambda: training_precision()["dtype"])
    # The user's data (a DataSplit: its content digest), which a factory's held-out scores and
    # recovery read; None where the task generates them from fixed seeds (the OCR CRNN), whose
    # keys stay as they were.
    data: object = field(default=None, metadata={"key_omit_default": True})
    name = "prune"
    version = 4  # 2: LSTM hidden units pruned too; layers in network order. 3: recovery precision
    # 4: net.json holds the network's params (and, for a factory, the pruning history)
    hardware_dependent = False

    def run(self, parent, out_dir: Path) -> dict:
        import torch
        from safetensors.torch import save_file

        from pipeline.prune import channels as pruning
        from pipeline.prune import cost as pruning_cost
        from pipeline.models import task
        from pipeline.prune.progress import Progress
        from pipeline.stages.load import network_from

        t = task(self.task)
        if self.data is not None:
            t.dataset(self.data)  # refuses data changed since the run started
        cfg = with_ignored(self.prune, t)
        net = network_from(parent, t)
        h = helper(t, net)
        example = h.example()
        plan = pruning.plan(net, example, cfg)  # every refusal happens here, before the work
        held = h.held_out(cfg.eval_samples)
        one = tuple(x[:1] for x in pruning.args(example))  # batch 1: what MACs are per
        before = {"parameters": pruning_cost.parameters(net),
                  "macs": pruning_cost.macs(net, one)["total"],
                  "held_out": h.score(net, held)}
        layers = pruning.apply(net, plan, example)
        after = {"parameters": pruning_cost.parameters(net),
                 "macs": pruning_cost.macs(net, one)["total"]}
        pruned_score = h.score(net, held)
        primary = t.metrics.primary_spec
        print(f"  prune: {before['parameters']:,} -> {after['parameters']:,} parameters, MACs "
              f"-{100 * (1 - after['macs'] / before['macs']):.1f} %; held-out {primary.name} "
              f"{before['held_out'][primary.name]:.2f} -> "
              f"{pruned_score[primary.name]:.2f} {primary.unit}".rstrip() + "; recovering",
              flush=True)
        chosen = training_precision()
        precision_reason = (chosen["reason"] if chosen["dtype"] == self.precision
                            else f"{self.precision} set by the caller")
        print(f"  prune: recovery in {self.precision} ({precision_reason})", flush=True)
        bar = Progress(cfg.recover_steps) if cfg.recover_steps else None
        t0 = time.monotonic()
        last_loss = h.recover(net, cfg.recover_steps, cfg.recover_lr, cfg.recover_batch_size,
                              cfg.seed, bar.update if bar else None,
                              bf16=self.precision == "bfloat16")
        recover_s = time.monotonic() - t0
        recovered = h.score(net, held)

        params = h.params_of(net)
        save_file({k: v.contiguous() for k, v in net.state_dict().items()},
                  str(out_dir / "model.safetensors"))
        described = {"params": params}
        if h.rebuild_by_history:  # the params build the unpruned network: say what was removed
            described["pruning_history"] = pruning.history(plan)
        (out_dir / "net.json").write_text(json.dumps(
            {**described, "parameters": after["parameters"],
             "source": f"pruned from {parent.digest}"}))
        self._check_round_trip(net, out_dir, t, example)
        return {
            "parameters": after["parameters"], "source": f"pruned from {parent.digest}",
            "params": params,
            "layers": [[name, b, a] for name, (b, a) in layers.items()],  # network order
            "parameters_before": before["parameters"], "macs_before": before["macs"],
            "macs": after["macs"], "macs_reduction": 1 - after["macs"] / before["macs"],
            "macs_per": h.MAC_INPUT,
            "held_out": {"seed": h.HELD_OUT_SEED, "samples": cfg.eval_samples,
                         "what": h.held_out_what(cfg.eval_samples),
                         "unpruned": before["held_out"], "pruned": pruned_score,
                         "recovered": recovered},
            "recover": {"steps": cfg.recover_steps, "seconds": round(recover_s, 1),
                        "steps_per_second": round(cfg.recover_steps / recover_s, 3)
                        if cfg.recover_steps and recover_s > 0 else None,
                        "precision": self.precision, "precision_reason": precision_reason,
                        "last_loss": last_loss, "threads": torch.get_num_threads()},
        }

    @staticmethod
    def _check_round_trip(net, out_dir: Path, t, example) -> None:
        """What later stages will rebuild from the files must be the network just recovered."""
        import torch

        from pipeline.stages.load import network_from

        from pipeline.prune.channels import args

        rebuilt = network_from(SimpleNamespace(path=out_dir), t)
        xs = tuple(torch.linspace(-1, 1, x.numel()).reshape(x.shape) if x.is_floating_point()
                   else x for x in args(example))

        def first(out):
            return out[0] if isinstance(out, (tuple, list)) else out

        with torch.inference_mode():
            if not torch.equal(first(net.eval()(*xs)), first(rebuilt(*xs))):
                raise StageError("prune: the network rebuilt from model.safetensors and net.json "
                                 "differs from the pruned one")
