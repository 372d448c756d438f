"""Scores of a decoder on text: perplexity, and next-token agreement with a reference.

In: a decoder folder as onnxruntime-genai's model builder writes it (``genai_config.json`` naming
the ONNX file, its inputs ``input_ids``, ``attention_mask`` and an empty KV cache per layer) and
token sequences. ``next_token_logits`` runs each sequence teacher-forced in one pass (the whole
sequence as the prompt, no past) and returns its logits; ``score`` turns them into perplexity
(``exp`` of the mean negative log-likelihood of each next token) and, given the reference's
logits for the same tokens, the share of positions whose most likely next token is the same
(top-1 agreement) and the mean KL divergence from the reference's next-token distribution to the
candidate's, in nats. Position t's logits predict token t+1, so a sequence of n tokens scores
n-1 positions.

The reference runs at ``accuracy_level=0``: onnxruntime's MatMulNBits at level 4 quantizes the
activations to int8, which can flip the greedy token at near-ties, so a reference with that
setting would move with the candidate's own error.
"""
from __future__ import annotations

import json
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np


@dataclass(frozen=True)
class TextScores:
    perplexity: float  # exp(mean NLL per predicted token); lower is better
    top1_agreement: float | None  # share of positions with the reference's argmax; None: no ref
    kl_mean: float | None  # mean KL(reference || candidate) per position, nats; None: no ref


def model_file(folder: Path) -> Path:
    """The decoder's ONNX file, as ``genai_config.json`` names it."""
    folder = Path(folder)
    config = json.loads((folder / "genai_config.json").read_text())
    return folder / config["model"]["decoder"]["filename"]


def _with_accuracy_level(path: Path, level: int, scratch: Path) -> str:
    """A copy of the model whose MatMulNBits nodes run at ``level`` (0 drops the attribute,
    as onnxruntime's default is full precision)."""
    import os

    import onnx

    def relevel(model):
        for node in model.graph.node:
            if node.op_type == "MatMulNBits":
                keep = [a for a in node.attribute if a.name != "accuracy_level"]
                del node.attribute[:]
                node.attribute.extend(keep)
                if level:
                    node.attribute.append(onnx.helper.make_attribute("accuracy_level", level))
        return model

    out = scratch / "model.onnx"
    # the graph alone, its data hard-linked beside it (onnxruntime refuses a symbolic link out
    # of the model's folder): a copy of the weights in memory would be a whole model more at
    # the peak, which a model past the memory budget does not have (docs/llm.md)
    model = relevel(onnx.load(str(path), load_external_data=False))
    files = {e.value for t in model.graph.initializer for e in t.external_data
             if e.key == "location"}
    try:
        for name in files:
            os.link(path.parent / name, scratch / name)
        onnx.save(model, str(out))
        return str(out)
    except OSError:  # another filesystem: the weights loaded and written whole, as before
        for name in files:
            (scratch / name).unlink(missing_ok=True)
    model = relevel(onnx.load(str(path)))
    onnx.save(model, str(out), save_as_external_data=True, location="model.onnx.data")
    return str(out)


def _has_nbits(path: Path) -> bool:
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    return any(n.op_type == "MatMulNBits" for n in graph.node)


