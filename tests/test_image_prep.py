"""The preprocessing knobs a model's own inference code may need (``data.image.*``), each on tiny
arrays, and the bucketing axis of a model with two dynamic axes of which only one varies."""
from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from pipeline.data import images
from pipeline.data.real_batches import bucket_axis
from pipeline.config.data import ImagePrep
from pipeline.core.errors import ConfigError, StageError
from pipeline.task.contract import InputSpec


def _colour(w: int, h: int, seed: int = 0) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8))


def test_interpolation_is_pils_named_filter():
    img = _colour(40, 12)
    for name, flt in (("lanczos", Image.Resampling.LANCZOS), ("nearest", Image.Resampling.NEAREST)):
        a = images.to_array(img, ImagePrep(color="grey", resize="height", height=6,
                                           interpolation=name, scale=1.0))
        want = np.asarray(img.convert("L").resize((20, 6), flt), dtype=np.float32)
        np.testing.assert_array_equal(a[0], want)
    bilinear = images.to_array(img, ImagePrep(color="grey", resize="height", height=6))
    lanczos = images.to_array(img, ImagePrep(color="grey", resize="height", height=6,
                                             interpolation="lanczos"))
    assert not np.array_equal(bilinear, lanczos)
    with pytest.raises(ConfigError, match="data.image.interpolation='cubic'"):
        ImagePrep(interpolation="cubic")


def test_resampler_opencv_resizes_as_cv2_resize_does():
    """Code built on OpenCV resizes with cv2.resize, whose filters give other pixels than
    Pillow's (no smoothing on a downscale): with resampler=opencv the input is cv2's, to the
    last bit, for each filter, in colour (BGR) and grey, at a fixed size and a height."""
    import cv2

    bgr = np.random.default_rng(3).integers(0, 256, (61, 203, 3), dtype=np.uint8)
    img = Image.fromarray(np.ascontiguousarray(bgr[:, :, ::-1]))  # the file, as RGB
    for name, flag in (("bilinear", cv2.INTER_LINEAR), ("bicubic", cv2.INTER_CUBIC),
                       ("nearest", cv2.INTER_NEAREST), ("lanczos", cv2.INTER_LANCZOS4),
                       ("box", cv2.INTER_AREA)):
        prep = ImagePrep(resize="fixed", height=32, width=96, interpolation=name,
                         resampler="opencv", channel_order="bgr", scale=1.0)
        want = cv2.resize(bgr, (96, 32), interpolation=flag).astype(np.float32)
        np.testing.assert_array_equal(images.to_array(img, prep), want.transpose(2, 0, 1))
        grey = ImagePrep(color="grey", resize="height", height=16, interpolation=name,
                         resampler="opencv", scale=1.0)
        want = cv2.resize(np.asarray(img.convert("L")), (53, 16), interpolation=flag)
        np.testing.assert_array_equal(images.to_array(img, grey)[0], want.astype(np.float32))
    pillow = images.to_array(img, ImagePrep(resize="fixed", height=32, width=96,
                                            interpolation="bicubic", scale=1.0))
    opencv = images.to_array(img, ImagePrep(resize="fixed", height=32, width=96,
                                            interpolation="bicubic", resampler="opencv",
                                            scale=1.0))
    assert np.abs(pillow - opencv).max() > 10  # the knob matters: other pixels
    with pytest.raises(ConfigError, match="interpolation=hamming: OpenCV has no such filter"):
        ImagePrep(resampler="opencv", interpolation="hamming")
    with pytest.raises(ConfigError, match="data.image.resampler='cv'"):
        ImagePrep(resampler="cv")


def test_resampler_opencv_without_opencv_is_one_line_at_compose(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "cv2" else real(name, *a))
    with pytest.raises(ConfigError, match=r"resampler=opencv needs OpenCV: pip install .*opencv"):
        ImagePrep(resize="fixed", height=8, width=8, resampler="opencv")


