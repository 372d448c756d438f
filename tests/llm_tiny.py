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
    from transformers import LlamaConfig, LlamaForCausalLM

    model = _random(folder, seed, LlamaConfig, LlamaForCausalLM, layers, hidden, intermediate,
                    tie_word_embeddings=False)
    model.save_pretrained(str(folder))
    return Path(folder)


def _random(folder: Path, seed: int, config_cls, model_cls, layers: int, hidden: int,
            intermediate: int, **extra):
    """The tokenizer saved to folder, and a random tiny decoder of ``model_cls`` sized to it
    (4 heads, 2 KV heads, 128 positions), seeded."""
    import torch

    Path(folder).mkdir(parents=True, exist_ok=True)
    tok = tokenizer(Path(folder), seed)
    cfg = config_cls(vocab_size=len(tok), hidden_size=hidden, intermediate_size=intermediate,
                     num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                     max_position_embeddings=128, bos_token_id=0, eos_token_id=1, **extra)
    torch.manual_seed(seed)
    return model_cls(cfg).eval()


def built(source: Path, out: Path) -> Path:
    """The folder exported FP32 with a KV cache by onnxruntime-genai's model builder."""
    from onnxruntime_genai.models.builder import create_model, parse_extra_options

    cache = Path(out).parent / (Path(out).name + "-cache")
    args = ("tiny", str(source), str(out), "fp32", "cpu", str(cache))
    create_model(*args, **parse_extra_options(*args, []))
    return Path(out)


def gguf_file(source: Path, path: Path) -> Path:
    """The tiny Llama written as a GGUF file (F32 tensors, a GPT-2 style BPE vocabulary), laid
    out as llama.cpp's converter lays it out (Q and K rows permuted for its rotary layout), so
    that transformers' GGUF reader has to undo exactly what it undoes for a real file."""
    import json

    import gguf
    import numpy as np
    from safetensors.numpy import load_file

    cfg = json.loads((Path(source) / "config.json").read_text())
    tok = json.loads((Path(source) / "tokenizer.json").read_text())
    w = load_file(str(Path(source) / "model.safetensors"))
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]

    def permute(t, n):
        return t.reshape(n, 2, t.shape[0] // n // 2, *t.shape[1:]).swapaxes(1, 2).reshape(t.shape)

    out = gguf.GGUFWriter(str(path), "llama")
    out.add_context_length(cfg["max_position_embeddings"])
    out.add_embedding_length(cfg["hidden_size"])
    out.add_block_count(cfg["num_hidden_layers"])
    out.add_feed_forward_length(cfg["intermediate_size"])
    out.add_rope_dimension_count(cfg["hidden_size"] // heads)
    out.add_head_count(heads)
    out.add_head_count_kv(kv)
    out.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    out.add_rope_freq_base(float(cfg.get("rope_theta") or 10000.0))
    out.add_vocab_size(cfg["vocab_size"])
    vocab = sorted(tok["model"]["vocab"].items(), key=lambda kv_: kv_[1])
    out.add_tokenizer_model("gpt2")
    out.add_token_list([t for t, _ in vocab])
    out.add_token_types([3 if t in ("<s>", "</s>") else 1 for t, _ in vocab])
    out.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]])
    out.add_bos_token_id(cfg["bos_token_id"])
    out.add_eos_token_id(cfg["eos_token_id"])
    names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
             "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
    out.add_tensor("token_embd.weight", w["model.embed_tokens.weight"])
    for i in range(cfg["num_hidden_layers"]):
        for hf, gg in names.items():
            t = w[f"model.layers.{i}.{hf}.weight"]
            t = permute(t, heads) if gg == "attn_q" else permute(t, kv) if gg == "attn_k" else t
            out.add_tensor(f"blk.{i}.{gg}.weight", np.ascontiguousarray(t))
    out.add_tensor("output_norm.weight", w["model.norm.weight"])
    out.add_tensor("output.weight", w["lm_head.weight"])
    out.write_header_to_file()
    out.write_kv_data_to_file()
    out.write_tensors_to_file()
    out.close()
    return Path(path)


