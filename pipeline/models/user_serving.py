"""What a server needs to answer a request for the user's own image model (an ONNX file or a torch
factory) as its evaluation read its samples.

In: a ``UserTask`` whose one input is read from an image column of the data (``data=imagefolder``,
``labels_file``, or any format with an image column). Out: ``spec(task)``, the ``serving`` record
a run writes into ``report.json`` and the manifest: the input's name and dtype, every
``data.image`` step (``ImagePrep``, field by field), the size of the first evaluation image (what
a server warms up with: a model of fixed size without a resize takes no other), and how the
first output reads, per metric: ``ctc`` the character set (travelling inside the record: the
user's charset file does not travel) and the layout; ``classification`` the top-k and the class
names (``metric.class_names``, else an image folder's label names); ``agreement`` whether the
output ends in a class axis. The input's declared shape travels too: an image that would not fit
a fixed size is refused by the server in one line, not by the runtime. ``why_not(task)``: the one
line saying why a model is not served (several inputs, or an input that is not an image), None
when it is.
"""
from __future__ import annotations

import dataclasses

from pipeline.config.metrics import MetricName


def why_not(task) -> str | None:
    if len(task.inputs) != 1:
        names = ", ".join(i.name for i in task.inputs)
        return (f"{task.what} has {len(task.inputs)} inputs ({names}); the server reads one image "
                "per request")
    if _image_feature(task) is None:
        return (f"{task.what} reads data.input_column={task.data_cfg.input_column}, which is not "
                "an image column; the server reads PNG or JPEG images for the user's own models")
    return None


def spec(task) -> dict | None:
    """The serving record, or None when ``why_not`` has a reason."""
    if why_not(task) is not None:
        return None
    m = task.metric_cfg
    out = {"reader": "image", "input": task.inputs[0].name, "dtype": task.inputs[0].dtype,
           "shape": list(task.inputs[0].shape),  # fixed sizes, and what each dynamic axis is
           "image": _prep(task.data_cfg.image), "sample_size": list(task.first_image_size()),
           "metric": m.name.value}
    if m.name == MetricName.ctc:
        out.update(charset=list(task.charset), time_major=bool(task.time_major))
    elif m.name == MetricName.classification:
        out.update(top_k=m.top_k, labels=list(m.class_names) or _label_names(task))
    else:
        out.update(class_axis=bool(task._class_axis()))
    return out


def _prep(prep) -> dict:
    """``ImagePrep`` as plain JSON values (the resize mode by its name)."""
    return {f.name: (v.value if hasattr(v, "value") else v)
            for f in dataclasses.fields(prep) for v in [getattr(prep, f.name)]}


def _image_feature(task):
    from datasets import Image

    feature = task.data().dataset.features.get(task.data_cfg.input_column)
    return feature if isinstance(feature, Image) else None


def _label_names(task) -> list[str] | None:
    """An image folder's class names (its label column's ``ClassLabel``), index by index."""
    from datasets import ClassLabel

    feature = task.data().dataset.features.get(task.data_cfg.label_column)
    return list(feature.names) if isinstance(feature, ClassLabel) else None