def session(folder: Path, accuracy_level: int | None = None, threads: int = 0):
    """An onnxruntime session of the folder's decoder; ``accuracy_level`` overrides the one its
    MatMulNBits nodes carry (None: as built)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    # fatal only: a kernel's refusal is raised and reported by the stage in one line, and
    # onnxruntime's own log would print it again, in red, on the user's terminal
    opts.log_severity_level = 4
    path = model_file(folder)
    if accuracy_level is None or not _has_nbits(path):  # a float model has no level to set
        return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    with tempfile.TemporaryDirectory(prefix="acc-level-") as scratch:
        # onnxruntime reads the external data while the session is made, so the copy may go
        return ort.InferenceSession(_with_accuracy_level(path, accuracy_level, Path(scratch)),
                                    opts, providers=["CPUExecutionProvider"])


def empty_past(folder: Path, sess) -> dict[str, np.ndarray]:
    """An empty KV cache for batch 1 (the builder names the head size symbolically, so it comes
    from ``genai_config.json``). Its capacity is 0 positions, or the local attention window for
    a model with local-attention layers (Gemma 2 and 3): onnxruntime's GroupQueryAttention
    refuses a smaller buffer there, and a buffer of zeros with the attention mask over the
    sequence alone is the same empty past (a tiny Gemma 2: logits within 4e-7 of transformers')."""
    decoder = json.loads((Path(folder) / "genai_config.json").read_text())["model"]["decoder"]
    capacity = local_window(model_file(folder))
    feeds = {}
    for i in sess.get_inputs():
        if i.name.startswith("past_key_values"):
            dtype = np.float16 if i.type == "tensor(float16)" else np.float32
            feeds[i.name] = np.zeros((1, decoder["num_key_value_heads"], capacity,
                                      decoder["head_size"]), dtype)
    return feeds


def local_window(path: Path) -> int:
    """The largest ``local_window_size`` of the model's GroupQueryAttention nodes (0: none)."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    sizes = [a.i for n in graph.node if n.op_type == "GroupQueryAttention"
             for a in n.attribute if a.name == "local_window_size"]
    return max([0, *sizes])


def next_token_logits(folder, token_ids: Sequence[Sequence[int]], *,
                      accuracy_level: int | None = None, threads: int = 0,
                      sess=None) -> list[np.ndarray]:
    """Teacher-forced logits, float32 ``[len, vocab]``, of each sequence (batch 1, no past)."""
    sess = sess or session(Path(folder), accuracy_level, threads)
    past = empty_past(folder, sess)
    out = []
    for ids in token_ids:
        ids = np.asarray(ids, np.int64)[None, :]
        feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids), **past}
        logits = sess.run(["logits"], feeds)[0]
        out.append(np.asarray(logits[0], np.float32))
    return out


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def sums(logits: Sequence[np.ndarray], token_ids: Sequence[Sequence[int]],
         reference_logits: Sequence[np.ndarray] | None = None) -> np.ndarray:
    """[NLL, positions, agreeing positions, KL] summed over the sequences: sums of parts of a
    text add up to the sums of the whole, so a long text is scored a few sequences at a time."""
    out = np.zeros(4)
    for i, (lg, ids) in enumerate(zip(logits, token_ids)):
        ids = np.asarray(ids)
        n = len(ids) - 1
        if n < 1:
            continue
        logp = _log_softmax(np.asarray(lg)[:n])
        out[0] -= float(logp[np.arange(n), ids[1:]].sum())
        out[1] += n
        if reference_logits is not None:
            ref = _log_softmax(np.asarray(reference_logits[i])[:n])
            out[2] += int((ref.argmax(-1) == logp.argmax(-1)).sum())
            out[3] += float((np.exp(ref) * (ref - logp)).sum())
    return out


def from_sums(total: np.ndarray, with_reference: bool) -> TextScores:
    nll, positions, agree, kl = total
    if positions == 0:
        raise ValueError("no sequence has two tokens: nothing to score")
    if not with_reference:
        return TextScores(math.exp(nll / positions), None, None)
    return TextScores(math.exp(nll / positions), agree / positions, kl / positions)


def score(logits: Sequence[np.ndarray], token_ids: Sequence[Sequence[int]],
          reference_logits: Sequence[np.ndarray] | None = None) -> TextScores:
    """Perplexity of the tokens under ``logits``; with ``reference_logits``, top-1 agreement and
    mean KL(reference || candidate) over the same predicted positions."""
    return from_sums(sums(logits, token_ids, reference_logits), reference_logits is not None)


# What the gate judges a decoder on, each against the FP32 reference (which scores 0 % rise,
# 100 % agreement and 0 nats against itself). Perplexity may rise 2 % of FP32's (the issue's
# INT8 at level 4 rose 1.4 %, its INT4 23 %); and with it, the greedy next token may differ from
# FP32's at 10 % of positions: level 4's int8 activations flip near-ties even at 8 bits (97.4 %
# agreement on SmolLM2-135M on an AVX2 EPYC, 93.8 % on this project's docs on an AMX Xeon, with
# perplexity +0.6 %), while 4 bits everywhere falls to 68.5 %. The KL divergence is reported;
# gate it with gate.max_accuracy_drop={kl_mean: x}.
def _specs() -> dict:
    from pipeline.task.metric import MetricSpec

    return {"perplexity_rise": MetricSpec("perplexity_rise", False, "%", needs_labels=False,
                                          limit=2.0, scale="% of FP32's perplexity",
                                          gated_with=("top1_agreement",)),
            "top1_agreement": MetricSpec("top1_agreement", True, "%", needs_labels=False,
                                         limit=10.0, scale="points"),
            "kl_mean": MetricSpec("kl_mean", False, "", needs_labels=False, limit=None,
                                  scale="nats")}


SPECS = _specs()
REFERENCE = {"perplexity_rise": 0.0, "top1_agreement": 100.0, "kl_mean": 0.0}


def gated(scores: dict) -> dict:
    """A ``score_text`` result in the gate's metrics (percentages for rise and agreement)."""
    def pct(v):
        return None if v is None else 100.0 * v

    return {"perplexity_rise": scores.get("perplexity_rise_pct"),
            "top1_agreement": pct(scores.get("top1_agreement")),
            "kl_mean": scores.get("kl_mean")}


# -- the reference, computed once --------------------------------------------------------------
# What a candidate's agreement and KL need of FP32, kept per predicted position: the next token's
# NLL (for the paired perplexity rise), and the TOP_K most likely tokens with their
# log-probabilities (normalized over the whole vocabulary: the log-sum-exp is taken before the cut).
# 16 of them at 4 + 4 bytes and the NLL are 136 bytes a position: 512 rows of 256 tokens are
# 18 MB, where full logits of a 49k vocabulary would be 26 GB.
TOP_K = 16


@dataclass(frozen=True)
class Reference:
    """FP32's summary of a text, concatenated over its sequences: sequence i's positions are
    ``offsets[i]:offsets[i + 1]``."""
    offsets: np.ndarray   # int64 [sequences + 1]
    nll: np.ndarray       # float64 [positions]: -log p(next token)
    top_ids: np.ndarray   # int32 [positions, k], most likely first
    top_logp: np.ndarray  # float32 [positions, k]: log-probabilities over the full vocabulary

    def part(self, i: int, j: int) -> "Reference":
        """Sequences i..j-1."""
        a, b = int(self.offsets[i]), int(self.offsets[j])
        return Reference(self.offsets[i:j + 1] - a, self.nll[a:b], self.top_ids[a:b],
                         self.top_logp[a:b])

    def save(self, path: Path) -> None:
        np.savez(path, offsets=self.offsets, nll=self.nll, top_ids=self.top_ids,
                 top_logp=self.top_logp)

    @staticmethod
    def load(path: Path) -> "Reference":
        with np.load(path) as z:
            return Reference(z["offsets"], z["nll"], z["top_ids"], z["top_logp"])


def _lse(x: np.ndarray) -> np.ndarray:
    """log-sum-exp over the last axis, as float64, of float32 logits: after the max is taken
    out every term is at most 1, so summing them in float32 (numpy's pairwise sum) is within
    about 1e-7 nats of a float64 sum, at a quarter of its time (a float64 log-softmax of a
    256-token row of a 49k vocabulary took longer than the model's pass here)."""
    m = x.max(axis=-1, keepdims=True)
    return m[..., 0].astype(np.float64) + np.log(np.exp(x - m).sum(axis=-1).astype(np.float64))


def reference(logits: Sequence[np.ndarray], token_ids: Sequence[Sequence[int]],
              k: int = TOP_K) -> Reference:
    """The reference's summary of each sequence (sequences with fewer than two tokens add none)."""
    nll, ids_out, logp_out, offsets = [], [], [], [0]
    for lg, ids in zip(logits, token_ids):
        ids = np.asarray(ids)
        n = max(len(ids) - 1, 0)
        x = np.asarray(lg, np.float32)[:n]
        lse = _lse(x)[:, None]
        kk = min(k, x.shape[-1])
        top = np.argpartition(x, x.shape[-1] - kk, axis=-1)[:, -kk:]  # the k largest, unordered
        top = np.take_along_axis(top, np.argsort(-np.take_along_axis(x, top, -1), -1), -1)
        nll.append(lse[:, 0] - x[np.arange(n), ids[1:]])
        ids_out.append(top.astype(np.int32))
        logp_out.append((np.take_along_axis(x, top, -1) - lse).astype(np.float32))
        offsets.append(offsets[-1] + n)
    return Reference(np.asarray(offsets, np.int64), np.concatenate(nll),
                     np.concatenate(ids_out), np.concatenate(logp_out))


# Per sequence, what the candidate's scores against the reference are sums of:
ROW_FIELDS = ("positions", "nll", "reference_nll", "agree", "kl")


def row_sums(logits: Sequence[np.ndarray], token_ids: Sequence[Sequence[int]],
             ref: Reference) -> np.ndarray:
    """[sequences, ROW_FIELDS] of the candidate's logits for ``token_ids`` against ``ref``
    (the reference's summary of the same sequences).

    KL is over the reference's top-k support plus one outcome for the rest of the vocabulary:
    KL(p || q) of the distributions coarsened to k + 1 outcomes (the k tokens, and "any other"
    with the mass 1 - sum). Coarsening never increases a KL divergence, so this is a lower bound
    of the full KL, equal to it as the reference's mass outside its top k goes to zero."""
    out = np.zeros((len(logits), len(ROW_FIELDS)))
    for i, (lg, ids) in enumerate(zip(logits, token_ids)):
        a, b = int(ref.offsets[i]), int(ref.offsets[i + 1])
        n = b - a
        if n < 1:
            continue
        if n != len(ids) - 1:
            raise ValueError(f"sequence {i}: {len(ids) - 1} positions, the reference has {n}")
        x = np.asarray(lg, np.float32)[:n]
        lse = _lse(x)[:, None]
        tops = ref.top_ids[a:b].astype(np.int64)
        lr = ref.top_logp[a:b].astype(np.float64)
        lc = np.take_along_axis(x, tops, -1) - lse
        pr = np.exp(lr)
        tail_r = np.clip(1.0 - pr.sum(-1), 0.0, 1.0)
        tail_c = np.clip(1.0 - np.exp(lc).sum(-1), 1e-300, 1.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            tail = np.where(tail_r > 0, tail_r * (np.log(tail_r) - np.log(tail_c)), 0.0)
        nxt = np.asarray(ref.nll[a:b])
        out[i] = (n, float((lse[:, 0] - x[np.arange(n), np.asarray(ids)[1:]]).sum()),
                  float(nxt.sum()), int((x.argmax(-1) == tops[:, 0]).sum()),
                  float((pr * (lr - lc)).sum() + tail.sum()))
    return out
