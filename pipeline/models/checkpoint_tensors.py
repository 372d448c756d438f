"""A safetensors checkpoint read one tensor at a time, for a decoder larger than memory.

In: a Hugging Face folder (``*.safetensors``, one file or the shards its index names). Out: each
tensor by its name, on request, as a NumPy array: FP32 for bf16/fp16/fp32 (bf16 widened by a bit
shift, exact), other dtypes as stored. Nothing else is held: the headers (names, dtypes, shapes,
byte ranges) are parsed once, and each tensor is read with a seek and one read.

Why not ``safetensors.safe_open``: it memory-maps the file, and every page a read touches stays
in the process's resident set while the mapping is open (a 13.5 GB checkpoint read through one
open handle ends with all of it counted); a plain read leaves only the copy the caller keeps.
The values are the ones ``safe_open`` returns (a test compares them, dtype by dtype).
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

NUMPY = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2",
         "I8": "i1", "U8": "u1", "BOOL": "?"}


@dataclass(frozen=True)
class Entry:
    file: Path
    dtype: str           # the safetensors dtype name (BF16, F16, ...)
    shape: tuple
    start: int           # absolute byte offsets in ``file``
    end: int


def header(path: Path) -> tuple[dict, int]:
    """A safetensors file's header and where its data starts."""
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        return json.loads(fh.read(n)), 8 + n


class CheckpointTensors:
    """The tensors of every ``*.safetensors`` file in ``folder``, by name."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.entries: dict[str, Entry] = {}
        for f in sorted(self.folder.glob("*.safetensors")):
            head, base = header(f)
            for name, t in head.items():
                if name != "__metadata__":
                    begin, end = t["data_offsets"]
                    self.entries[name] = Entry(f, t["dtype"], tuple(t["shape"]),
                                               base + begin, base + end)

    def __contains__(self, name: str) -> bool:
        return name in self.entries

    def read(self, name: str):
        """``name``'s values (float dtypes widened to FP32)."""
        import numpy as np

        e = self.entries[name]
        with open(e.file, "rb") as fh:
            fh.seek(e.start)
            raw = fh.read(e.end - e.start)
        if len(raw) != e.end - e.start:
            raise OSError(f"{e.file.name} ends inside tensor {name}")
        if e.dtype == "BF16":  # bf16 is FP32's upper half: shifting it back is exact
            a = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)
        elif e.dtype in NUMPY:
            a = np.frombuffer(raw, NUMPY[e.dtype])
            a = a.astype(np.float32) if e.dtype == "F16" else a.copy()
        else:
            raise ValueError(f"tensor {name}: dtype {e.dtype} is not read by the streaming "
                             f"path (valid: BF16, {', '.join(NUMPY)})")
        return a.reshape(e.shape)
