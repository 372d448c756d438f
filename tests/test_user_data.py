"""A user's data read from files through `datasets`: formats, content digest, disjoint splits,
image preprocessing, and one clear error for each bad input."""
import json

import numpy as np
import pytest
from PIL import Image

from pipeline.data import images
from pipeline.data.load import load, splits
from pipeline.config.data import DataConfig, ImagePrep
from pipeline.core.errors import ConfigError, StageError


def _image(path, w, h, value):
    path.parent.mkdir(parents=True, exist_ok=True)
    a = np.full((h, w, 3), value, dtype=np.uint8)
    a[:, : w // 2, 0] = 255 - value  # some structure, so channel order and resize are visible
    Image.fromarray(a).save(path)


@pytest.fixture()
def folder(tmp_path):
    root = tmp_path / "shapes"
    for label in ("circle", "square"):
        for i in range(6):
            _image(root / label / f"{i}.png", 20 + i, 10, 40 * i)
    return root


def test_imagefolder_reads_labels_from_subfolders_and_splits_are_disjoint(folder):
    data = load(DataConfig(path=str(folder), calibration_samples=4, evaluation_samples=6))
    assert len(data.dataset) == 12 and data.has_labels
    assert not set(data.calibration) & set(data.evaluation)
    assert len(data.calibration) == 4 and len(data.evaluation) == 6
    names = data.dataset.features["label"].names
    assert sorted(names) == ["circle", "square"]


def test_a_flat_folder_is_a_label_free_set(tmp_path):
    for i in range(5):
        _image(tmp_path / "flat" / f"{i}.png", 16, 8, 10 * i)
    data = load(DataConfig(path=str(tmp_path / "flat"), calibration_samples=2,
                           evaluation_samples=3))
    assert not data.has_labels and len(data.dataset) == 5


def test_editing_one_file_in_place_changes_the_digest(folder):
    cfg = DataConfig(path=str(folder), calibration_samples=2, evaluation_samples=2)
    before = load(cfg).digest
    assert load(cfg).digest == before  # reading twice changes nothing
    _image(folder / "circle" / "3.png", 23, 10, 7)  # same name, same size, other pixels
    assert load(cfg).digest != before


def test_labels_file_csv_and_jsonl_and_a_file_outside_the_folder_is_refused(tmp_path, folder):
    files = sorted(p.relative_to(folder) for p in folder.rglob("*.png"))
    csv = tmp_path / "labels.csv"
    csv.write_text("file,label\n" + "".join(f"{f},{f.parent}\n" for f in files))
    data = load(DataConfig(format="labels_file", path=str(folder), labels=str(csv),
                           calibration_samples=2, evaluation_samples=2))
    assert sorted(set(data.dataset["label"])) == ["circle", "square"]
    jsonl = tmp_path / "labels.jsonl"
    jsonl.write_text("".join(json.dumps({"file": str(f), "label": 1}) + "\n" for f in files))
    assert len(load(DataConfig(format="labels_file", path=str(folder), labels=str(jsonl),
                               calibration_samples=2, evaluation_samples=2)).dataset) == 12
    jsonl.write_text(json.dumps({"file": "../labels.csv", "label": 0}) + "\n")
    with pytest.raises(ConfigError, match="outside data.path"):
        load(DataConfig(format="labels_file", path=str(folder), labels=str(jsonl),
                        calibration_samples=1, evaluation_samples=1))


def test_tabular_and_saved_formats(tmp_path):
    from datasets import Dataset

    rows = [{"text": f"sentence {i}", "label": i % 2} for i in range(10)]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "d.csv").write_text("text,label\n" + "".join(f"{r['text']},{r['label']}\n"
                                                             for r in rows))
    Dataset.from_list(rows).to_parquet(str(tmp_path / "d.parquet"))
    Dataset.from_list(rows).save_to_disk(str(tmp_path / "saved"))
    for fmt, path in (("jsonl", "d.jsonl"), ("csv", "d.csv"), ("parquet", "d.parquet"),
                      ("saved", "saved")):
        data = load(DataConfig(format=fmt, path=str(tmp_path / path), input_column="text",
                               calibration_samples=3, evaluation_samples=5))
        assert data.dataset["text"] == [r["text"] for r in rows], fmt
        assert data.has_labels


def test_bad_inputs_end_with_one_line_naming_them(tmp_path, folder):
    with pytest.raises(ConfigError, match="no such file or folder"):
        load(DataConfig(path=str(tmp_path / "missing")))
    (tmp_path / "empty").mkdir()
    with pytest.raises(StageError, match="no samples found"):
        load(DataConfig(path=str(tmp_path / "empty")))
    with pytest.raises(StageError, match="fewer than calibration_samples=10 \\+ "
                                         "evaluation_samples=10"):
        load(DataConfig(path=str(folder), calibration_samples=10, evaluation_samples=10))
    (tmp_path / "t.jsonl").write_text('{"text": "a", "label": 0}\n')
    with pytest.raises(ConfigError, match="data.input_column=pixels: not a column .*text, label"):
        load(DataConfig(format="jsonl", path=str(tmp_path / "t.jsonl"), input_column="pixels",
                        calibration_samples=1, evaluation_samples=1))
    (tmp_path / "bad.parquet").write_bytes(b"not parquet")
    with pytest.raises(StageError, match="cannot be read as parquet"):
        load(DataConfig(format="parquet", path=str(tmp_path / "bad.parquet")))
    with pytest.raises(ConfigError, match="data.path is empty"):
        DataConfig()
    with pytest.raises(ConfigError, match="data.image.mean"):
        ImagePrep(color="grey", mean=[0.5, 0.5, 0.5])
    with pytest.raises(ConfigError, match="valid choices are nchw, nhwc"):
        ImagePrep(layout="chw")