def test_letterbox_fits_the_image_keeping_its_aspect_centred_on_the_fill():
    """30x20 into 32x32: scaled by 32/30 to 32x21, an 11-row margin split 5 above and 6 below
    (the odd pixel after the image, as Ultralytics' letterbox does); the border is the fill."""
    img = _colour(30, 20)
    prep = ImagePrep(resize="letterbox", height=32, width=32, scale=1.0)
    a = images.to_array(img, prep)
    assert a.shape == (3, 32, 32)
    assert (a[:, :5] == 114).all() and (a[:, 26:] == 114).all()
    np.testing.assert_array_equal(a[:, 5:26].transpose(1, 2, 0), np.asarray(
        img.resize((32, 21), Image.Resampling.BILINEAR), dtype=np.float32))
    tall = images.to_array(_colour(10, 40), ImagePrep(resize="letterbox", height=16, width=16,
                                                      letterbox_fill=0, scale=1.0,
                                                      color="grey"))
    assert tall.shape == (1, 16, 16) and (tall[:, :, :6] == 0).all() and (tall[:, :, 10:] == 0).all()
    assert (tall[:, :, 6:10] != 0).any()  # a 4-column image in the middle
    same = _colour(32, 32)  # already the size: not resampled at all
    np.testing.assert_array_equal(images.to_array(same, prep).transpose(1, 2, 0),
                                  np.asarray(same, dtype=np.float32))
    for bad, words in (({"width": 0}, "resize=letterbox needs a width"),
                       ({"letterbox_fill": 300}, "letterbox_fill=300: a pixel value")):
        with pytest.raises(ConfigError, match=words):
            ImagePrep(**{"resize": "letterbox", "height": 32, "width": 32, **bad})


def test_a_top_left_letterbox_truncates_each_side_and_leaves_the_margin_after_the_image():
    """YOLOX's preproc: 30x20 into 16x16 is scaled by 16/30 to int(16.0) x int(10.67) = 16x10
    (Ultralytics' rounding would give 11 rows), pasted at the top-left corner; the 6 rows below
    it are the fill, and a server maps boxes back with no offset."""
    from pipeline.serve.readers import ImageSteps

    img = _colour(30, 20)
    prep = ImagePrep(resize="letterbox", height=16, width=16, scale=1.0, letterbox_fill=7,
                     letterbox_align="top_left")
    a = images.to_array(img, prep)
    assert a.shape == (3, 16, 16) and (a[:, 10:] == 7).all()
    np.testing.assert_array_equal(a[:, :10].transpose(1, 2, 0), np.asarray(
        img.resize((16, 10), Image.Resampling.BILINEAR), dtype=np.float32))
    assert images.letterbox_placement(30, 20, prep) == (16, 10, 0, 0)
    centred = ImagePrep(resize="letterbox", height=16, width=16)
    assert images.letterbox_placement(30, 20, centred) == (16, 11, 0, 2)
    steps = ImageSteps("x", "float32", (1, 3, 16, 16), prep)
    assert steps.geometry(img) == (16 / 30, 10 / 20, 0.0, 0.0, 30, 20)
    with pytest.raises(ConfigError, match="letterbox_align='middle'"):
        ImagePrep(resize="letterbox", height=16, width=16, letterbox_align="middle")


def test_width_rounding_floor_truncates_as_int_does():
    img = _colour(10, 3)  # 10 * 2 / 3 = 6.67
    prep = dict(resize="height", height=2)
    assert images.to_array(img, ImagePrep(**prep)).shape == (3, 2, 7)
    assert images.to_array(img, ImagePrep(**prep, width_rounding="floor")).shape == (3, 2, 6)


def test_width_rounding_ceil_goes_up_as_paddleocr_does():
    """PaddleOCR's recognizers resize a line to ceil(48 * w / h): 10 * 2 / 3 = 6.67 is 7 (as
    round), 9 * 2 / 4 = 4.5 is 5 where round takes the even 4, and a whole width stays."""
    prep = dict(resize="height", height=2, width_rounding="ceil")
    assert images.to_array(_colour(10, 3), ImagePrep(**prep)).shape == (3, 2, 7)
    assert images.to_array(_colour(9, 4), ImagePrep(**prep)).shape == (3, 2, 5)
    assert images.to_array(_colour(9, 4), ImagePrep(resize="height", height=2)).shape == (3, 2, 4)
    assert images.to_array(_colour(12, 3), ImagePrep(**prep)).shape == (3, 2, 8)
    with pytest.raises(ConfigError, match="width_rounding='up'"):
        ImagePrep(width_rounding="up")


def test_a_minimum_width_pads_every_batch_to_it_then_to_the_multiple():
    """PaddleOCR pads every line to at least 320 columns, a narrow one alone too: what a CTC
    model reads past a line's end changes what it decodes."""
    prep = ImagePrep(color="grey", min_width=8, pad_width_multiple=3)
    narrow = images.to_array(Image.new("L", (3, 2), 255), prep)
    assert images.collate([narrow], prep).shape == (1, 1, 2, 9)  # at least 8, then a multiple
    wide = images.to_array(Image.new("L", (10, 2), 255), prep)
    assert images.collate([narrow, wide], prep).shape == (2, 1, 2, 12)  # wider: as before
    with pytest.raises(ConfigError, match="min_width=-1"):
        ImagePrep(min_width=-1)


