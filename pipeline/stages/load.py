"""load: the trained network as an artifact (safetensors weights plus the params that rebuild it).

In: the task (its ``build_network``), the network's params (``model.params``) and
``model.checkpoint`` (a safetensors file) or null for a seeded random network. Out:
``model.safetensors`` and ``net.json``. The checkpoint's sha256 is part of this stage's key, so a
retrained checkpoint invalidates everything after it. Weights are read with safetensors only: no
pickle is ever loaded.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.errors import StageError


@dataclass(frozen=True)
class Load:
    task: object               # the task's key (pipeline.models.task)
    checkpoint: str | None
    checkpoint_sha256: str | None
    params: tuple = ()         # the network's params as sorted (name, value) pairs
    name = "load"
    version = 2
    hardware_dependent = False

    def run(self, parent, out_dir: Path) -> dict:
        from safetensors import SafetensorError
        from safetensors.torch import load_file, save_file

        from pipeline.models import task

        t = task(self.task)
        weights = None
        if self.checkpoint is not None:
            try:
                weights = load_file(self.checkpoint)
            except (OSError, SafetensorError) as e:
                raise StageError(f"checkpoint {self.checkpoint} is not a readable safetensors "
                                 f"file: {e}") from None
        params = {k: thawed(v) for k, v in self.params}
        net = t.build_network(params, weights)
        state = {k: v.contiguous() for k, v in net.state_dict().items()}
        save_file(state, str(out_dir / "model.safetensors"))
        count = sum(p.numel() for p in net.parameters())
        (out_dir / "net.json").write_text(json.dumps(
            {"params": params, "parameters": count, "source": self.checkpoint or "random-init"}))
        return {"parameters": count, "source": self.checkpoint or "random-init",
                "checkpoint_sha256": self.checkpoint_sha256}


def params_key(params: dict) -> tuple:
    """A network's params as a hashable, ordered value for a stage key (lists become tuples)."""
    def frozen(v):
        if isinstance(v, dict):
            return tuple(sorted((k, frozen(x)) for k, x in v.items()))
        return tuple(frozen(x) for x in v) if isinstance(v, (list, tuple)) else v

    return frozen(dict(params))


def thawed(v):
    return [thawed(x) for x in v] if isinstance(v, (list, tuple)) else v


def network_from(artifact, task):
    """Rebuild the torch network stored in a load artifact. A pruned network whose params cannot
    describe its widths (a torch factory's) carries its pruning history: the unpruned network is
    built from the params, the same channels are removed again, then the weights load strictly."""
    from safetensors.torch import load_file

    net = json.loads((artifact.path / "net.json").read_text())
    weights = load_file(str(artifact.path / "model.safetensors"))
    if not net.get("pruning_history"):
        return task.build_network(net["params"], weights)
    import torch

    from pipeline.prune.channels import rebuild

    example = task.example(2)
    shell = rebuild(task.build_network(net["params"]),
                    tuple(torch.from_numpy(example[i.name]) for i in task.inputs),
                    net["pruning_history"])
    try:
        shell.load_state_dict(weights, strict=True)
    except RuntimeError as e:  # torch lists every tensor: the first line after its header
        detail = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        raise StageError("the pruned weights do not fit the network rebuilt from its pruning "
                         f"history: {detail[1] if len(detail) > 1 else detail[0]}") from None
    return shell.eval()
