"""``model=torch``: any ``nn.Module`` the user's code builds, weights from safetensors.

In: a ``Source`` of kind ``torch``: ``package.module:function`` (called with ``model.params`` as
keyword arguments), an optional safetensors checkpoint (never a pickle), the inputs with their
dynamic axes by meaning (``{image: [batch, 3, 32, width]}``) and the output names, plus the data
and metric configs. Out: a ``Task`` the load and export stages build and export with exactly
those dynamic axes; its outputs' shapes come from one forward pass on a real sample. One line, before any stage, for: a factory
that does not import or is not callable, a factory that does not return an ``nn.Module``, a
checkpoint that does not fit the network.
"""
from __future__ import annotations

import functools
import importlib
import json

import numpy as np

from pipeline.core.errors import ConfigError, StageError
from pipeline.task.contract import InputSpec, OutputSpec
from pipeline.models.user_task import UserTask


def resolve(spec: str):
    """``package.module:function`` -> the function; one line when it cannot be found."""
    mod_name, _, fn_name = spec.partition(":")
    try:
        module = importlib.import_module(mod_name)
    # SystemExit too: a training script that parses its arguments when imported ends there
    except (Exception, SystemExit) as e:  # noqa: BLE001 - any failure of the user's code: one line
        raise ConfigError(f"model.factory={spec}: cannot import {mod_name} "
                          f"({type(e).__name__}: {e})") from None
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise ConfigError(f"model.factory={spec}: {mod_name} has no function {fn_name!r}")
    return fn


class TorchTask(UserTask):

    no_pruning = None  # the network is the factory's: pruned with the generic helper

    def __init__(self, key):
        super().__init__(key)
        spec = json.loads(key.spec)
        self.params = spec["params"]
        self.factory = resolve(key.path)
        dtypes = spec.get("input_dtypes") or {}
        self.inputs = tuple(InputSpec(name, dtypes.get(name, "float32"),
                                      tuple(d if isinstance(d, int) else str(d) for d in shape))
                            for name, shape in spec["inputs"].items())
        weights = self._weights()
        try:
            self._net = self.build_network(self.params, weights)
        except StageError as e:
            raise ConfigError(f"model.checkpoint={key.checkpoint}: {e}") from None
        names = list(spec.get("outputs") or ["output"])
        # Output shapes from one forward pass on a real sample: the metric is checked against them.
        self.size_axis = (self.inputs[0].name, 0)
        out = self._forward(self.example_from_data())
        self.outputs = tuple(OutputSpec(n, "float32", ("batch", *out.shape[1:]))
                             for n in names[:1])
        self._finish()

    def __repr__(self) -> str:
        return f"TorchTask({self.key.path!r})"

    def pruning_helper(self, net):
        """The generic helper: trace input, held-out scores and recovery from the user's data."""
        from pipeline.models.torch_prune import helper

        return helper(self, net)

    @functools.cached_property
    def prune_ignored(self) -> tuple[str, ...]:
        """Pruning keeps whole the layers whose channels are the outputs (a classifier's last
        layer), read off the traced network; a network the tracer cannot follow gets none here
        and is refused, with the tracer's reason, when pruning plans."""
        import torch

        from pipeline.prune.channels import output_layers

        ex = self.example(2)
        try:
            return tuple(output_layers(self._net, tuple(torch.from_numpy(ex[i.name])
                                                        for i in self.inputs)))
        except Exception:  # noqa: BLE001 - reported by pruning's own trace, with the network
            return ()

    def _weights(self):
        if not self.key.checkpoint:
            return None
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            return load_file(self.key.checkpoint)
        except (OSError, SafetensorError) as e:
            raise ConfigError(f"model.checkpoint={self.key.checkpoint}: not a readable "
                              f"safetensors file ({e})") from None

    def build_network(self, params: dict, weights: dict | None = None):
        import torch

        from pipeline.models.ocr.crnn import misfit

        torch.manual_seed(0)  # a factory's own initialisation, reproducibly
        try:
            net = self.factory(**params)
        except (Exception, SystemExit) as e:  # noqa: BLE001 - the user's code: one line naming it
            raise ConfigError(f"model.factory={self.key.path}: failed with params {params} "
                              f"({type(e).__name__}: {e})") from None
        if not isinstance(net, torch.nn.Module):
            raise ConfigError(f"model.factory={self.key.path}: returned a "
                              f"{type(net).__name__}, not a torch.nn.Module")
        if weights is not None:
            problem = misfit(net.state_dict(), weights)
            if problem:
                raise StageError(f"checkpoint does not fit {self.key.path}: {problem}")
            net.load_state_dict(weights, strict=True)
        return net.eval()

    def example_from_data(self) -> dict:
        data = self.data()
        ds = data.dataset.select(data.evaluation[:1])
        return self._collate(self._arrays(ds, [0]))

    def _forward(self, feeds: dict) -> np.ndarray:
        import torch

        with torch.inference_mode():
            out = self._net(*(torch.from_numpy(np.ascontiguousarray(feeds[i.name]))
                              for i in self.inputs))
        out = out[0] if isinstance(out, (tuple, list)) else out
        return out.float().numpy()
