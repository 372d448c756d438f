"""A tiny decoder built in the test: random weights from a 2-layer ``LlamaConfig`` (hidden 64,
4 query / 2 KV heads, vocabulary 512) and a word-level tokenizer made with ``tokenizers``, saved
with ``save_pretrained``; and its onnxruntime-genai folder from the model builder's command line.
Nothing is downloaded."""
from __future__ import annotations

from pathlib import Path

VOCAB = 512


def llama(folder: Path, layers: int = 2, hidden: int = 64, seed: int = 0) -> Path:
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=256, bos_token_id=1, eos_token_id=2)
    LlamaForCausalLM(cfg).save_pretrained(folder)
    words = Tokenizer(models.WordLevel(vocab={f"w{i}": i for i in range(VOCAB)}, unk_token="w0"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=words, unk_token="w0", bos_token="w1",
                            eos_token="w2").save_pretrained(folder)
    return folder


def build(hf: Path, out: Path, precision: str = "int4", *extra: str) -> Path:
    """The builder's CLI on the CPU (it parses its own options before building), forked from a
    warm interpreter as the pipeline's command line is (``tests/warm_cli.py``)."""
    from tests.conftest import run_cli

    proc = run_cli("-i", str(hf), "-o", str(out), "-p", precision, "-e", "cpu",
                   "-c", str(out) + ".cache", *extra, module="onnxruntime_genai.models.builder")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out