def test_splits_are_seeded_and_disjoint():
    a = splits(100, 30, 50, seed=1)
    assert a == splits(100, 30, 50, seed=1) and a != splits(100, 30, 50, seed=2)
    assert not set(a[0]) & set(a[1])


def test_height_resize_keeps_aspect_and_batches_pad_to_a_multiple():
    from PIL import Image as Img

    prep = ImagePrep(color="grey", resize="height", height=32, pad_width_multiple=16)
    wide = images.to_array(Img.new("RGB", (100, 20), (255, 255, 255)), prep)
    narrow = images.to_array(Img.new("RGB", (30, 20), (0, 0, 0)), prep)
    assert wide.shape == (1, 32, 160) and narrow.shape == (1, 32, 48)
    assert wide.max() == pytest.approx(1.0) and narrow.max() == 0.0
    batch = images.collate([wide, narrow], prep)
    assert batch.shape == (2, 1, 32, 160) and batch.dtype == np.float32
    assert images.width(wide, prep) == 160


def test_fixed_size_normalization_channel_order_and_layout():
    from PIL import Image as Img

    img = Img.new("RGB", (8, 4), (255, 0, 0))
    rgb = images.to_array(img, ImagePrep(resize="fixed", height=6, width=5, mean=[0.5] * 3,
                                         std=[0.5] * 3))
    assert rgb.shape == (3, 6, 5)
    assert rgb[0].mean() == pytest.approx(1.0) and rgb[2].mean() == pytest.approx(-1.0)
    bgr = images.to_array(img, ImagePrep(channel_order="bgr", layout="nhwc"))
    assert bgr.shape == (4, 8, 3) and bgr[..., 2].mean() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="different heights"):
        images.collate([rgb, rgb[:, :3]], ImagePrep())


def _labels_jsonl(tmp_path, folder, line7: str):
    files = sorted(p.relative_to(folder) for p in folder.rglob("*.png"))
    lines = [json.dumps({"file": str(f), "label": f.parent.name}) for f in files]
    lines[6] = line7
    labels = tmp_path / "labels.jsonl"
    labels.write_text("\n".join(lines) + "\n")
    return DataConfig(format="labels_file", path=str(folder), labels=str(labels),
                      calibration_samples=2, evaluation_samples=2)


def test_a_malformed_line_of_a_labels_jsonl_is_named_by_the_labels_file_and_its_line(tmp_path,
                                                                                      folder):
    cfg = _labels_jsonl(tmp_path, folder, '{"file": "circle/0.png", "label": ')
    with pytest.raises(StageError) as e:
        load(cfg)
    assert str(e.value) == (f"data.labels={cfg.labels}: line 7: not valid JSON (Expecting value "
                            "at column 35)")


def test_a_json_list_row_is_one_line_naming_the_file_and_line(tmp_path, folder):
    cfg = _labels_jsonl(tmp_path, folder, "[1, 2]")
    with pytest.raises(StageError, match=f"^data.labels={cfg.labels}: line 7: a JSON list where "
                                         "each line must be an object"):
        load(cfg)
    rows = [json.dumps({"x": [1.0, 2.0], "label": 0})] * 9
    rows[6] = "[1, 2]"
    table = tmp_path / "t.jsonl"
    table.write_text("\n".join(rows) + "\n")
    with pytest.raises(StageError, match=f"^data.path={table}: line 7: a JSON list where"):
        load(DataConfig(format="jsonl", path=str(table), input_column="x",
                        calibration_samples=2, evaluation_samples=2))
    rows[6] = '{"x": [1.0'
    table.write_text("\n".join(rows) + "\n")
    with pytest.raises(StageError, match=f"^data.path={table}: line 7: not valid JSON"):
        load(DataConfig(format="jsonl", path=str(table), input_column="x",
                        calibration_samples=2, evaluation_samples=2))


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_a_text_file_with_invalid_utf8_is_named_by_its_line_whichever_rows_are_drawn(tmp_path,
                                                                                    fmt):
    """datasets reads the bad bytes unchecked and fails only on the row that holds them: the
    file is refused before it is read, even where that row would not be drawn."""
    rows = [f"sentence {i}".encode() for i in range(10)]
    rows[7] = b"bad \xff\xfe bytes"
    path = tmp_path / f"t.{fmt}"
    if fmt == "jsonl":
        path.write_bytes(b"".join(b'{"text": "' + r + b'"}\n' for r in rows))
    else:
        path.write_bytes(b"text\n" + b"".join(r + b"\n" for r in rows))
    line, byte = (8, 15) if fmt == "jsonl" else (9, 5)
    with pytest.raises(StageError, match=f"^data.path={path}: line {line}: not UTF-8 text "
                                         rf"\(byte {byte} of the line\)"):
        load(DataConfig(format=fmt, path=str(path), input_column="text",
                        calibration_samples=1, evaluation_samples=2, seed=0))


def test_an_empty_text_file_has_no_samples(tmp_path):
    for name, text in (("e.jsonl", ""), ("b.jsonl", "\n \n"), ("e.csv", "")):
        path = tmp_path / name
        path.write_text(text)
        fmt = name.rpartition(".")[2]
        with pytest.raises(StageError, match=f"^data.path={path}: no samples found \\(an empty "
                                             f"{fmt} file\\)$"):
            load(DataConfig(format=fmt, path=str(path), input_column="text",
                            calibration_samples=1, evaluation_samples=1))
