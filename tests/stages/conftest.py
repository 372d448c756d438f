"""The decoder stages' shared inputs: the tiny Llama (``tests/llm_tiny.py``: random weights, a
BPE tokenizer trained in the test), its FP32 export by onnxruntime-genai's model builder, and an
evaluation text of ten sequences. Built once per worker: the export takes seconds."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest


@dataclass(frozen=True)
class TinyDecoder:
    decoder: object   # pipeline.models.decoder.Decoder of the Hugging Face folder
    fp32: object      # the FP32 export as the decoder_export artifact a later stage is handed
    text: object      # TextSet: the evaluation text, token ids in [2, 300)


@pytest.fixture(scope="session")
def tiny_decoder(tmp_path_factory) -> TinyDecoder:
    from llm_tiny import built, llama

    from pipeline.core.artifact import Artifact, digest_files
    from pipeline.models.decoder import _token_file, check_folder

    root = tmp_path_factory.mktemp("tiny-decoder")
    hf = llama(root / "hf")
    fp32 = built(hf, root / "fp32")
    rng = np.random.default_rng(1)
    ids = [[int(i) for i in rng.integers(2, 300, int(n))] for n in rng.integers(10, 20, 10)]
    return TinyDecoder(
        decoder=check_folder(hf, "model.path=hf"),
        fp32=Artifact(path=Path(fp32), stage="decoder_export", key="fp32", digest="fp32",
                      files=digest_files(fp32), meta={}),
        text=_token_file(ids, root / "tokens", "evaluation"))