def test_convert_after_resize_greys_the_resized_colour_image():
    img = _colour(37, 11, seed=3)
    after = images.to_array(img, ImagePrep(color="grey", resize="height", height=7, scale=1.0,
                                           interpolation="lanczos", convert="after_resize"))
    want = np.asarray(img.resize((24, 7), Image.Resampling.LANCZOS).convert("L"), dtype=np.float32)
    np.testing.assert_array_equal(after[0], want)
    before = images.to_array(img, ImagePrep(color="grey", resize="height", height=7, scale=1.0,
                                            interpolation="lanczos"))
    assert not np.array_equal(after, before)  # the order changes the pixels


def test_width_cap_squeezes_or_crops():
    img = Image.fromarray(np.tile(np.arange(20, dtype=np.uint8) * 10, (4, 1)))  # 20 wide, 4 high
    crop = images.to_array(img, ImagePrep(color="grey", max_width=8, over_width="crop", scale=1.0))
    np.testing.assert_array_equal(crop[0, 0], np.arange(8) * 10.0)
    squeeze = images.to_array(img, ImagePrep(color="grey", max_width=8, scale=1.0,
                                             interpolation="nearest"))
    assert squeeze.shape == (1, 4, 8) and squeeze[0, 0, -1] > crop[0, 0, -1]  # the whole line
    narrow = images.to_array(img, ImagePrep(color="grey", max_width=30))
    assert narrow.shape == (1, 4, 20)  # under the cap: untouched
    with pytest.raises(ConfigError, match="max_width=-1"):
        ImagePrep(max_width=-1)


def test_constant_padding_in_normalized_units_is_zero_after_normalization():
    """What a recognizer trained on zero padding after normalization needs. Before these knobs
    the only padding was edge values, and a constant could not be said at all."""
    prep = ImagePrep(color="grey", mean=[0.5], std=[0.5], pad="constant", pad_value=0.0,
                     pad_units="normalized", pad_width_multiple=4)
    white = images.to_array(Image.new("L", (3, 2), 255), prep)        # normalized: 1.0
    batch = images.collate([white, images.to_array(Image.new("L", (5, 2), 255), prep)], prep)
    assert batch.shape == (2, 1, 2, 8)
    np.testing.assert_array_equal(batch[0, 0, :, :3], 1.0)
    np.testing.assert_array_equal(batch[0, 0, :, 3:], 0.0)              # zeros, not edge ones
    np.testing.assert_array_equal(batch[1, 0, :, 5:], 0.0)


def test_constant_padding_in_pixel_units_is_normalized_like_the_image():
    prep = ImagePrep(pad="constant", pad_value=255.0, mean=[0.5, 0.25, 0.0], std=[0.5, 0.25, 1.0],
                     layout="nhwc")
    a = images.to_array(Image.new("RGB", (2, 1), (0, 0, 0)), prep)
    padded = images.pad(a, (1, 4, 3), prep)
    np.testing.assert_allclose(padded[0, 2:], [[1.0, 3.0, 1.0]] * 2)   # (1 - mean) / std
    np.testing.assert_allclose(padded[0, :2], a[0])
    edge = images.pad(a, (1, 4, 3), ImagePrep(layout="nhwc", mean=prep.mean, std=prep.std))
    np.testing.assert_allclose(edge[0, 2:], a[0, -1:].repeat(2, axis=0))
    with pytest.raises(ConfigError, match="pad_units='units'"):
        ImagePrep(pad="constant", pad_units="units")


def test_bucket_axis_is_the_dynamic_axis_that_varies():
    inp = (InputSpec("x", "float32", ("batch", 1, "height", "width")),)
    samples = [{"x": np.zeros((1, 48, w), np.float32)} for w in (30, 50, 70, 50)]
    assert bucket_axis(inp, samples) == ("x", 3)   # the first dynamic axis (height) never varies
    assert bucket_axis(inp, samples, "2") == ("x", 2)
    assert bucket_axis(inp, samples, "x:3") == ("x", 3)
    assert bucket_axis(inp, samples, "height") == ("x", 2)
    with pytest.raises(ValueError, match="x:2 \\(height\\), x:3 \\(width\\)"):
        bucket_axis(inp, samples, "1")
    fixed = (InputSpec("x", "float32", ("batch", 1, 4, 4)),)
    assert bucket_axis(fixed, [{"x": np.zeros((1, 4, 4))}]) == ("x", 0)


