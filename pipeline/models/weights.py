"""Weights come from safetensors only: a pickle is never loaded, whatever the way in.

In: a checkpoint file a config key names (``model.checkpoint`` of a built-in network or a torch
factory), or a Hugging Face folder (``model=hf``). Out: the safetensors files to read (for a
folder: ``model.safetensors``, or the shards its ``model.safetensors.index.json`` names, or the
file its ``config.json`` names in ``transformers_weights``, each inside the folder). Anything else
is one line, exit 2, before any stage, saying how to convert it: a pickle (``torch.save``'s
``.pt``/``.bin`` files, Lightning's ``.ckpt``) runs whatever code it names when it is unpickled,
and even torch's restricted ``weights_only`` unpickler is code reading untrusted bytes.
Nothing here reads a pickle to say so: the file's name and its first bytes are enough.
"""
from __future__ import annotations

import json
from pathlib import Path

from pipeline.core import userfiles
from pipeline.core.errors import ConfigError

# Names that hold pickles (torch.save, Lightning, joblib) or weights transformers would read
# through another framework's loader; none of them is ever read.
PICKLED = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle", ".joblib", ".tar", ".h5",
           ".msgpack")
SAFETENSORS = "model.safetensors"
INDEX = "model.safetensors.index.json"
CONVERT_FILE = ("convert it once, where you trust the file: from safetensors.torch import "
                "save_file; save_file(torch.load(PATH, weights_only=True), 'model.safetensors')")
CONVERT_FOLDER = ("convert it once, where you trust the files: "
                  "AutoModel.from_pretrained(PATH).save_pretrained(PATH) writes model.safetensors "
                  "(transformers 4: add safe_serialization=True)")
WHY = "weights are read from safetensors only: unpickling runs code"


def _kind(path: Path) -> str:
    """'safetensors', 'pickle' (a pickle's protocol byte or torch.save's zip) or 'other'."""
    try:
        with open(path, "rb") as f:
            head = f.read(9)
        size = path.stat().st_size
    except OSError:
        return "other"
    n = int.from_bytes(head[:8], "little") if len(head) == 9 else 0
    if head[8:9] == b"{" and 0 < n <= size - 8:  # a JSON header of n bytes, then the tensors
        return "safetensors"
    if head[:1] == b"\x80" or head[:4] == b"PK\x03\x04":
        return "pickle"
    return "pickle" if path.suffix.lower() in PICKLED else "other"


def damage(path: Path) -> str | None:
    """What is wrong with a file that should be safetensors, from its header alone (None: a
    whole file): its 8-byte length, the JSON header that length spans, and where the tensors
    that header lists end, which must be the end of the file."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            head = f.read(min(n, max(size - 8, 0))) if size >= 8 else b""
    except OSError as e:
        return f"cannot be read ({e.strerror or e})"
    if size < 8:
        return f"{size} bytes, shorter than a safetensors header"
    if not 0 < n <= size - 8 or head[:1] != b"{":
        return (f"its first 8 bytes give a {n}-byte header, the file holds {size - 8} bytes "
                "after them")
    try:
        header = json.loads(head)
        ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        return "its header is not a safetensors header (JSON naming each tensor's offsets)"
    data = size - 8 - n
    if max(ends, default=0) != data:
        return (f"its header places tensors up to byte {max(ends, default=0)} of the data, the "
                f"file holds {data}: truncated or overwritten")
    return None


def _refusal(path: Path, convert: str, by_name: bool) -> str | None:
    """Why ``path`` is not read as weights, to follow "is" (None: it is whole safetensors). A
    pickle is told how to convert; a damaged safetensors file (its header says safetensors, or
    its name does) what is damaged: it is no pickle and converting would not help. ``by_name``:
    the file must also be named ``*.safetensors`` (a folder's, as transformers reads them)."""
    kind = _kind(path)
    if kind == "pickle":
        return f"a pickle; {WHY}; {convert}"
    named = path.name.endswith(".safetensors")
    if kind == "safetensors" or named:
        problem = damage(path)
        if problem:
            return f"a damaged safetensors file ({problem}); save or copy it again"
        if named or not by_name:
            return None
    return f"not a safetensors file; {WHY}; {convert}"


def checkpoint(path: str | Path, key: str) -> None:
    """A checkpoint file: refused unless it is whole safetensors (one line: how to convert a
    pickle, what is damaged in a safetensors file)."""
    path = Path(path)
    why = _refusal(path, CONVERT_FILE.replace("PATH", repr(str(path))), by_name=False)
    if why:
        raise ConfigError(f"{key}={path}: {why}")


def folder_weights(folder: Path, key: str) -> list[Path]:
    """The safetensors files ``from_pretrained`` reads from a Hugging Face folder, as it chooses
    them; refused when there are none (naming the pickled ones present) or when a name leads
    out of the folder or to anything but safetensors."""
    folder = Path(folder).resolve()
    explicit = _config(folder).get("transformers_weights")
    if isinstance(explicit, str):  # config.json may name the weights file itself
        chosen = userfiles.inside(folder, explicit, key, "config.json (transformers_weights)")
    elif (folder / SAFETENSORS).is_file():
        chosen = folder / SAFETENSORS
    elif (folder / INDEX).is_file():
        chosen = folder / INDEX
    else:
        pickled = sorted(p.name for p in folder.iterdir()
                         if p.is_file() and p.suffix.lower() in PICKLED and "index" not in p.name)
        if pickled:
            raise ConfigError(f"{key}: weights only as {', '.join(pickled[:3])} (pickled), no "
                              f"{SAFETENSORS}; {WHY}; "
                              + CONVERT_FOLDER.replace("PATH", repr(str(folder))))
        raise ConfigError(f"{key}: no weights ({SAFETENSORS} or {INDEX}); save them with "
                          "save_pretrained into the same folder")
    if chosen.name.endswith(".index.json"):
        shards = _shards(chosen, folder, key)
    else:
        shards = [chosen]
    for f in shards:
        why = _refusal(f, CONVERT_FOLDER.replace("PATH", repr(str(folder))), by_name=True)
        if why:
            raise ConfigError(f"{key}: {f.relative_to(folder)} is {why}")
    return shards


def _shards(index: Path, folder: Path, key: str) -> list[Path]:
    try:
        names = json.loads(index.read_text())["weight_map"].values()
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ConfigError(f"{key}: {index.name} is not a checkpoint index ({type(e).__name__}: "
                          f"{e})") from None
    out = []
    for name in sorted(set(map(str, names))):
        f = userfiles.inside(folder, name, key, index.name)
        if not f.is_file():
            raise ConfigError(f"{key}: {index.name} names {name!r}, which is missing")
        out.append(f)
    return out


def _config(folder: Path) -> dict:
    try:
        cfg = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return {}  # a missing or broken config.json is reported where it is read
    return cfg if isinstance(cfg, dict) else {}