def qwen2(folder: Path, seed: int = 0, layers: int = 2, hidden: int = 64,
          intermediate: int = 128) -> Path:
    """Save a random tiny ``Qwen2ForCausalLM`` (Q/K/V biases, non-zero; the output layer tied to
    the embedding, as the small Qwen2 models ship) and its tokenizer to folder."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    model = _random(folder, seed, Qwen2Config, Qwen2ForCausalLM, layers, hidden, intermediate,
                    tie_word_embeddings=True)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.1)
    model.save_pretrained(str(folder))
    return Path(folder)


def gemma2(folder: Path, seed: int = 0, layers: int = 2, hidden: int = 64,
           intermediate: int = 128, window: int = 64) -> Path:
    """Save a random tiny ``Gemma2ForCausalLM``: local-attention layers with a ``window``-token
    sliding window alternating with global ones (the builder writes a local window into its
    attention, and onnxruntime wants a KV cache at least that long), and its tokenizer."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    model = _random(folder, seed, Gemma2Config, Gemma2ForCausalLM, layers, hidden, intermediate,
                    head_dim=hidden // 4, sliding_window=window)
    model.save_pretrained(str(folder))
    return Path(folder)


def gemma3(folder: Path, seed: int = 0, layers: int = 2, hidden: int = 64,
           intermediate: int = 128, window: int = 64, written_by_4x: bool = False) -> Path:
    """Save a random tiny ``Gemma3ForCausalLM`` and its tokenizer: a local-attention layer
    (``window`` tokens, RoPE base 10,000) then a global one (base 1,000,000), so each kind's
    rotary cache is exercised. transformers 5 writes the RoPE settings per kind of layer
    (``rope_parameters``); ``written_by_4x`` rewrites config.json the way the released Gemma 3
    checkpoints carry them, written by transformers 4.x (``rope_theta``, ``rope_local_base_freq``,
    ``rope_scaling: null``)."""
    import json

    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    kinds = ["sliding_attention", "full_attention"] * layers
    model = _random(folder, seed, Gemma3TextConfig, Gemma3ForCausalLM, layers, hidden,
                    intermediate, head_dim=hidden // 4, sliding_window=window,
                    layer_types=kinds[:layers])
    model.save_pretrained(str(folder))
    if written_by_4x:
        path = Path(folder) / "config.json"
        cfg = json.loads(path.read_text())
        rope = cfg.pop("rope_parameters")
        cfg.update(rope_theta=rope["full_attention"]["rope_theta"], rope_scaling=None,
                   rope_local_base_freq=rope["sliding_attention"]["rope_theta"],
                   transformers_version="4.55.0")
        path.write_text(json.dumps(cfg, indent=2))
    return Path(folder)


def mistral(folder: Path, seed: int = 0, layers: int = 2, hidden: int = 64,
            intermediate: int = 128, window: int = 64) -> Path:
    """Save a random tiny ``MistralForCausalLM`` with a ``window``-token sliding window (which
    the builder's export does not implement: its attention has no local window) and its
    tokenizer."""
    from transformers import MistralConfig, MistralForCausalLM

    model = _random(folder, seed, MistralConfig, MistralForCausalLM, layers, hidden,
                    intermediate, sliding_window=window)
    model.save_pretrained(str(folder))
    return Path(folder)


def to_bf16(folder: Path) -> Path:
    """The folder's weights re-saved in bf16, its config saying so: a checkpoint whose own dtype
    is not FP32, as a real one's is."""
    import json

    import torch
    from safetensors.torch import load_file, save_file

    w = load_file(str(folder / "model.safetensors"))
    save_file({k: v.to(torch.bfloat16) for k, v in w.items()}, str(folder / "model.safetensors"),
              metadata={"format": "pt"})
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "dtype": "bfloat16",
                                                    "torch_dtype": "bfloat16"}))
    return folder
