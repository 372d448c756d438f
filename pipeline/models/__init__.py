"""Models the pipeline compiles, each seen by the stages only through the task contract
(``pipeline.task.contract``: inputs with their dynamic axes, data splits, batches,
predictions, metrics with their directions).

``task(key)`` gives the ``Task`` for a key: a built-in name (``ocr``, ``ocr_mobile``: the project's
own text recognizers, ``pipeline.models.ocr.task``), or a frozen source spec for the user's own
model (``pipeline.models.sources``: an ONNX file, a torch factory or a Hugging Face folder, with
their data and metric).
Keys are hashable and part of stage keys; the task is rebuilt from the key in a stage's child
process. ``module(name)`` is a built-in task's own module, for the project's OCR benchmarks.
"""
from __future__ import annotations

import functools
import importlib

from pipeline.core.errors import ConfigError

TASKS = {"ocr": "pipeline.models.ocr.crnn", "ocr_mobile": "pipeline.models.ocr.mobile"}


def module(name: str):
    if name not in TASKS:
        raise ConfigError(f"model.source={name!r}: unknown loader; valid choices: "
                          f"{', '.join((*TASKS, 'onnx', 'torch', 'hf'))}")
    return importlib.import_module(TASKS[name])


def check_params(name: str, params: dict) -> None:
    """A built-in task's ``model.params``, checked when the config is made (one line each)."""
    if name in TASKS:
        from pipeline.models.ocr.task import check_params as check

        check(params)


@functools.lru_cache(maxsize=None)
def task(key):
    """The ``Task`` for ``key`` (a built-in name or a source spec); one instance per process."""
    if isinstance(key, str):
        from pipeline.models.ocr.task import OcrTask

        return OcrTask(key, module(key))
    if key.kind == "hf":  # a Source (pipeline.models.sources): a Hugging Face folder
        from pipeline.models.hf_folder import HfTask

        return HfTask(key)
    if key.kind == "onnx":  # a Source (pipeline.models.sources): the user's own model
        from pipeline.models.onnx_file import OnnxTask

        return OnnxTask(key)
    from pipeline.models.torch_factory import TorchTask

    return TorchTask(key)
