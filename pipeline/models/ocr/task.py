"""The built-in OCR tasks (``ocr``: CRNN, ``ocr_mobile``: MobileNetV3-style blocks) as one
implementation of the task contract (``pipeline.task.contract``).

In: the task's module (``pipeline.models.ocr.crnn`` or ``mobile``: network, generated data sets,
batching, CTC decoding, scores). Out: a ``Task``: one grey input ``image`` [batch, 1, 32, width]
whose width is the dynamic axis timing buckets by, one output ``logits`` [batch, time, classes],
sequence accuracy (primary, higher is better) and CER (lower is better), and the model's own
defaults for what quantization keeps dynamic (the LSTM) and what pruning keeps whole (the first
conv and the head). Everything is delegated to the module, so the numbers are the module's.
"""
from __future__ import annotations

import numpy as np

from pipeline.core.errors import StageError
from pipeline.metrics import ctc
from pipeline.task.contract import Batch, DataSplit, InputSpec, MetricsSpec, OutputSpec
from pipeline.task.serving import BuiltinImage


DEFAULT_PARAMS = {"widths": [32, 64, 128, 256, 256], "hidden": 128}  # the schema's defaults


def check_params(params: dict) -> None:
    """``model.params`` as the user gives them, before any stage (the command line's preflight):
    five conv widths and the LSTM's hidden size; absent values are ``DEFAULT_PARAMS``, never written
    back (the config's default instance is the schema every model option merges onto). A pruned
    network's params (six widths: the collapse conv's too) come from the prune stage instead."""
    from pipeline.core.errors import ConfigError

    widths = params.get("widths", DEFAULT_PARAMS["widths"])
    hidden = params.get("hidden", DEFAULT_PARAMS["hidden"])
    if not isinstance(widths, (list, tuple)) or len(widths) != 5 or any(
            not isinstance(w, int) or w <= 0 for w in widths):
        raise ConfigError(f"model.params.widths={widths}: expected 5 positive channel counts")
    if not isinstance(hidden, int) or hidden <= 0:
        raise ConfigError(f"model.params.hidden={hidden}: must be a positive integer")


class OcrTask:
    def __init__(self, key: str, module):
        from pipeline.models.ocr.data import ALPHABET, HEIGHT

        self.key, self.module = key, module
        self.inputs = (InputSpec(module.INPUT_NAME, "float32", ("batch", 1, HEIGHT, "width")),)
        self.outputs = (OutputSpec(module.OUTPUT_NAME, "float32",
                                   ("batch", "time", len(ALPHABET) + 1)),)
        self.metrics = MetricsSpec((ctc.SPECS["sequence_accuracy"], ctc.SPECS["cer"]),
                                   module.PRIMARY_METRIC)
        self.size_axis = (module.INPUT_NAME, 3)
        self.label_free = False  # generated lines come with their text
        self.max_batch = None  # any batch
        self.dynamic_op_types = ("LSTM",)
        self.prune_ignored = ("cnn.0", "head")
        # Pruning takes its trace input, held-out data and recovery loop from the CRNN's helper
        # (pruning_helper); the mobile network's blocks have none yet.
        self.no_pruning = (None if key == "ocr" else
                           f"model {key!r} has no pruning support (its blocks have no recovery "
                           "helper); prune the CRNN (model=ocr), or run with prune=none")
        # One sample for the bill when nothing was measured: a line of height 32 and width 164,
        # the median width of the evaluation lines (first 400 of seed 2); widths are multiples
        # of 4 (the CRNN's pooling). Only the CRNN's bill used it so far: kept so.
        self.representative = (1, 32, 164) if key == "ocr" else None
        self.size_multiple = 4

    def __repr__(self) -> str:
        return f"OcrTask({self.key!r})"

    def pruning_helper(self, net):
        """The CRNN's pruning helper (``pipeline.models.ocr.prune``: generated lines, its own
        training loop); imported on use, as it pulls in the training code."""
        from pipeline.models.ocr import prune

        return prune.helper(self, net)

    # -- data --------------------------------------------------------------------------------
    def split(self, which: str, count: int, data_dir: str) -> DataSplit:
        _, digest = self.module.dataset(which, count, data_dir)
        return DataSplit(self.key, which, count, str(data_dir), digest)

    def dataset(self, split: DataSplit):
        ds, digest = self.module.dataset(split.split, split.count, split.folder)
        if digest != split.digest:  # rebuilt from its seed and different: never mix the two
            raise StageError(f"the {split.split} set under {split.folder} changed since the run "
                             f"started (digest {digest[:12]} != {split.digest[:12]})")
        return ds

    def sizes(self, ds) -> np.ndarray:
        return np.asarray(ds["width"])

    def batches(self, ds, batch_size: int, sort: bool = True, bounded: bool = False):
        name = self.inputs[0].name
        for idx, images, labels in self.module.batches(ds, batch_size, sort_by_width=sort,
                                                       bounded=bounded):
            yield Batch(idx, {name: images}, labels)

    def stack(self, requests: list[dict]) -> dict:
        name = self.inputs[0].name
        return {name: self.module.stack([r[name] for r in requests])}

    def example(self, batch: int = 1) -> dict:
        return {self.inputs[0].name: self.module.example_input(batch)}

    # -- serving (pipeline.serve) ------------------------------------------------------------
    def from_image(self, image) -> dict:
        """A decoded image (PIL, any size) as the feeds of a batch of one, preprocessed as the
        evaluation preprocessed its lines."""
        return {self.inputs[0].name: self.module.from_image(image)}

    def serving_spec(self) -> BuiltinImage:
        return self.module.serving_spec()

    # -- outputs -----------------------------------------------------------------------------
    def predictions(self, outputs) -> list[str]:
        return self.module.decode(outputs)

    def margins(self, outputs) -> list[float]:
        return self.module.margins(outputs)

    def score(self, predictions: list, labels: list) -> dict[str, float]:
        return self.module.metrics(predictions, labels)

    # -- the torch side (load, export, prune) -----------------------------------------------
    def build_network(self, params: dict, weights: dict | None = None):
        params = {**DEFAULT_PARAMS, **params}
        return self.module.build_network(params["widths"], params["hidden"], weights)
