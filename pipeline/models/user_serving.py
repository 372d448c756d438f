"""What a server needs to answer a request for the user's own model (an ONNX file or a torch
factory) as its evaluation read its samples.

In: a ``UserTask``. One whose one input is read from an image column of the data
(``data=imagefolder``, ``labels_file``, or any format with an image column) is served from PNG or
JPEG bytes; one whose inputs are all arrays (a table's number lists: audio frames, byte features)
from a JSON body holding one sample's arrays by input name (each input's name, dtype and declared
shape, the axis batches are bucketed by and its padding multiple travel, and the first evaluation
sample's shapes, which warm-up sends as zeros). Out: ``spec(task)``, the typed ``serving`` record
(``pipeline.task.serving``) a run writes into ``report.json`` and the manifest; for an image: the
input's name and dtype, every ``data.image`` step (``ImagePrep``, field by field), the size of the
first evaluation image (what a server warms up with: a model of fixed size without a resize takes
no other), and how the first output reads (``Decoding``), per metric: ``ctc`` the character set
(travelling inside the record: the user's charset file does not travel) and the layout;
``classification`` the top-k and the class names (``metric.class_names``, else an image folder's
label names); ``agreement`` whether the output ends in a class axis. The input's declared shape
travels too: an image that would not fit a fixed size is refused by the server in one line, not by
the runtime. ``why_not(task)``: the one line saying why a model is not served (an image input
beside others), None when it is.
"""
from __future__ import annotations

import dataclasses

from pipeline.config.metrics import MetricName
from pipeline.task.serving import ArrayInput, ArrayInputs, Decoding, ImageInput, ImagePart


def why_not(task) -> str | None:
    images = _image_inputs(task)
    if len(images) > 1:
        return (f"{task.what} has {len(images)} inputs read from images ({', '.join(images)}); "
                "the server reads one image per request")
    return None


def spec(task) -> ImageInput | ArrayInputs | None:
    """The serving record, or None when ``why_not`` has a reason."""
    if why_not(task) is not None:
        return None
    images = _image_inputs(task)
    first = task.inputs[0]
    if images and len(task.inputs) == 1:  # the image file is the body
        return ImageInput(input=first.name, dtype=first.dtype, shape=tuple(first.shape),
                          image=dataclasses.replace(task.data_cfg.image),  # a copy
                          sample_size=tuple(task.first_image_size(first.name)),
                          decoding=_decoding(task))
    # arrays, as a JSON body: one sample, each input by name (an image file among them: base64)
    image = ImagePart(name=images[0], steps=dataclasses.replace(task.data_cfg.image),
                      sample_size=tuple(task.first_image_size(images[0]))) if images else None
    return ArrayInputs(
        inputs=tuple(ArrayInput(name=i.name, dtype=i.dtype, shape=tuple(i.shape))
                     for i in task.inputs),
        size_axis=tuple(task.size_axis),
        pad_width_multiple=task.data_cfg.image.pad_width_multiple,
        example={n: tuple(a.shape[1:]) for n, a in task.example(1).items()},
        image_input=image, decoding=_decoding(task))


def _image_inputs(task) -> list[str]:
    return [i.name for i in task.inputs if _image_feature(task, i.name) is not None]


def _decoding(task) -> Decoding:
    """How the first output reads, per metric."""
    m = task.metric_cfg
    if m.name == MetricName.ctc:
        return Decoding(metric=m.name, charset=tuple(task.charset),
                        time_major=bool(task.time_major))
    if m.name == MetricName.classification:
        labels = list(m.class_names) or _label_names(task)
        return Decoding(metric=m.name, top_k=m.top_k,
                        labels=tuple(labels) if labels is not None else None)
    if m.detections:  # a detector's head: answered as its detections, decoded as evaluated
        read = task.detection_head()
        return Decoding(metric=m.name, detections=read.layout,
                        score_threshold=read.score_threshold, iou_threshold=read.iou_threshold,
                        nms=read.nms, input_size=read.input_size)
    return Decoding(metric=m.name, class_axis=bool(task._class_axis()))


def _image_feature(task, name: str):
    """The image feature of the column input ``name`` reads, if it is one."""
    from datasets import Image

    feature = task.data().dataset.features.get(task.column_of(name))
    return feature if isinstance(feature, Image) else None


def _label_names(task) -> list[str] | None:
    """An image folder's class names (its label column's ``ClassLabel``), index by index."""
    from datasets import ClassLabel

    feature = task.data().dataset.features.get(task.data_cfg.label_column)
    return list(feature.names) if isinstance(feature, ClassLabel) else None
