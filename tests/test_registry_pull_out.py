"""``pull --out DIR`` never deletes what it did not write: a user's folder is refused (or, with
``--force``, moved aside), the registry's own folder is refused always, and an earlier pull of the
same model is replaced."""
from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.core.errors import ConfigError
from pipeline.registry.local import LocalStore
from tests.registry_support import make_model, registry_cli
from tests.test_registry_local import one_line_error, pub


@pytest.fixture
def store(tmp_path) -> LocalStore:
    root = tmp_path / "store"
    pub(root, make_model(tmp_path / "a.onnx", seed=1))
    pub(root, make_model(tmp_path / "b.onnx", seed=2))
    return LocalStore(root)


def versions(store: LocalStore) -> list[str]:
    return [e.version for e in store.versions("ocr")]


def users_folder(tmp_path: Path) -> Path:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.tex").write_text("years of work")
    return out


def test_cli_refuses_a_users_folder_in_one_line_and_keeps_it(tmp_path, store):
    out = users_folder(tmp_path)
    proc = registry_cli("pull", f"ocr:{versions(store)[0]}", "--out", out,
                        f"registry.root={store.root}")
    one_line_error(proc, 2, str(out), "not empty", "--force")
    assert sorted(p.name for p in out.iterdir()) == ["thesis.tex"]
    assert (out / "thesis.tex").read_text() == "years of work"


def test_force_moves_the_folder_aside_never_deletes(tmp_path, store, capsys):
    out = users_folder(tmp_path)
    store.pull("ocr", versions(store)[0], out, force=True)
    assert (out / "model.onnx").is_file()
    kept = [p for p in tmp_path.iterdir() if p.name.startswith("mine.replaced-")]
    assert len(kept) == 1 and (kept[0] / "thesis.tex").read_text() == "years of work"
    assert str(kept[0]) in capsys.readouterr().out


def test_the_registry_itself_is_never_a_destination(tmp_path, store):
    before = sorted(p.relative_to(tmp_path) for p in store.root.rglob("*"))
    for out in (tmp_path, store.root, store.root / "blobs"):  # contains it, is it, lies inside
        for force in (False, True):
            with pytest.raises(ConfigError, match="registry's own folder"):
                store.pull("ocr", versions(store)[0], out, force=force)
    assert sorted(p.relative_to(tmp_path) for p in store.root.rglob("*")) == before
    assert store.verify() == (2, [])


def test_an_earlier_pull_of_the_same_model_is_replaced(tmp_path, store):
    first, second = versions(store)
    out = tmp_path / "pulled"
    store.pull("ocr", first, out)
    store.pull("ocr", second, out)
    assert second in (out / "oci-manifest.json").read_text()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(("pulled", ".old"))] == \
        ["pulled"]
    # an earlier pull the user changed is theirs now: refused like any other folder
    (out / "model.onnx").write_bytes(b"edited")
    with pytest.raises(ConfigError, match="model.onnx was changed"):
        store.pull("ocr", first, out)
    assert (out / "model.onnx").read_bytes() == b"edited"
    (out / "model.onnx").unlink()
    with pytest.raises(ConfigError, match="model.onnx was changed or removed"):
        store.pull("ocr", first, out)
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="files a pull did not write"):
        store.pull("ocr", first, out)


def test_a_dangling_link_as_destination_is_one_line_and_nothing_is_pulled(tmp_path, store):
    """Renaming the pulled folder onto the link failed with a bare ENOTDIR (exit 3)."""
    out = tmp_path / "link"
    out.symlink_to(tmp_path / "nowhere")
    proc = registry_cli("pull", f"ocr:{versions(store)[0]}", "--out", out,
                        f"registry.root={store.root}")
    one_line_error(proc, 2, f"pull --out {out}: a symbolic link to {tmp_path / 'nowhere'}, "
                   "which does not exist; nothing was pulled")
    assert out.is_symlink() and not (tmp_path / "nowhere").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-pull")]


def test_pulling_a_name_the_registry_never_held_says_so(tmp_path, store):
    """It said "no version has been promoted to production", as if the model existed."""
    from pipeline.core.errors import RegistryError

    for ref in ("production", "int8-1", None):
        with pytest.raises(RegistryError) as e:
            store.pull("nosuch", ref, tmp_path / "o")
        assert str(e.value) == f"nosuch: no model of that name in {store.root}; models: ocr"
    assert not (tmp_path / "o").exists()
    empty = LocalStore(tmp_path / "empty")
    with pytest.raises(RegistryError, match="models: none \\(nothing published yet\\)"):
        empty.pull("ocr", "production", tmp_path / "o")
