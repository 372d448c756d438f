"""No pickle is ever loaded, and no file outside the folder the user named is ever read.

Hostile folders built here: a Hugging Face folder whose only weights are a pickle that would
create a marker file when unpickled, and a saved data set whose ``state.json`` names an Arrow file
outside its folder. Through the command line each ends with one line and exit 2 before any stage;
the marker is never created, and Linux's inotify (``tests.opens``) sees no open of the outside
file. In process: links, shard indexes, tokenizer files and ONNX external data that lead out of
the folder are refused; editing a file a model or data set names (an Arrow shard, external data)
changes the digest that keys every stage.
"""
from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import one_line, run_cli
from tests.opens import watch

FAST = ["registry=null", "gate.min_speedup=0", "bench.min_rounds=20", "bench.min_seconds=0",
        "bench.max_seconds=0.3"]


class Hostile:
    """Unpickling this creates ``marker``: what any pickle can do with any callable."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    from tests import hf_tiny

    root = tmp_path_factory.mktemp("hfsec")
    hf_tiny.bert(root / "embed")
    hf_tiny.text_data(root / "text.jsonl", 20)
    return root


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _hf_key(folder: Path, data: Path):
    from pipeline.config import ModelConfig
    from pipeline.config.data import DataConfig
    from pipeline.config.metrics import MetricConfig
    from pipeline.models.sources import task_key

    return task_key(ModelConfig(name="hf", path=str(folder)),
                    DataConfig(format="jsonl", path=str(data), input_column="text",
                               calibration_samples=4, evaluation_samples=8),
                    MetricConfig(name="agreement"), data_dir=str(folder.parent / "data"))


def test_a_folder_with_only_pickled_weights_is_refused_and_nothing_is_unpickled(bert, tmp_path):
    folder = _copy(bert / "embed", tmp_path / "pickled")
    (folder / "model.safetensors").unlink()
    marker = tmp_path / "unpickled"
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps(Hostile(marker), protocol=2))
    pickle.loads((folder / "pytorch_model.bin").read_bytes())  # the pickle really is hostile
    assert marker.exists()
    marker.unlink()
    proc = run_cli("model=hf", f"model.path={folder}", "data=jsonl",
                   f"data.path={bert / 'text.jsonl'}", "data.input_column=text",
                   "data.calibration_samples=4", "data.evaluation_samples=8", "metric=agreement",
                   f"workdir={tmp_path / 'work'}", f"data_dir={tmp_path / 'work' / 'data'}", *FAST)
    one_line(proc, 2, "pytorch_model.bin", "pickle", "save_pretrained")
    assert not marker.exists()  # nothing was unpickled
    assert not (tmp_path / "work" / "runs").exists()  # refused before any stage


def test_pickles_are_refused_by_name_and_by_content(bert, tmp_path):
    """A torch checkpoint that is a torch.save file, a folder whose index or config names a
    pickle: one line each, saying how to convert; nothing is read as a pickle."""
    import torch

    from pipeline.core.errors import ConfigError
    from pipeline.models import weights

    pt = tmp_path / "net.pt"
    torch.save({"w": torch.zeros(2)}, pt)
    with pytest.raises(ConfigError, match="a pickle.*save_file") as e:
        weights.checkpoint(pt, "model.checkpoint")
    assert "\n" not in str(e.value)
    renamed = tmp_path / "net.safetensors"  # the name does not make it safetensors
    shutil.copy(pt, renamed)
    with pytest.raises(ConfigError, match="a pickle"):
        weights.checkpoint(renamed, "model.checkpoint")
    # config.json may name the weights file: transformers would read adapter_model.bin as a pickle
    named = _copy(bert / "embed", tmp_path / "named")
    cfg = json.loads((named / "config.json").read_text())
    (named / "config.json").write_text(json.dumps({**cfg, "transformers_weights":
                                                   "adapter_model.bin"}))
    (named / "adapter_model.bin").write_bytes(pickle.dumps({"w": 1}, protocol=2))
    with pytest.raises(ConfigError, match="adapter_model.bin is a pickle"):
        _hf_key(named, bert / "text.jsonl")
    # a sharded index that names a .bin shard
    index = _copy(bert / "embed", tmp_path / "index")
    (index / "model.safetensors").rename(index / "model-00001-of-00001.safetensors")
    (index / "pytorch_model-00001.bin").write_bytes(pickle.dumps({"w": 1}, protocol=2))
    (index / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {"a": "model-00001-of-00001.safetensors",
                                        "b": "pytorch_model-00001.bin"}}))
    with pytest.raises(ConfigError, match="pytorch_model-00001.bin is a pickle"):
        _hf_key(index, bert / "text.jsonl")


def test_a_sharded_checkpoint_inside_the_folder_loads(bert, tmp_path):
    """The index's shards inside the folder: accepted, and the weights load (safetensors)."""
    from pipeline.models import task

    folder = _copy(bert / "embed", tmp_path / "sharded")
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        names = list(f.keys())
    (folder / "model.safetensors").rename(folder / "model-00001-of-00001.safetensors")
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {n: "model-00001-of-00001.safetensors" for n in names}}))
    t = task(_hf_key(folder, bert / "text.jsonl"))
    assert t.outputs[0].name == "sentence_embedding"