@pytest.fixture(scope="module")
def two_axes(tmp_path_factory):
    """An ONNX model whose input has two dynamic axes ([batch, 1, h, w], both unnamed) and text
    lines of one height and many widths."""
    import onnx
    from onnx import TensorProto, helper

    root = tmp_path_factory.mktemp("two_axes")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 1, "h", "w"])
    graph = helper.make_graph([helper.make_node("ReduceMean", ["x"], ["m"], axes=[2, 3],
                                                keepdims=0)], "g", [x],
                              [helper.make_tensor_value_info("m", TensorProto.FLOAT, ["n", 1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.save(model, str(root / "m.onnx"))
    lines = root / "lines"
    lines.mkdir()
    rows = []
    for k in range(12):
        Image.new("L", (8 + 4 * k, 6), 255).save(lines / f"{k}.png")
        rows.append({"file": f"{k}.png", "label": k % 2})
    (root / "labels.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def _task(root, *extra):
    from pipeline.engine.compose import compose
    from pipeline.models import task
    from pipeline.models.sources import task_key

    cfg = compose(["model=onnx", f"model.path={root / 'm.onnx'}", "data=labels_file",
                   f"data.path={root / 'lines'}", f"data.labels={root / 'labels.jsonl'}",
                   "data.image.color=grey", "data.calibration_samples=4",
                   "data.evaluation_samples=8", "metric=agreement", *extra])
    return task(task_key(cfg.model, cfg.data, cfg.metric, str(root / "cal")))


def test_a_model_with_two_dynamic_axes_buckets_by_the_one_that_varies(two_axes):
    """Before: the first dynamic axis (the height, always 6), so every bucket had one size."""
    from pipeline.data import real_batches

    t = _task(two_axes)
    assert t.size_axis == ("x", 3)
    ds = t.dataset(t.split("evaluation", 8, str(two_axes / "cal")))
    feeds, _ = real_batches.bucketed(t, ds, 2, 4, 1, np.random.default_rng(0))
    widths = [f["x"].shape[3] for f in feeds]
    assert len(set(widths)) == 4 and widths == sorted(widths)
    assert {f["x"].shape[2] for f in feeds} == {6}
    assert _task(two_axes, "data.bucket_axis=2").size_axis == ("x", 2)


def test_a_bucket_axis_that_is_not_dynamic_is_one_line(two_axes):
    with pytest.raises(ConfigError, match="data.bucket_axis=x:1: not a dynamic axis"):
        _task(two_axes, "data.bucket_axis=x:1")


def test_an_onnx_axis_named_after_a_meaning_keeps_it():
    from onnx import TensorProto, helper

    from pipeline.models.onnx_file import _shape

    vi = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 64, "image_width"])
    assert _shape(vi) == (1, 1, 64, "width")
    vi = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", "seqlen", "height"])
    assert _shape(vi) == ("batch", "dynamic", "height")


def test_open_checked_refuses_by_the_header_before_decoding_and_decodes_the_rest(tmp_path):
    """The function a server shares with the data loader: bytes or a path, one limit."""
    import io

    from PIL import Image

    from pipeline.data.images import MAX_PIXELS, ImageTooLarge, open_checked
    from tests.test_messages import png_header

    buf = io.BytesIO()
    Image.new("RGB", (20, 10), (1, 2, 3)).save(buf, "PNG")
    img = open_checked(buf.getvalue())
    assert img.size == (20, 10) and img.getpixel((0, 0)) == (1, 2, 3)
    with pytest.raises(ImageTooLarge, match=r"^an image: its header claims 20x10 = 200 pixels, "
                                            "more than 199 "):
        open_checked(buf.getvalue(), max_pixels=199)
    # headers only: a decode would fail, so the refusal comes from the size alone
    for w, h in ((40000, 40000), (7000, 7000)):
        (tmp_path / "big.png").write_bytes(png_header(w, h))
        with pytest.raises(ImageTooLarge, match=f"big.png: its header claims .*{w * h:,} pixels"):
            open_checked(tmp_path / "big.png")
        assert w * h > MAX_PIXELS
    (tmp_path / "small.png").write_bytes(png_header(100, 100))
    with pytest.raises(StageError, match="small.png: cannot be read as an image"):
        open_checked(str(tmp_path / "small.png"))
