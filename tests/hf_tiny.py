"""A tiny BERT folder built in the test: random weights from a ``BertConfig`` (2 layers, hidden
32, 2 heads) and a WordPiece tokenizer trained on a few generated sentences with ``tokenizers``,
saved with ``save_pretrained``, plus generated text data (JSONL) of varied length, and sentence
pairs with a gold similarity score (the share of words the two sides share, STS-B style).
Nothing is downloaded."""
from __future__ import annotations

import json
import random
from pathlib import Path

WORDS = ("the quick brown fox jumps over a lazy dog while seven small birds sing in green trees "
         "near old stone bridges and rivers flow under bright summer skies every morning").split()


def sentences(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 40))) for _ in range(n)]


def tokenizer(folder: Path, seed: int = 0):
    """The bench's BERT WordPiece tokenizer, trained on a few generated sentences."""
    from benchmarks.transformer import wordpiece

    return wordpiece(folder, sentences(200, seed), vocab_size=120)


def bert(folder: Path, task: str = "feature-extraction", num_labels: int = 3, seed: int = 0,
         layers: int = 2, hidden: int = 32, heads: int = 2, with_tokenizer: bool = True) -> Path:
    """Save a random tiny BERT (``BertModel`` or ``BertForSequenceClassification``) to folder."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification, BertModel

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    vocab = 120
    if with_tokenizer:
        vocab = len(tokenizer(folder, seed).get_vocab())
    cfg = BertConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                     num_attention_heads=heads, intermediate_size=4 * hidden,
                     max_position_embeddings=64, num_labels=num_labels)
    torch.manual_seed(seed)
    cls = BertForSequenceClassification if task == "sequence-classification" else BertModel
    cls(cfg).eval().save_pretrained(str(folder))
    return folder


def albert(folder: Path, num_labels: int = 3, seed: int = 0, layers: int = 3) -> Path:
    """Save a random tiny ``AlbertForSequenceClassification``: one layer's weights shared by
    ``layers`` layers, embeddings of 16 mapped to a hidden size of 32, and its tokenizer."""
    import torch
    from transformers import AlbertConfig, AlbertForSequenceClassification

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cfg = AlbertConfig(vocab_size=len(tokenizer(folder, seed).get_vocab()), embedding_size=16,
                       hidden_size=32, num_hidden_layers=layers, num_attention_heads=2,
                       intermediate_size=64, max_position_embeddings=64, num_labels=num_labels)
    torch.manual_seed(seed)
    AlbertForSequenceClassification(cfg).eval().save_pretrained(str(folder))
    return folder


def text_data(path: Path, n: int, seed: int = 0, labels: int = 0) -> Path:
    """A JSONL file of ``n`` sentences (column ``text``), with integer labels when ``labels``."""
    rng = random.Random(seed + 1)
    with open(path, "w") as f:
        for s in sentences(n, seed + 100):
            row = {"text": s}
            if labels:
                row["label"] = rng.randrange(labels)
            f.write(json.dumps(row) + "\n")
    return path


def pair_data(path: Path, n: int, seed: int = 0) -> Path:
    """A JSONL file of ``n`` sentence pairs (``sentence1``, ``sentence2``, ``score``): the second
    side is the first with some of its words replaced (at least one, up to all), and the gold
    score is the share of positions left unchanged, so similar pairs score high."""
    rng = random.Random(seed + 2)
    with open(path, "w") as f:
        for s in sentences(n, seed + 200):
            words = s.split()
            changed = set(rng.sample(range(len(words)), rng.randint(1, len(words))))
            other = [rng.choice([w for w in WORDS if w != words[i]]) if i in changed else words[i]
                     for i in range(len(words))]
            f.write(json.dumps({"sentence1": s, "sentence2": " ".join(other),
                                "score": round(1 - len(changed) / len(words), 4)}) + "\n")
    return path


def mpnet(folder: Path, seed: int = 0, layers: int = 2, hidden: int = 32, heads: int = 2) -> Path:
    """Save a random tiny MPNet (``MPNetModel``: BERT's layout plus a relative position bias in
    every layer's attention scores, which onnxruntime's optimizer does not fuse) to folder, with
    the same WordPiece tokenizer."""
    import torch
    from transformers import MPNetConfig, MPNetModel

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    vocab = len(tokenizer(folder, seed).get_vocab())
    cfg = MPNetConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                      num_attention_heads=heads, intermediate_size=4 * hidden,
                      max_position_embeddings=66)  # 64 token positions
    torch.manual_seed(seed)
    MPNetModel(cfg).eval().save_pretrained(str(folder))
    # MPNet takes no token types: its tokenizer names two inputs, as all-mpnet-base-v2's does
    conf = folder / "tokenizer_config.json"
    conf.write_text(json.dumps({**json.loads(conf.read_text()),
                                "model_input_names": ["input_ids", "attention_mask"]}))
    return folder
