"""Where a model comes from: the key that names its task, and the data splits a run reads.

In: the run's ``ModelConfig``, ``DataConfig`` and ``MetricConfig``. Out: ``task_key`` (a built-in
task's name, or a frozen ``Source`` for the user's own model: an ONNX file, a torch factory or
a local Hugging Face folder, with its data and metric as canonical JSON, so the key is hashable,
picklable and stable across processes; ``pipeline.models.task`` builds its ``Task``) and
``Splits`` (the evaluation, parity and calibration ``DataSplit`` values of a run, each carrying the content digest of its data). The model file's
and the checkpoint's sha256 are in the key, so a replaced file gives a new task key; an ONNX file's
digest covers its external data, a folder's every file in it (``pipeline.core.userfiles``: no file
it names may lie outside it). A checkpoint or a folder whose weights are not safetensors is
refused here (``pipeline.models.weights``).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.artifact import sha256_file
from pipeline.core.errors import ConfigError


@dataclass(frozen=True)
class Source:
    kind: str                 # onnx | torch | hf
    path: str                 # onnx: the model file; torch: the factory (package.module:fn);
                              # hf: the model folder
    sha256: str               # onnx: of the file and its external data; torch: of the
                              # checkpoint ("" without one);
                              # hf: the folder's content digest
    checkpoint: str           # torch: the safetensors file ("" without one)
    spec: str                 # canonical JSON: params, inputs, outputs (torch)
    data: str                 # canonical JSON of the DataConfig
    metric: str               # canonical JSON of the MetricConfig
    data_dir: str             # where the datasets library may cache what it reads
    # of the files the metric reads (metric.charset): one edited in place is a new key, as a
    # data file or the model is ("" without one)
    metric_sha256: str = ""


def _json(obj) -> str:
    from pipeline.core.artifact import plain

    return json.dumps(plain(obj), sort_keys=True)


def _metric_files(metric) -> str:
    charset = getattr(metric, "charset", "") if metric is not None else ""
    return sha256_file(Path(charset)) if charset and Path(charset).is_file() else ""


def task_key(model, data=None, metric=None, data_dir: str = "calibration"):
    """The task key of a run: the built-in task's name, or a ``Source``. Chosen by
    ``model.source`` (the loader), never by ``model.name`` (what the registry calls the model), so
    renaming a model reuses every cached stage."""
    if model.source not in ("onnx", "torch", "hf"):
        return model.source
    if model.source == "hf":  # a folder: its content digest (weights, config, tokenizer) keys it
        from pipeline.core import userfiles
        from pipeline.models.files import hf_files

        folder = Path(model.path)
        if not folder.is_dir():
            raise ConfigError(f"model.path={model.path}: "
                              f"{'not a folder' if folder.exists() else 'no such folder'} (model=hf "
                              "takes a local Hugging Face model folder)")
        spec = json.dumps({"params": model.params}, sort_keys=True)
        key = f"model.path={model.path}"
        digest = userfiles.digest(folder, key)  # first: it refuses links out of the folder
        hf_files(folder, key)  # safetensors only; the files it names lie inside (so in the digest)
        return Source("hf", str(folder.resolve()), digest, "", spec, _json(data),
                      _json(metric), str(data_dir), _metric_files(metric))
    if model.source == "onnx":
        path = Path(model.path)
        if not path.is_file():
            raise ConfigError(f"model.path={model.path}: "
                              f"{'not a file' if path.exists() else 'no such file'}")
        from pipeline.models.files import onnx_digest as digest

        # the file and its external data (each checked to lie beside it): a new key if either
        # changes
        return Source("onnx", str(path.resolve()), digest(path), "", "{}", _json(data),
                      _json(metric), str(data_dir), _metric_files(metric))
    checkpoint, sha = "", ""
    if model.checkpoint:
        ck = Path(model.checkpoint)
        if not ck.is_file():
            raise ConfigError(f"model.checkpoint={model.checkpoint}: "
                              f"{'not a file' if ck.exists() else 'no such file'}")
        from pipeline.models.weights import checkpoint as safetensors_only

        safetensors_only(ck, "model.checkpoint")  # a pickle is refused, never read
        checkpoint, sha = str(ck.resolve()), sha256_file(ck)
    spec = json.dumps({"params": model.params, "inputs": model.inputs,
                       "input_dtypes": model.input_dtypes, "outputs": list(model.outputs)},
                      sort_keys=True)
    return Source("torch", model.factory, sha, checkpoint, spec, _json(data), _json(metric),
                  str(data_dir), _metric_files(metric))


class Splits:
    """The run's data splits, made once: evaluation and parity now (their digests are in every
    key below), calibration when a quantization method first needs it."""

    def __init__(self, t, cfg):
        self.t, self.data_dir = t, cfg.data_dir
        if cfg.data is not None:  # the user's data: its own counts
            n_eval, self.n_cal = cfg.data.evaluation_samples, cfg.data.calibration_samples
        else:
            n_eval, self.n_cal = cfg.model.eval_samples, cfg.model.calibration_samples
        self.evaluation = t.split("evaluation", n_eval, cfg.data_dir)
        self.parity = t.split("evaluation", min(cfg.model.parity_samples, n_eval), cfg.data_dir)
        self._calibration = None

    def calibration(self):
        if self._calibration is None:
            self._calibration = self.t.split("calibration", self.n_cal, self.data_dir)
        return self._calibration


def config_of(key: Source) -> tuple:
    """(DataConfig, MetricConfig) back from a ``Source``'s JSON."""
    from pipeline.config.data import DataConfig
    from pipeline.config.metrics import MetricConfig

    return DataConfig(**json.loads(key.data)), MetricConfig(**json.loads(key.metric))

