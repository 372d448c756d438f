"""load: the trained network as an artifact (safetensors weights plus the widths that rebuild it).

In: ``model.checkpoint`` (a safetensors file) or null for a seeded random network. Out:
``model.safetensors`` and ``net.json``. The checkpoint's sha256 is part of this stage's key, so a
retrained checkpoint invalidates everything after it. Weights are read with safetensors only: no
pickle is ever loaded.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import StageError


@dataclass(frozen=True)
class Load:
    task: str
    checkpoint: str | None
    checkpoint_sha256: str | None
    widths: tuple[int, ...]
    hidden: int
    name = "load"
    version = 1
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
        net = t.build_network(self.widths, self.hidden, weights)
        state = {k: v.contiguous() for k, v in net.state_dict().items()}
        save_file(state, str(out_dir / "model.safetensors"))
        params = sum(p.numel() for p in net.parameters())
        (out_dir / "net.json").write_text(json.dumps(
            {"task": self.task, "widths": list(self.widths), "hidden": self.hidden,
             "parameters": params, "source": self.checkpoint or "random-init"}))
        return {"parameters": params, "source": self.checkpoint or "random-init",
                "checkpoint_sha256": self.checkpoint_sha256}


def network_from(artifact, task_module):
    """Rebuild the torch network stored in a load artifact."""
    from safetensors.torch import load_file

    net = json.loads((artifact.path / "net.json").read_text())
    return task_module.build_network(net["widths"], net["hidden"],
                                     load_file(str(artifact.path / "model.safetensors")))