def _saved(root: Path, rows: int = 12, seed: int = 0) -> Path:
    from datasets import Dataset

    rng = np.random.default_rng(seed)
    Dataset.from_dict({"x": rng.standard_normal((rows, 4)).astype(np.float32).tolist(),
                       "label": [i % 3 for i in range(rows)]}).save_to_disk(str(root))
    return root


def _tiny_onnx(path: Path, external: str | None = None, constant: bool = False) -> Path:
    """y = x @ W, W [4, 3]; ``external``: W (or a Constant's value) stored in that file."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(4, 3), "W")
    nodes = [helper.make_node("MatMul", ["x", "W"], ["y"])]
    inits = [w]
    if constant:
        nodes.insert(0, helper.make_node("Constant", [], ["W"], value=w))
        inits = []
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, ["batch", 4])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, ["batch", 3])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    if external:
        tensor = nodes[0].attribute[0].t if constant else model.graph.initializer[0]
        onnx.external_data_helper.set_external_data(tensor, external)
        raw = tensor.raw_data
        target = (path.parent / external)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(raw)
        tensor.ClearField("raw_data")
        tensor.data_location = onnx.TensorProto.EXTERNAL
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model.SerializeToString())
    return path


def test_a_saved_data_set_naming_a_file_outside_its_folder_is_refused_unread(tmp_path):
    data = _saved(tmp_path / "user" / "data")
    shard = next(data.glob("*.arrow"))
    outside = tmp_path / "outside.arrow"
    shutil.move(shard, outside)
    state = json.loads((data / "state.json").read_text())
    state["_data_files"] = [{"filename": "../../outside.arrow"}]
    (data / "state.json").write_text(json.dumps(state))
    model = _tiny_onnx(tmp_path / "user" / "m.onnx")
    with watch(outside) as w:
        outside.read_bytes()
        assert w.count() == 1  # the watch sees an open
        proc = run_cli("model=onnx", f"model.path={model}", "data=saved", f"data.path={data}",
                       "data.input_column=x", "data.calibration_samples=4",
                       "data.evaluation_samples=8", "metric=agreement",
                       f"workdir={tmp_path / 'work'}", f"data_dir={tmp_path / 'work' / 'data'}",
                       *FAST)
        opened = w.count() - 1
    one_line(proc, 2, "data.path=", "state.json", "../../outside.arrow", "outside")
    assert opened == 0, "the file outside the data set's folder was opened"
    assert not (tmp_path / "work" / "runs").exists()


def test_links_and_names_that_leave_the_folder_are_refused(bert, tmp_path):
    from pipeline.data.load import load
    from pipeline.config.data import DataConfig
    from pipeline.core.errors import ConfigError

    secret = tmp_path / "secret.txt"
    secret.write_text("not yours")
    # a saved data set: a link to a file outside, a DatasetDict split outside
    linked = _saved(tmp_path / "linked")
    (linked / "extra.arrow").symlink_to(secret)
    cfg = dict(format="saved", input_column="x", calibration_samples=2, evaluation_samples=2)
    with pytest.raises(ConfigError, match="extra.arrow is a symbolic link.*outside"):
        load(DataConfig(path=str(linked), **cfg))
    _saved(tmp_path / "elsewhere")
    split = tmp_path / "dict"
    split.mkdir()
    (split / "dataset_dict.json").write_text(json.dumps({"splits": ["../elsewhere"]}))
    with pytest.raises(ConfigError, match="dataset_dict.json names '../elsewhere'"):
        load(DataConfig(path=str(split), **cfg))
    # an image folder with a linked folder that leads out
    images = tmp_path / "images"
    (images / "cats").mkdir(parents=True)
    (images / "dogs").symlink_to(tmp_path, target_is_directory=True)
    with pytest.raises(ConfigError, match="dogs is a symbolic link"):
        load(DataConfig(path=str(images), calibration_samples=1, evaluation_samples=1))
    # a Hugging Face folder: a link out, a shard out, a tokenizer file out
    link = _copy(bert / "embed", tmp_path / "hf_link")
    (link / "vocab.txt").symlink_to(secret)
    with pytest.raises(ConfigError, match="vocab.txt is a symbolic link"):
        _hf_key(link, bert / "text.jsonl")
    shard = _copy(bert / "embed", tmp_path / "hf_shard")
    shutil.move(shard / "model.safetensors", tmp_path / "w.safetensors")
    (shard / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {"a": "../w.safetensors"}}))
    with pytest.raises(ConfigError, match="model.safetensors.index.json names '../w.safetensors'"):
        _hf_key(shard, bert / "text.jsonl")
    tok = _copy(bert / "embed", tmp_path / "hf_tok")
    cfg_tok = json.loads((tok / "tokenizer_config.json").read_text())
    (tok / "tokenizer_config.json").write_text(json.dumps(
        {**cfg_tok, "fast_tokenizer_files": [f"{tmp_path}/tokenizer.4.0.0.json"]}))
    with pytest.raises(ConfigError, match="tokenizer_config.json names"):
        _hf_key(tok, bert / "text.jsonl")
    # ONNX external data: a parent path, an absolute path, a link out, a Constant's value
    import onnx

    from pipeline.config import ModelConfig
    from pipeline.models.sources import task_key

    (tmp_path / "w.bin").write_bytes(b"\0" * 48)
    cases = {"up": "../w.bin", "absolute": str(tmp_path / "w.bin")}
    for name, loc in cases.items():
        m = _tiny_onnx(tmp_path / name / "m.onnx")
        proto = onnx.load(str(m))
        onnx.external_data_helper.set_external_data(proto.graph.initializer[0], loc)
        proto.graph.initializer[0].ClearField("raw_data")
        proto.graph.initializer[0].data_location = onnx.TensorProto.EXTERNAL
        m.write_bytes(proto.SerializeToString())
        with pytest.raises(ConfigError, match="tensor W's external data names"):
            task_key(ModelConfig(name="onnx", path=str(m)))
    linked_model = _tiny_onnx(tmp_path / "ext_link" / "m.onnx", external="w.bin")
    (tmp_path / "ext_link" / "w.bin").unlink()
    (tmp_path / "ext_link" / "w.bin").symlink_to(tmp_path / "w.bin")
    with pytest.raises(ConfigError, match="resolves to .*w.bin, outside"):
        task_key(ModelConfig(name="onnx", path=str(linked_model)))
    const = _tiny_onnx(tmp_path / "const" / "m.onnx", external="w.bin", constant=True)
    shutil.move(tmp_path / "const" / "w.bin", tmp_path / "const.bin")
    proto = onnx.load(str(const), load_external_data=False)
    onnx.external_data_helper.set_external_data(proto.graph.node[0].attribute[0].t,
                                                "../const.bin")
    const.write_bytes(proto.SerializeToString())
    with pytest.raises(ConfigError, match="model.path=.*const") as e:  # refused, never read
        task_key(ModelConfig(name="onnx", path=str(const)))
    assert "\n" not in str(e.value)


def test_editing_a_file_the_model_or_data_names_changes_the_digest(tmp_path):
    from pipeline.config import ModelConfig
    from pipeline.data.load import load
    from pipeline.config.data import DataConfig
    from pipeline.models.sources import task_key

    # an ONNX model's external data
    m = _tiny_onnx(tmp_path / "ext" / "m.onnx", external="weights/w.bin")
    before = task_key(ModelConfig(name="onnx", path=str(m))).sha256
    assert task_key(ModelConfig(name="onnx", path=str(m))).sha256 == before
    data = tmp_path / "ext" / "weights" / "w.bin"
    raw = bytearray(data.read_bytes())
    raw[0] ^= 0xFF
    data.write_bytes(bytes(raw))
    assert task_key(ModelConfig(name="onnx", path=str(m))).sha256 != before
    # a saved data set's Arrow shard, replaced in place by another set's
    cfg = DataConfig(format="saved", path=str(_saved(tmp_path / "a")), input_column="x",
                     calibration_samples=2, evaluation_samples=2)
    first = load(cfg).digest
    other = _saved(tmp_path / "b", seed=1)
    shard = next(Path(cfg.path).glob("*.arrow"))
    shutil.copy(next(other.glob("*.arrow")), shard)
    assert load(cfg).digest != first


def test_the_library_never_calls_torch_load_or_pickle():
    """No module of the pipeline loads a pickle itself (third-party loaders are called so that
    they cannot: safetensors only, use_safetensors=True)."""
    import ast

    from tests.conftest import ROOT

    banned = {("torch", "load"), ("pickle", "load"), ("pickle", "loads"), ("dill", "load"),
              ("joblib", "load"), ("cloudpickle", "load"), ("cloudpickle", "loads")}
    found = []
    for path in (ROOT / "pipeline").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and (node.value.id, node.attr) in banned):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []


def test_a_damaged_safetensors_file_is_told_what_is_damaged_not_about_pickles(tmp_path):
    """Truncated tensors, a garbled length, a header that is not JSON: each is named as damage
    (converting a pickle would not help); the whole file passes."""
    from safetensors.numpy import save_file

    from pipeline.core.errors import ConfigError
    from pipeline.models import weights

    whole = tmp_path / "whole.safetensors"
    save_file({"w": np.arange(64, dtype=np.float32)}, str(whole))
    weights.checkpoint(whole, "model.checkpoint")
    data = whole.read_bytes()
    n = int.from_bytes(data[:8], "little")
    cases = {"cut": (data[:-10], "places tensors up to byte 256 of the data, the file holds 246"),
             "length": ((10 ** 9).to_bytes(8, "little") + data[8:], "a 1000000000-byte header"),
             "json": (data[:8] + b"{" + b"x" * (n - 1) + data[8 + n:], "not a safetensors header"),
             "empty": (b"", "0 bytes, shorter than a safetensors header")}
    for name, (content, said) in cases.items():
        bad = tmp_path / f"{name}.safetensors"
        bad.write_bytes(content)
        with pytest.raises(ConfigError) as e:
            weights.checkpoint(bad, "model.checkpoint")
        assert f"{bad}: a damaged safetensors file (" in str(e.value) and said in str(e.value)
        assert "pickle" not in str(e.value)
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(data[:-10])
    with pytest.raises(ConfigError, match=r"model.safetensors is a damaged safetensors file "
                                          r"\(its header places tensors"):
        weights.folder_weights(folder, "model.path")
