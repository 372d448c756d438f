"""A tiny Llama decoder folder built in the test: random weights from a ``LlamaConfig`` (2 layers,
hidden 64, 4 heads sharing 2 KV heads), a byte-level BPE tokenizer trained with ``tokenizers`` on
the generated sentences of ``hf_tiny``, saved with ``save_pretrained``. Nothing is downloaded."""
from __future__ import annotations

from pathlib import Path

from hf_tiny import sentences


def tokenizer(folder: Path, seed: int = 0, vocab: int = 300):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(sentences(200, seed), trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(str(folder))
    return fast


def llama(folder: Path, seed: int = 0, layers: int = 2, hidden: int = 64,
          intermediate: int = 128) -> Path:
    """Save a random tiny ``LlamaForCausalLM`` and its tokenizer to folder."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok = tokenizer(folder, seed)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=intermediate,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=128, bos_token_id=0, eos_token_id=1,
                      tie_word_embeddings=False)
    torch.manual_seed(seed)
    LlamaForCausalLM(cfg).eval().save_pretrained(str(folder))
    return folder


def built(source: Path, out: Path) -> Path:
    """The folder exported FP32 with a KV cache by onnxruntime-genai's model builder."""
    from onnxruntime_genai.models.builder import create_model, parse_extra_options

    cache = Path(out).parent / (Path(out).name + "-cache")
    args = ("tiny", str(source), str(out), "fp32", "cpu", str(cache))
    create_model(*args, **parse_extra_options(*args, []))
    return Path(out)
