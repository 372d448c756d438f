"""Tasks the pipeline knows, by ``model.name``. A task module provides: ``build_network``,
``example_input``, ``dataset``, ``batches``, ``stack``, ``decode``, ``margins``, ``metrics``,
``PRIMARY_METRIC``,
``INPUT_NAME`` and ``OUTPUT_NAME``. Bring your own model by adding a module with these and a line
here (see the README)."""
from __future__ import annotations

import importlib

from pipeline.errors import ConfigError

TASKS = {"ocr": "pipeline.models.ocr.crnn", "ocr_mobile": "pipeline.models.ocr.mobile"}


def task(name: str):
    if name not in TASKS:
        raise ConfigError(f"model.name={name!r}: unknown task; valid choices: {', '.join(TASKS)}")
    return importlib.import_module(TASKS[name])
