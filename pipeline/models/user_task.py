"""What the user's own model (an ONNX file or a torch factory) shares: their data and their metric
behind the task contract.

In: a ``Source`` (its data and metric configs) and the model's declared inputs and outputs (from
the ONNX graph or the config). Out: the contract's data side (splits with the data's content
digest, batches of real samples preprocessed declaratively, int64 and multiple inputs included)
and its output side, per metric: ``classification`` (predictions are the top-k classes; top-1 is
primary), ``ctc`` (decoded strings; sequence accuracy primary, CER) or ``agreement`` (no labels,
``label_free``: the evaluate stage labels each sample with the FP16 baseline's output for it, and
the score is argmax agreement or cosine similarity with it). A metric that does not fit the outputs, or labels
the metric needs and the data lacks, is one line before any stage runs; so is a classifier with
one output column (its argmax never changes: top-1 and agreement would pass any candidate).
What is allowed but suspect is a line in ``warnings``, which the command line prints: CTC labels
with characters outside the character set (those lines can never be read exactly), a label-free
output of one value per sample (a cosine of one value only checks its sign, so the gate judges
the absolute difference, whose limit is in the output's units and the user's to give).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.core.errors import ConfigError, StageError
from pipeline.metrics import agreement as agreement_metrics
from pipeline.metrics import classification, ctc, detection
from pipeline.config.metrics import MetricName
from pipeline.task.metric import MetricSpec
from pipeline.task.contract import Batch, DataSplit, MetricsSpec
from pipeline.task.serving import ArrayInputs, ImageInput


BUCKET_PROBE = 64  # samples whose sizes show which dynamic axis varies


@dataclass(frozen=True)
class OutsideCharset:
    """metric=ctc: labels holding characters the character set cannot spell (never read
    exactly, by any model): carried into the report next to the warning."""
    labels: int        # labels with at least one such character
    of: int            # labels checked (the whole data set)
    characters: str    # those characters, sorted


def _undecoded(ds):
    """``ds`` with its image columns left as files (path, bytes): ``datasets`` would decode
    each whole image before anything could look at the size its header claims."""
    from datasets import Image

    for name, feature in ds.features.items():
        if isinstance(feature, Image) and feature.decode:
            ds = ds.cast_column(name, Image(decode=False))
    return ds


class UserTask:
    """Subclasses set ``inputs`` and ``outputs``."""

    # Several inputs read a column each (the one named like the input, else data.input_column);
    # False: every input is made from data.input_column (a tokenizer's ids, mask, types).
    column_per_input = True

    dynamic_op_types: tuple[str, ...] = ("LSTM", "GRU")  # no static INT8 kernels for these
    prune_ignored: tuple[str, ...] = ()
    _image_input: str | None = None  # the input read from images (data.image pads it), if any
    max_batch: int | None = None  # 1: the graph runs one sample at a time (None: any batch)

    def __init__(self, key):
        from pipeline.models.sources import config_of

        self.key = key
        self.data_cfg, self.metric_cfg = config_of(key)
        self._data = None
        self.warnings: list[str] = []  # one line each, printed before any stage runs and reported
        self.outside_charset: OutsideCharset | None = None  # metric=ctc, when any label has one
        # ctc: outputs [time, batch, classes]; metric.time_major, or what running the graph showed
        self.time_major = self.metric_cfg.time_major

    # -- set up by the subclass once inputs/outputs are known ----------------------------------
    def _finish(self):
        """Check data against the model and the metric against the outputs: one line each."""
        if not self.inputs:
            raise ConfigError(f"{self.what}: the model declares no inputs")
        data = self.data()
        self._check_columns(data)
        self.size_axis = self._bucket_axis(data)
        self._learn_outputs()
        self.metrics = self._primary(self._metrics(data))

    def _check_columns(self, data) -> None:
        """Each input is a column of the data: several, each the column named like it (else
        data.input_column); one, data.input_column, else the column named like it (a saved set
        whose column is the input's name, ``images``, read without naming it again)."""
        if self.data_cfg.pair_columns:
            raise ConfigError(f"data.pair_columns: sentence pairs are read by model=hf (a text "
                              f"encoder); {self.what} reads data.input_column")
        columns = data.dataset.column_names
        if len(self.inputs) > 1:
            self.columns = self._input_columns(columns)
        elif self.column_per_input:
            name, configured = self.inputs[0].name, self.data_cfg.input_column
            if configured not in columns and name not in columns:
                raise ConfigError(f"data.input_column={configured}: not a column of "
                                  f"{self.data_cfg.path}, nor is the model's input {name} "
                                  f"(columns: {', '.join(columns)})")
            self.columns = {name: configured if configured in columns else name}

    def _input_columns(self, columns: list[str]) -> dict[str, str]:
        """Each input reads the column named like it, else data.input_column; each column feeds
        one input at most."""
        fallback = self.data_cfg.input_column
        chosen = {i.name: i.name if i.name in columns else fallback for i in self.inputs}
        names = [i.name for i in self.inputs]
        for name, column in chosen.items():
            if column not in columns:
                raise ConfigError(f"{self.what} has inputs {names}; the data has no column "
                                  f"{name!r}, nor data.input_column={fallback} (columns: "
                                  f"{', '.join(columns)})")
        for column in set(chosen.values()):
            readers = [n for n, c in chosen.items() if c == column]
            if len(readers) > 1:
                raise ConfigError(f"{self.what} has inputs {names}; {' and '.join(readers)} would "
                                  f"all read column {column!r}: name a column after each input "
                                  f"(columns: {', '.join(columns)})")
        return chosen

    def _bucket_axis(self, data) -> tuple[str, int]:
        """The dynamic axis timing buckets by (``real_batches.bucket_axis``): the one the user
        names (``data.bucket_axis``), else the one whose sizes vary over the first samples."""
        from pipeline.data.real_batches import bucket_axis

        named = self.data_cfg.bucket_axis
        samples = []
        if not named:
            ds = self._select(data.evaluation[:BUCKET_PROBE])
            samples = self._arrays(ds, list(range(len(ds))))
        try:
            return bucket_axis(self.inputs, samples, named)
        except ValueError as e:
            raise ConfigError(f"data.bucket_axis={named}: {e}") from None

    def _learn_outputs(self) -> None:
        """What the model really returns, where its declarations cannot be trusted (ONNX)."""

    @property
    def label_free(self) -> bool:
        return self.metric_cfg.name == MetricName.agreement

    @property
    def what(self) -> str:
        return f"model={self.key.kind} ({Path(self.key.path).name})"

    def _metrics(self, data) -> MetricsSpec:
        m, out = self.metric_cfg, self.outputs[0]
        if m.name != MetricName.agreement and not data.has_labels:
            raise ConfigError(f"metric={m.name.value} needs labels: data.path={self.data_cfg.path} "
                              f"has no {self.data_cfg.label_column!r} column (a folder without "
                              "label subfolders?); use metric=agreement for a label-free run")
        last = out.shape[-1] if out.shape else None
        if m.name == MetricName.classification:
            if len(out.shape) != 2:
                raise ConfigError(f"metric=classification needs an output [batch, classes]; "
                                  f"{self.what}'s output {out.name} has shape {list(out.shape)}")
            if last == 1:
                raise ConfigError(f"metric=classification: {self.what}'s output {out.name} has one "
                                  "class ([batch, 1]): its argmax never changes, so top-1 and "
                                  "agreement cannot see a damaged candidate; for one logit or "
                                  "score use metric=agreement (judged by the absolute difference)")
            if isinstance(last, int):
                self._check_classes(data, last)
            specs = [classification.SPECS["top1"]]
            if m.top_k > 1 and (not isinstance(last, int) or m.top_k <= last):
                specs.append(MetricSpec(f"top{m.top_k}", True))
            return MetricsSpec(tuple(specs), "top1")
        if m.name == MetricName.ctc:
            if len(out.shape) != 3:
                raise ConfigError(f"metric=ctc needs an output [batch, time, classes]; {self.what}'s "
                                  f"output {out.name} has shape {list(out.shape)}")
            self.charset = self._charset(last if isinstance(last, int) else None)
            if isinstance(last, int) and last != len(self.charset) + 1:
                raise ConfigError(f"metric=ctc: the output has {last} classes; a character set of "
                                  f"{len(self.charset)} plus the blank needs "
                                  f"{len(self.charset) + 1}"
                                  f"{ctc.paddle_space_hint(last, self.charset)}")
            self._check_labels(data)
            return MetricsSpec((ctc.SPECS["sequence_accuracy"], ctc.SPECS["cer"]),
                               "sequence_accuracy")
        if m.detections:
            return self._detection_metrics(out)
        classes = self._class_axis()
        fixed = [d for d in out.shape[1:] if isinstance(d, int)]
        if len(fixed) == len(out.shape) - 1 and int(np.prod(fixed)) == 1:  # one value a sample
            self.warnings.append(
                f"metric=agreement: {self.what}'s output {out.name} holds one value per sample "
                f"({list(out.shape)}): a cosine of one value only checks its sign, so the gate "
                "judges max_abs_diff (in the output's units) and rows within gate.output_rtol")
            names = ["max_abs_diff", "mean_abs_diff"]
            return MetricsSpec(tuple(agreement_metrics.SPECS[n] for n in names), "max_abs_diff")
        primary = "argmax_agreement" if classes else "cosine_mean"
        names = ([primary] if classes else []) + ["cosine_mean", "cosine_p1", "max_abs_diff",
                                                  "mean_abs_diff"]
        if self._channel_axis():  # a detector's boxes and scores: each part judged on its own
            names.insert(names.index("cosine_p1") + 1, "cosine_parts")
            if _end2end_shaped(out.shape):
                self.warnings.append(
                    f"metric=agreement: {self.what}'s output {out.name} {list(out.shape)} has "
                    "the shape of an end-to-end detector's output ([batch, detections, 6]: x1, "
                    "y1, x2, y2, score, class); if it is one, metric.detections=end2end judges "
                    "the detections it selects (a one-class head's anchors before suppression "
                    "have 6 columns too: metric.detections=yolov5 or yolox)")
            elif _head_shaped(out.shape):
                self.warnings.append(
                    f"metric=agreement: {self.what}'s output {out.name} {list(out.shape)} has "
                    "the shape of a detector's head ([batch, box + classes, anchors] or its "
                    "transpose); if it is one, before any suppression, metric.detections=yolo, "
                    "yolov5 or yolox (as its head is laid out) judges the boxes it decodes to (an "
                    "argmax over anchors flips on rounding, and the boxes' pixels hold up a "
                    "cosine)")
        return MetricsSpec(tuple(agreement_metrics.SPECS[n] for n in dict.fromkeys(names)), primary)

    def _detection_metrics(self, out) -> MetricsSpec:
        """metric.detections: the first output is a detector's head, [batch, box channels +
        classes, anchors] (or its last two axes swapped), or an end-to-end graph's rows; judged
        by the detections decoded from it, the numbers' cosine and differences reported beside."""
        m = self.metric_cfg
        if m.detections == "end2end":
            self._check_end2end(out)
            return _detection_spec()
        first = detection.BOX_CHANNELS[m.detections]
        fixed = [d for d in out.shape[1:] if isinstance(d, int)]
        if len(out.shape) != 3 or not fixed or min(fixed) < first + 1:
            raise ConfigError(f"metric.detections={m.detections}: its head is [batch, {first} + "
                              f"classes, anchors] (or its last two axes swapped), with at least "
                              f"one class; {self.what}'s output {out.name} has shape "
                              f"{list(out.shape)}")
        if m.detections in ("yolo", "yolov5") and _end2end_shaped(out.shape):
            self._not_rows(out, m.detections, max(fixed))
        if m.detections == "yolox":
            height, width = self.detection_head().input_size
            anchors = max(fixed)
            if len(fixed) < 2 or detection.grid_strides(anchors, height, width) is None:
                raise ConfigError(
                    f"metric.detections=yolox: {self.what}'s output {out.name} "
                    f"{list(out.shape)} is not the grids of its {height}x{width} input at "
                    f"strides 8, 16, 32 (and 64), where each anchor is one cell; a head "
                    f"exported with its boxes decoded is metric.detections=yolov5")
        return _detection_spec()

    def _not_rows(self, out, layout: str, anchors: int) -> None:
        """A head read from an output shaped like an end-to-end graph's rows ([batch, up to 1000,
        6]): refused where the input fixes its size and the rows are not a head's cells over it
        (a head's anchors are its strides' cells, one or three each), else a warning."""
        _, size = self._image_size()
        says = (f"metric.detections={layout}: {self.what}'s output {out.name} "
                f"{list(out.shape)} has the shape of an end-to-end graph's rows (x1, y1, x2, y2, "
                f"score, class), which metric.detections=end2end reads")
        if size is None:
            self.warnings.append(says + "; the input's size is open, so its rows cannot be "
                                 "checked against a head's grids")
        elif not detection.on_some_grid(anchors, *size):
            raise ConfigError(says + f"; its {anchors} rows are not the cells of a head's "
                              f"grids over its {size[0]}x{size[1]} input")

    def _check_end2end(self, out) -> None:
        """An end-to-end graph's rows, [batch, detections, 6 or more]; a count of rows no
        exporter keeps is a head's anchors (a one-class YOLOv5 head has 6 columns too)."""
        cols, rows = (out.shape[2], out.shape[1]) if len(out.shape) == 3 else (None, None)
        if (not isinstance(cols, int) or cols < detection.END2END_COLUMNS
                or cols > detection.END2END_MAX_COLUMNS):
            raise ConfigError(
                f"metric.detections=end2end: its output is [batch, detections, "
                f"{detection.END2END_COLUMNS}] (x1, y1, x2, y2, score, class; columns after them, "
                f"{detection.END2END_MAX_COLUMNS} at most, are not read); {self.what}'s output "
                f"{out.name} has shape {list(out.shape)}")
        if isinstance(rows, int) and rows > detection.END2END_MAX_ROWS:
            raise ConfigError(
                f"metric.detections=end2end: {self.what}'s output {out.name} {list(out.shape)} "
                f"has {rows} rows, more than an end-to-end export keeps "
                f"({detection.END2END_MAX_ROWS} at most): rows of a head's anchors, before any "
                f"suppression, are metric.detections=yolo, yolov5 or yolox")

    def detection_head(self) -> detection.Head:
        """How ``metric.detections`` reads the first output; a ``yolox`` head's grids are over
        the model's image input, whose height and width its graph fixes."""
        m = self.metric_cfg
        size = None
        if m.detections == "yolox":
            image, size = self._image_size()
            if not size:
                raise ConfigError(
                    f"metric.detections=yolox: the head's boxes are on grids over the input's "
                    f"height and width, which {self.what} does not fix ("
                    + (f"input {image.name} {list(image.shape)}" if image else "no 4-D input")
                    + "): export it at the size its inference code feeds")
        return detection.Head(m.detections, m.score_threshold, m.iou_threshold,
                              m.nms or "per_class", size)

    def _image_size(self):
        """The image input and its height and width, where the graph fixes both (else None)."""
        image = next((i for i in self.inputs if len(i.shape) == 4), None)
        axes = (1, 2) if self.data_cfg.image.layout == "nhwc" else (2, 3)
        size = image and tuple(image.shape[a] for a in axes)
        return image, (size if size and all(isinstance(d, int) for d in size) else None)

    def _check_classes(self, data, classes: int) -> None:
        """Labels the output cannot name: a class past the output's last is never predicted, so
        top-1 falls for the baseline and the candidate alike and the gate compares two equally
        wrong scores and passes. Refused, as a one-class output is."""
        col = self.data_cfg.label_column
        labels = [v for v in data.dataset[col] if v is not None]
        try:
            y = classification.label_ids(labels, self.metric_cfg.class_names or None)
        except (ValueError, TypeError) as e:
            raise ConfigError(f"metric=classification: data.path={self.data_cfg.path}: {e} "
                              "(metric.class_names maps label names to output indices)") from None
        if len(y) and (y.min() < 0 or y.max() >= classes):
            raise ConfigError(f"metric=classification: data.path={self.data_cfg.path} has labels "
                              f"{y.min()}..{y.max()} but {self.what}'s output "
                              f"{self.outputs[0].name} has {classes} classes (0..{classes - 1}): "
                              "a label it cannot output is never right, for any model")

    def _check_labels(self, data) -> None:
        """CTC labels the character set cannot spell: never read exactly, whatever the model."""
        col = self.data_cfg.label_column
        if col not in data.dataset.column_names:
            return
        known = set(self.charset)
        bad = [str(t) for t in data.dataset[col] if t is not None and set(str(t)) - known]
        if bad:
            chars = sorted(set("".join(bad)) - known)
            self.outside_charset = OutsideCharset(len(bad), len(data.dataset), "".join(chars))
            self.warnings.append(
                f"metric=ctc: {len(bad)} of {len(data.dataset)} labels in {self.data_cfg.path} hold "
                f"characters outside the character set ({len(self.charset)} characters): "
                f"{''.join(chars[:10])!r}{' ...' if len(chars) > 10 else ''}; those lines can "
                "never be read exactly")

    def _primary(self, metrics: MetricsSpec) -> MetricsSpec:
        """``metric.primary``: the user names which of the task's metrics the gate judges."""
        want = self.metric_cfg.primary
        if not want or want == metrics.primary:
            return metrics
        if want not in metrics.names:
            hint = (" (spearman needs sentence pairs with gold scores: data.pair_columns and "
                    "data.label_column)" if want == "spearman" else "")
            raise ConfigError(f"metric.primary={want}: {self.what} reports "
                              f"{', '.join(metrics.names)}{hint}")
        return MetricsSpec(metrics.specs, want)

    def _charset(self, classes: int | None = None) -> list[str]:
        if self.metric_cfg.charset:
            try:
                return ctc.charset_from_file(self.metric_cfg.charset)
            except ValueError as e:
                raise ConfigError(f"metric.charset: {e}") from None
        try:
            found = self.charset_from_model(classes)
        except ValueError as e:
            raise ConfigError(f"metric=ctc: {e}") from None
        if not found:
            raise ConfigError(f"metric=ctc: no character set: give metric.charset=<file>; "
                              f"{self.what} has none in its metadata "
                              f"({', '.join(ctc.METADATA_KEYS)})")
        return found

    def charset_from_model(self, classes: int | None = None) -> list[str] | None:
        return None

    # -- data ----------------------------------------------------------------------------------
    def data(self):
        if self._data is None:
            from pipeline.data.load import load

            # a model whose inputs read a column each checks them itself (_check_columns)
            self._data = load(self.data_cfg, cache_dir=str(Path(self.key.data_dir) / "hf-cache"),
                              input_column=not self.column_per_input)
        return self._data

    def split(self, which: str, count: int, data_dir: str) -> DataSplit:
        data = self.data()
        rows = data.calibration if which == "calibration" else data.evaluation
        return DataSplit(self.key, which, min(count, len(rows)), self.data_cfg.path, data.digest)

    def dataset(self, split: DataSplit):
        data = self.data()
        if data.digest != split.digest:
            raise StageError(f"data.path={self.data_cfg.path} changed since the run started "
                             f"(digest {data.digest[:12]} != {split.digest[:12]}); run again")
        rows = data.calibration if split.split == "calibration" else data.evaluation
        return self._select(rows[:split.count])

    def _select(self, rows: list[int]):
        """The samples of these rows of the data set (one per row here)."""
        return self.data().dataset.select(rows)

    def _arrays(self, ds, rows: list[int]) -> list[dict]:
        """Per sample, its feeds without the batch axis (images preprocessed, others as arrays)."""
        from pipeline.data.images import to_array

        columns = {i.name: self.column_of(i.name) for i in self.inputs}
        out = []
        chosen = _undecoded(ds.select(rows))  # _row decodes each image once its size is checked
        for k in range(len(chosen)):
            r = self._row(chosen, k)
            sample = {}
            for i in self.inputs:
                value = r[columns[i.name]]
                image = hasattr(value, "convert")
                if image:  # data.image pads this input when lines are batched
                    self._image_input = i.name
                a = to_array(value, self.data_cfg.image) if image else np.asarray(value)
                sample[i.name] = a.astype(i.dtype, copy=False)
            out.append(sample)
        return out

    def _row(self, ds, k: int) -> dict:
        """Row ``k``, its images decoded; a file that is not a whole image (truncated, not an
        image at all) or whose header claims more than ``images.MAX_PIXELS`` pixels (refused
        before it is decoded) is one line naming that file."""
        from datasets import Image

        from pipeline.data.images import open_checked

        try:
            row = ds[k]
        except (OSError, SyntaxError, ValueError) as e:  # what Pillow raises for a bad file
            raise StageError(f"{self._file_of(ds, k)}: cannot be read as an image "
                             f"({str(e) or type(e).__name__})") from None
        for name, feature in ds.features.items():
            raw = row.get(name)
            if isinstance(feature, Image) and not feature.decode and isinstance(raw, dict):
                row[name] = open_checked(raw.get("bytes") or raw["path"],
                                         name=raw.get("path") or f"data.path="
                                         f"{self.data_cfg.path}: row {k}")
        return row

    def _file_of(self, ds, k: int) -> str:
        """The file an image of row ``k`` was read from, else the row of the data set."""
        from datasets import Image

        for name, feature in ds.features.items():
            if isinstance(feature, Image):
                raw = ds.cast_column(name, Image(decode=False))[k][name] or {}
                if raw.get("path"):
                    return raw["path"]
        return f"data.path={self.data_cfg.path}: a row"

    def sizes(self, ds) -> np.ndarray:
        name, axis = self.size_axis
        if axis == 0:
            return np.ones(len(ds), dtype=np.int64)
        return np.asarray([s[name].shape[axis - 1] for s in self._arrays(ds, list(range(len(ds))))])

    def _collate(self, samples: list[dict]) -> dict:
        from pipeline.data import images

        feeds = {}
        for i in self.inputs:
            arrays = [s[i.name] for s in samples]
            if i.name == self._image_input:  # data.image's padding and multiple
                prep = self.data_cfg.image
                shape = images.padded_shape(arrays, prep)
                feeds[i.name] = np.stack([images.pad(a, shape, prep) for a in arrays])
                continue
            sized = i.name == self.size_axis[0] and self.size_axis[1] > 0
            feeds[i.name] = stack_arrays(arrays, self.size_axis[1] - 1 if sized else None,
                                         self.data_cfg.image.pad_width_multiple)
        return feeds

    def batches(self, ds, batch_size: int, sort: bool = True, bounded: bool = False):
        label = self.data_cfg.label_column
        labels = ds[label] if label in ds.column_names else [None] * len(ds)
        order = (np.argsort(self.sizes(ds), kind="stable") if sort else np.arange(len(ds)))
        batch_size = min(batch_size, self.max_batch or batch_size)  # what the graph can run
        for k in range(0, len(order), batch_size):
            idx = [int(i) for i in order[k:k + batch_size]]
            yield Batch(idx, self._collate(self._arrays(ds, idx)), [labels[i] for i in idx])

    def stack(self, requests: list[dict]) -> dict:
        return self._collate([{n: a[0] for n, a in r.items()} for r in requests])

    def example(self, batch: int = 1) -> dict:
        """The first evaluation sample, repeated: a real input of every declared shape."""
        ds = self._select(self.data().evaluation[:1])
        first = next(self.batches(ds, 1)).feeds
        batch = min(batch, self.max_batch or batch)
        return {n: np.repeat(a, batch, axis=0) for n, a in first.items()}

    def _channel_axis(self) -> bool:
        """The output has a fixed channel axis 1 (above 1) after which more axes follow
        ([batch, 4 + classes, anchors]): its channels can be told apart by their ranges."""
        shape = self.outputs[0].shape
        return len(shape) >= 3 and isinstance(shape[1], int) and shape[1] > 1

    def _class_axis(self) -> bool:
        """The output ends in a class axis: a fixed size above 1 ([batch, classes], [batch,
        time, classes]). A dense map ([batch, 1, height, width], a text detector's) ends in a
        dynamic width, whose argmax is no decision."""
        shape = self.outputs[0].shape
        return len(shape) >= 2 and isinstance(shape[-1], int) and shape[-1] > 1

    # -- serving: what a server needs to read a request as the evaluation read its samples -------
    def serving_spec(self) -> ImageInput | ArrayInputs | None:
        """One image input's preprocessing, or each array input's dtype and shape (one of them
        perhaps read from an image), and the output's decoding (``user_serving``); None for a
        model of two image inputs (``not_served`` says why)."""
        from pipeline.models import user_serving

        return user_serving.spec(self)

    @property
    def not_served(self) -> str | None:
        from pipeline.models import user_serving

        return user_serving.why_not(self)

    def column_of(self, name: str) -> str:
        """The data's column input ``name`` is read from."""
        columns = getattr(self, "columns", None)
        return columns[name] if columns else self.data_cfg.input_column

    def first_image_size(self, name: str) -> tuple[int, int]:
        """(width, height) of the first evaluation image of input ``name``, as the evaluation
        decoded it."""
        data = self.data()
        ds = _undecoded(data.dataset.select(data.evaluation[:1]))
        return tuple(self._row(ds, 0)[self.column_of(name)].size)

    # -- outputs -------------------------------------------------------------------------------
    def predictions(self, outputs) -> list:
        out = np.asarray(outputs)
        name = self.metric_cfg.name
        if name == MetricName.classification:
            return top_classes(out, self.metric_cfg.top_k)
        if name == MetricName.ctc:
            return ctc.greedy_decode(out, self.charset, self.time_major)
        if self.metric_cfg.detections:
            return detection_predictions(out, self.detection_head())
        return agreement_predictions(out, self._class_axis())

    def margins(self, outputs) -> list[float]:
        x = np.asarray(outputs, dtype=np.float64)
        if self.metric_cfg.name == MetricName.ctc and self.time_major:
            x = x.transpose(1, 0, 2)
        if x.ndim < 2 or x.shape[-1] < 2:
            return [0.0] * len(x)
        x = x - x.max(axis=-1, keepdims=True)
        logp = x - np.log(np.exp(x).sum(axis=-1, keepdims=True))
        top2 = np.sort(logp, axis=-1)[..., -2:]
        gap = top2[..., 1] - top2[..., 0]
        return [float(v) for v in gap.reshape(len(x), -1).min(axis=1)]

    def score(self, predictions: list, labels: list, truth: list | None = None) -> dict[str, float]:
        """``truth``: in a label-free run (``labels`` are the FP16 baseline's outputs), the data's
        own labels, which a task may score besides (``HfTask``: gold scores of sentence pairs)."""
        name = self.metric_cfg.name
        if name == MetricName.classification:
            try:
                y = classification.label_ids(labels, self.metric_cfg.class_names or None)
            except ValueError as e:
                raise StageError(f"metric=classification: {e}") from None
            k = self.metrics.specs[-1].name
            hit1 = [p[0] == t for p, t in zip(predictions, y)]
            hitk = [t in p for p, t in zip(predictions, y)]
            res = {"top1": 100.0 * float(np.mean(hit1))}
            if k != "top1":
                res[k] = 100.0 * float(np.mean(hitk))
            return res
        if name == MetricName.ctc:
            return ctc.score(predictions, [str(t) for t in labels])
        outs = [np.asarray(p["output"], dtype=np.float64)[None] for p in predictions]
        refs = [np.asarray(t, dtype=np.float64)[None] for t in labels]
        m = self.metric_cfg
        if m.detections:  # the baseline's detections decoded as the candidate's were
            res = agreement_metrics.agreement(refs, outs)
            found = [p["detections"] for p in predictions]
            read = self.detection_head()
            res["detection_f1"] = detection.f1([read.decode(r[0]) for r in refs], found)
            res["detections_found"] = sum(len(f) for f in found)  # a count: printed as one
            return res
        return agreement_metrics.agreement(refs, outs, parts=self._channel_axis())


def _detection_spec() -> MetricsSpec:
    """A detector judged by its detections, its outputs' numbers reported beside."""
    names = ["cosine_mean", "cosine_p1", "max_abs_diff", "mean_abs_diff"]
    return MetricsSpec((detection.SPECS["detection_f1"], detection.SPECS["detections_found"],
                        *(agreement_metrics.SPECS[n] for n in names)), "detection_f1")


def _end2end_shaped(shape) -> bool:
    """[batch, detections, 6]: rows of corners, score and class, as many as an exporter keeps."""
    return (len(shape) == 3 and shape[2] == detection.END2END_COLUMNS
            and (not isinstance(shape[1], int)
                 or detection.END2END_COLUMNS < shape[1] <= detection.END2END_MAX_ROWS))


def _head_shaped(shape) -> bool:
    """[batch, channels, anchors] or [batch, anchors, channels]: at least 5 channels (a box and
    a score) and 8 times as many anchors; anchors the graph leaves open only after the channels
    (open before them, they are more likely a sequence's time steps)."""
    if len(shape) != 3 or not isinstance(shape[1], int) and not isinstance(shape[2], int):
        return False
    channels, anchors = shape[1], shape[2]
    if isinstance(channels, int) and channels >= 5 and not isinstance(anchors, int):
        return True
    return (isinstance(channels, int) and isinstance(anchors, int)
            and min(channels, anchors) >= 5 and max(channels, anchors) >= 8 * min(channels, anchors))


def stack_arrays(arrays: list, size_dim: int | None, multiple: int = 1) -> np.ndarray:
    """Samples of one input (no batch axis) as one batch, each padded at the end of every axis
    to the largest (floats with their edge values, integers with 0), the sample axis
    ``size_dim`` (the one timing buckets by, if any) up to a multiple of ``multiple``. The
    evaluation's batches and a server's are made by this one function."""
    target = [max(a.shape[d] for a in arrays) for d in range(arrays[0].ndim)]
    if size_dim is not None and multiple > 1:
        target[size_dim] = -(-target[size_dim] // multiple) * multiple
    mode = "edge" if np.issubdtype(arrays[0].dtype, np.floating) else "constant"
    return np.stack([np.pad(a, [(0, t - s) for s, t in zip(a.shape, target)], mode=mode)
                     for a in arrays])


def top_classes(outputs, top_k: int) -> list[list[int]]:
    """A classifier's predictions: its ``top_k`` classes (fewer if it has fewer), best first."""
    out = np.asarray(outputs)
    k = max(1, min(top_k, out.shape[1]))
    return [[int(c) for c in row] for row in np.argsort(-out, axis=1, kind="stable")[:, :k]]


def detection_predictions(outputs, read: detection.Head) -> list[dict]:
    """A detector's predictions: each sample's detections (decoded as ``read`` says), what they
    decide (the classes found) and the output, rounded."""
    out = []
    for row in np.asarray(outputs):
        found = read.decode(row)
        out.append({"decision": detection.decision(found), "detections": found,
                    "output": np.round(row.astype(np.float64), 6).tolist()})
    return out


def agreement_predictions(outputs, classes: bool | None = None) -> list[dict]:
    """Label-free predictions: each sample's decision (argmax, per frame if any) and its output,
    rounded. ``classes``: whether the output ends in a class axis, as its declaration says
    (None: read from this batch's shape)."""
    out = np.asarray(outputs)
    decide = out.ndim >= 2 and out.shape[-1] > 1 if classes is None else classes
    return [{"decision": json.dumps(np.argmax(row, axis=-1).tolist()) if decide else None,
             "output": np.round(row.astype(np.float64), 6).tolist()} for row in out]
