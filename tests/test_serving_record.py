"""The serving record (``pipeline.task.serving``): what a run writes is what a server reads back,
field for field, and a record written before it was typed still reads (and still equals this
code's own, so a published OCR artifact keeps serving)."""
from __future__ import annotations

import json

import pytest

from pipeline.config.data import ImagePrep
from pipeline.config.metrics import MetricName
from pipeline.core.json_record import to_json
from pipeline.task import serving
from pipeline.task.serving import (ArrayInput, ArrayInputs, Decoding, ImageInput, ImagePart,
                                   TextInput)

# The built-in recognizer's record as runs wrote it before the record was typed (a manifest's
# ``serving`` object, key for key): published artifacts carry exactly this.
OCR_RECORD = {"kind": "image", "input": "image", "output": "logits",
              "image": {"color": "grey", "resize": "height", "height": 32,
                        "interpolation": "bilinear", "width_multiple": 4,
                        "normalize": "x / 127.5 - 1", "pad": "edge"},
              "charset": "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ", "decoder": "ctc_greedy",
              "blank": 0, "prediction": "text"}


def _records():
    return [
        TextInput(task="sequence-classification", input_names=("input_ids", "attention_mask"),
                  max_length=128, pad_token_id=0, metric=MetricName.classification, top_k=5,
                  labels=("neg", "pos"), files={"tokenizer.json": "ab" * 32}),
        ImageInput(input="pixel_values", dtype="float32", shape=("batch", 3, 224, 224),
                   image=ImagePrep(resize="fixed", height=224, width=224, mean=[0.5] * 3,
                                   std=[0.25] * 3),
                   sample_size=(640, 480),
                   decoding=Decoding(metric=MetricName.classification, top_k=5, labels=None)),
        ImageInput(input="x", dtype="float32", shape=("batch", 1, 48, "width"),
                   image=ImagePrep(color="grey", resize="height", height=48),
                   sample_size=(200, 48),
                   decoding=Decoding(metric=MetricName.ctc, charset=("a", "b", " "),
                                     time_major=True)),
        ArrayInputs(inputs=(ArrayInput(name="frames", dtype="float32",
                                       shape=("batch", "time", 40)),
                            ArrayInput(name="lengths", dtype="int64", shape=("batch",))),
                    size_axis=("frames", 1), pad_width_multiple=8,
                    example={"frames": (97, 40), "lengths": ()},
                    decoding=Decoding(metric=MetricName.agreement, class_axis=False)),
        ArrayInputs(inputs=(ArrayInput(name="image", dtype="float32",
                                       shape=("batch", 3, "height", "width")),
                            ArrayInput(name="scale_factor", dtype="float32", shape=("batch", 2))),
                    size_axis=("image", 3), pad_width_multiple=32,
                    example={"image": (3, 640, 640), "scale_factor": (2,)},
                    image_input=ImagePart(name="image", steps=ImagePrep(resize="fixed",
                                                                        height=640, width=640),
                                          sample_size=(1280, 720)),
                    decoding=Decoding(metric=MetricName.agreement, class_axis=False)),
    ]


@pytest.mark.parametrize("record", _records(), ids=lambda r: type(r).__name__)
def test_a_record_reads_back_as_written(record):
    written = json.loads(json.dumps(to_json(record)))
    back = serving.read(written)
    assert type(back) is type(record) and back == record and hash(back) == hash(record)
    assert back.to_dict() == written  # key for key: nothing added or dropped on the way
    # what a reader reads is a field of its type, not a string
    if isinstance(back, ImageInput):
        assert isinstance(back.image, ImagePrep) and back.image.resize.value == written[
            "image"]["resize"]
        assert back.decoding.metric == MetricName(written["metric"])
    if isinstance(back, ArrayInputs):
        assert all(isinstance(i, ArrayInput) for i in back.inputs)
        assert back.inputs[0].shape == tuple(written["inputs"][0]["shape"])
        assert (back.image_input is None) == ("image_input" not in written)
        if back.image_input is not None:
            assert isinstance(back.image_input.steps, ImagePrep)


def test_the_records_of_two_readers_differ():
    records = _records()
    assert len(set(records)) == len(records) and records[1] != records[2]


def test_the_builtin_recognizers_record_is_the_one_runs_always_wrote():
    from pipeline.models.ocr import crnn

    current = crnn.serving_spec()
    assert current.to_dict() == OCR_RECORD
    assert serving.read(OCR_RECORD) == current  # so an artifact published before still serves


def test_a_record_this_code_cannot_read_names_what():
    with pytest.raises(TypeError, match="sharpen"):
        serving.read({**OCR_RECORD, "image": {**OCR_RECORD["image"], "sharpen": 2}})
    with pytest.raises(TypeError, match="reader 'audio'"):
        serving.read({"reader": "audio", "input": "x"})
    image = to_json(_records()[1])
    with pytest.raises(TypeError, match="without its metric"):
        serving.read({k: v for k, v in image.items() if k not in ("metric", "top_k", "labels")})
    with pytest.raises(TypeError, match="JSON object"):
        serving.read(["image"])
    assert serving.read(None) is None


def test_a_record_written_before_a_step_existed_reads_with_that_steps_default():
    """A user's image record from before ``data.image.resampler`` existed was resized by Pillow,
    which is the default it reads back with."""
    image = to_json(_records()[1])
    del image["image"]["resampler"]
    assert serving.read(image).image.resampler == "pillow"
