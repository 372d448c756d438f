"""``model=hf``: a transformer encoder from a local Hugging Face folder (never a hub download).

In: a ``Source`` of kind ``hf``: the folder (``config.json``, the weights, the tokenizer files),
its content digest, ``model.params`` (``task``: feature-extraction or sequence-classification,
read from the folder's architectures when absent; ``pooling``: mean, cls or max, from a
sentence-transformers ``1_Pooling/config.json`` when the folder has one, else mean;
``normalize``: L2-normalize embeddings, default true; ``max_length``), and the data and metric
configs. Out: a ``Task`` whose inputs are the tokenizer's ``input_ids``, ``attention_mask`` (and
``token_type_ids`` when the tokenizer makes them), int64 ``[batch, sequence]``; whose output is
a sentence embedding ``[batch, hidden]`` or classifier logits ``[batch, labels]``; whose samples
are the data's text column tokenized with the folder's own tokenizer (truncated to
``max_length``, padded per batch; with ``data.pair_columns``, both sides of each sentence pair,
and Spearman's rho of the pairs' cosines against the gold scores in ``data.label_column``
besides the cosine against FP16); and whose ``fusion`` (model type, heads, hidden size from
``config.json``) tells the recipe to fuse with ``onnxruntime.transformers`` (``stages.fuse``).
Export uses the TorchScript exporter with eager attention: that graph is the one ONNX Runtime's
transformer fusions recognise (the dynamo export of the same model fuses no attention).
One line, before any stage, for: a folder without a tokenizer, an unknown architecture, weights
that do not match the config; and, when its key is made (``pipeline.models.files``), weights
that are not safetensors (no pickle is ever loaded) and a file the folder names (a weight shard,
a tokenizer file) or links to that lies outside it.
"""
from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path

import numpy as np

from pipeline.core.errors import ConfigError, StageError
from pipeline.metrics import agreement as agreement_metrics
from pipeline.metrics import pairs as pair_metrics
from pipeline.config.metrics import MetricName
from pipeline.task.contract import InputSpec, MetricsSpec, OutputSpec
from pipeline.task.serving import TextInput
from pipeline.models.user_task import UserTask

TASKS = ("feature-extraction", "sequence-classification")
PAIR_TEXT = "__pair_text__"  # the column both sides of sentence pairs are laid out in, in turn
POOLINGS = ("mean", "cls", "max")
# Files one of which a folder's tokenizer needs (a fast tokenizer's JSON, a WordPiece or BPE
# vocabulary, a SentencePiece model): without them transformers builds an empty tokenizer.
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "spiece.model",
                   "sentencepiece.bpe.model", "tokenizer.model")
# What a server needs to tokenize as the evaluation did: the tokenizer's files, its settings and
# config.json (AutoTokenizer reads the tokenizer's class from it when tokenizer_config lacks it).
SERVING_FILES = (*TOKENIZER_FILES, "tokenizer_config.json", "special_tokens_map.json",
                 "added_tokens.json", "merges.txt", "config.json")
# Encoders ONNX Runtime's optimizer fuses with its BERT rules (attention, skip LayerNorm, GELU,
# embedding LayerNorm); other model types are exported and run unfused.
BERT_LIKE = ("bert", "roberta", "xlm-roberta", "camembert", "distilbert", "electra", "albert",
             "mpnet", "ernie")
INPUT_ORDER = ("input_ids", "attention_mask", "token_type_ids")
COSINE_PARITY = 0.9999  # embeddings: a lossless conversion keeps every vector this close
OPSET = 17  # the TorchScript exporter's well-trodden opset for encoders


# Model types whose position ids count from the padding index + 1 (RoBERTa's scheme; MPNet's
# index is 1 whatever pad_token_id says): of their max_position_embeddings (514 for
# roberta-base), that many are never a token's position.
OFFSET_POSITIONS = ("roberta", "xlm-roberta", "camembert", "mpnet", "longformer", "data2vec-text")


def offline() -> None:
    """No hub access from here on, whatever the caller's environment says."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    from transformers.utils import logging as hf_logging

    # Loading's progress bars and key tables are not the user's business: problems are raised
    # here as one line each (``build_network``).
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def folder_config(folder: Path):
    offline()
    from transformers import AutoConfig

    if not (folder / "config.json").is_file():
        raise ConfigError(f"model.path={folder}: no config.json (expected a Hugging Face model "
                          "folder written by save_pretrained)")
    try:
        return AutoConfig.from_pretrained(str(folder), local_files_only=True)
    except (ValueError, KeyError, OSError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConfigError(f"model.path={folder}: unknown architecture ({first})") from None


def folder_tokenizer(folder: Path):
    offline()
    from transformers import AutoTokenizer

    if not any((folder / f).is_file() for f in TOKENIZER_FILES):
        raise ConfigError(f"model.path={folder}: no tokenizer (none of "
                          f"{', '.join(TOKENIZER_FILES)}); save it with "
                          "tokenizer.save_pretrained into the same folder")
    try:
        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except Exception as e:  # noqa: BLE001 - a broken tokenizer file: one line naming it
        raise ConfigError(f"model.path={folder}: the tokenizer cannot be loaded "
                          f"({type(e).__name__}: {str(e).splitlines()[0][:200]})") from None


def task_of(config, params: dict) -> str:
    kind = params.get("task")
    if kind is None:
        archs = config.architectures or []
        kind = ("sequence-classification" if any(a.endswith("ForSequenceClassification")
                                                 for a in archs) else "feature-extraction")
    if kind not in TASKS:
        raise ConfigError(f"model.params.task={kind}: valid choices are {', '.join(TASKS)}")
    return kind


def pooling_of(folder: Path, params: dict) -> str:
    pooling = params.get("pooling")
    st = folder / "1_Pooling" / "config.json"  # sentence-transformers names its pooling here
    if pooling is None and st.is_file():
        cfg = _json_object(st, "the sentence-transformers pooling (or set model.params.pooling)")
        pooling = next((p for key, p in (("pooling_mode_cls_token", "cls"),
                                         ("pooling_mode_max_tokens", "max"),
                                         ("pooling_mode_mean_tokens", "mean")) if cfg.get(key)),
                       None)
    pooling = pooling or "mean"
    if pooling not in POOLINGS:
        raise ConfigError(f"model.params.pooling={pooling}: valid choices are "
                          f"{', '.join(POOLINGS)}")
    return pooling


def _json_object(path: Path, what: str) -> dict:
    """A JSON file holding an object; one line naming the file, the line and the cause if not."""
    try:
        value = json.loads(path.read_bytes())
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: line {e.lineno}: not valid JSON ({e.msg} at column "
                          f"{e.colno}); it holds {what}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start + 1}); it holds {what}") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: a JSON {type(value).__name__} where an object was expected; "
                          f"it holds {what}")
    return value


def network(model, kind: str, pooling: str, normalize: bool, inputs: tuple[str, ...]):
    """The transformers model wrapped so it takes the inputs by position and returns one tensor:
    the pooled (and normalized) embedding, or the logits."""
    import torch

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *feeds):
            named = dict(zip(inputs, feeds))
            out = self.model(**named)
            if kind == "sequence-classification":
                return out.logits
            h = out.last_hidden_state
            mask = named["attention_mask"].unsqueeze(-1).to(h.dtype)
            if pooling == "cls":
                e = h[:, 0]
            elif pooling == "max":
                e = (h + (mask - 1.0) * 1e9).max(dim=1).values
            else:
                e = (h * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
            return torch.nn.functional.normalize(e, dim=-1) if normalize else e

    return Encoder().eval()


class HfTask(UserTask):
    # Transformers: dynamic INT8 for the matrix products, the fused attention's Q/K/V projection
    # included (QAttention); LayerNorm and Softmax stay float. The latency-aware fallback keeps
    # float any of them that got slower on the target.
    dynamic_op_types = ("MatMul", "Gemm", "Attention")
    column_per_input = False  # the tokenizer makes every input from data.input_column's text
    # SmoothQuant-style strengths the INT8 recipe tries (pipeline.stages.smooth): pretrained
    # encoders' LayerNorm and GELU outputs carry outlier channels
    smooth_alphas = (0.5, 0.65, 0.8)
    module_prefix = "model."  # node paths: ``network`` holds the transformers model as ``model``
    no_pruning = ("model=hf: pruning a transformer needs a recovery loop the folder does not "
                  "provide; run with prune=none")

    def __init__(self, key):
        super().__init__(key)
        offline()
        self.folder = Path(key.path)
        self.params = json.loads(key.spec)["params"]
        self.config = folder_config(self.folder)
        _preload(self.config.model_type)
        self.tokenizer = folder_tokenizer(self.folder)
        self.kind = task_of(self.config, self.params)
        self.pooling = pooling_of(self.folder, self.params)
        self.normalize = bool(self.params.get("normalize", True))
        self.pairs = tuple(self.data_cfg.pair_columns)
        positions = getattr(self.config, "max_position_embeddings", 512) or 512
        if self.config.model_type in OFFSET_POSITIONS:  # position ids start past the pad id
            pad = 1 if self.config.model_type == "mpnet" else self.config.pad_token_id  # MPNet: fixed
            positions -= (pad if pad is not None else 1) + 1
        limit = min(positions, 512, self.tokenizer.model_max_length or 512)
        self.max_length = int(self.params.get("max_length", limit))
        if not 1 < self.max_length <= limit:
            raise ConfigError(f"model.params.max_length={self.max_length}: must be in 2..{limit} "
                              "(the model's positions)")
        names = [n for n in INPUT_ORDER if n in self.tokenizer.model_input_names]
        if "input_ids" not in names or "attention_mask" not in names:
            names = ["input_ids", "attention_mask"] + [n for n in names if n == "token_type_ids"]
        self.input_names = tuple(names)
        self.inputs = tuple(InputSpec(n, "int64", ("batch", "sequence")) for n in names)
        # The folder's weights are checked against its config where the run starts: one line
        # before any stage. A stage's child process (whose key pins the folder's content digest)
        # builds the network only if it uses it (load, export, the label-free reference):
        # loading it costs about a second per child.
        self._built = None
        if multiprocessing.parent_process() is None:
            self._built = self.build_network(self.params, None)
        if self.kind == "sequence-classification":
            self.outputs = (OutputSpec("logits", "float32", ("batch", self.config.num_labels)),)
        else:
            hidden = self._hidden()
            self.outputs = (OutputSpec("sentence_embedding", "float32", ("batch", hidden)),)
        mt = self.config.model_type
        self.fusion = ({"model_type": "bert", "num_heads": self._heads(),
                        "hidden_size": self._hidden(), "source_type": mt}
                       if mt in BERT_LIKE else None)
        self._finish()

    def __repr__(self) -> str:
        return f"HfTask({self.key.path!r})"

    @property
    def _net(self):
        """The folder's network with its pooling: the label-free reference."""
        if self._built is None:
            self._built = self.build_network(self.params, None)
        return self._built

    def _hidden(self) -> int:
        c = self.config
        return int(getattr(c, "hidden_size", None) or getattr(c, "dim"))

    def _heads(self) -> int:
        c = self.config
        return int(getattr(c, "num_attention_heads", None) or getattr(c, "n_heads"))

    # -- the network -----------------------------------------------------------------------------
    def _model_class(self):
        from transformers import AutoModel, AutoModelForSequenceClassification

        return (AutoModelForSequenceClassification if self.kind == "sequence-classification"
                else AutoModel)

    def build_network(self, params: dict, weights: dict | None = None):
        """From the folder (``weights`` None: checked against its config) or from a load
        artifact's state dict. Eager attention: the pattern ONNX Runtime's fusions recognise."""
        import torch

        cls = self._model_class()
        if weights is None:
            try:
                model, info = cls.from_pretrained(
                    str(self.folder), local_files_only=True, attn_implementation="eager",
                    output_loading_info=True, ignore_mismatched_sizes=True,
                    use_safetensors=True)  # never a pickle, even past hf_files
            except (OSError, ValueError, RuntimeError) as e:
                raise ConfigError(f"model.path={self.folder}: the weights cannot be loaded "
                                  f"({type(e).__name__}: {str(e).splitlines()[0][:200]})") from None
            # a head the folder does not have is initialised randomly by transformers: refused too
            bad = [f"{k} has a different shape" for k in _keys(info.get("mismatched_keys"))]
            bad += [f"{k} is missing" for k in _keys(info.get("missing_keys"))]
            if bad:
                more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
                raise ConfigError(f"model.path={self.folder}: the weights do not match "
                                  f"config.json: tensor {bad[0]}{more}")
        else:
            torch.manual_seed(0)
            model = cls.from_config(self.config, attn_implementation="eager")
        net = network(model, self.kind, self.pooling, self.normalize, self.input_names)
        if weights is not None:
            net.load_state_dict(weights, strict=True)
        return net.eval()

    def export_onnx(self, net, example: dict, target: Path, opset: int) -> None:
        """TorchScript exporter, named dynamic axes (batch, sequence) on every input."""
        import logging
        import warnings

        import torch

        logging.getLogger("torch.onnx").setLevel(logging.ERROR)
        args = tuple(torch.from_numpy(example[n]) for n in self.input_names)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(net, args, str(target), dynamo=False,
                              opset_version=min(opset, OPSET),
                              input_names=list(self.input_names),
                              output_names=[o.name for o in self.outputs],
                              dynamic_axes={**{n: {0: "batch", 1: "sequence"}
                                               for n in self.input_names},
                                            self.outputs[0].name: {0: "batch"}})
        _every_input_taken(target, self.input_names, self.config)

    def _reference(self, feeds: dict):
        import torch

        with torch.inference_mode():
            return self._net(*(torch.from_numpy(feeds[n]) for n in self.input_names)).numpy()

    # -- data ------------------------------------------------------------------------------------
    def _check_columns(self, data) -> None:
        """One text column feeds every input (the tokenizer makes them). Sentence pairs: an
        embedding model's, each with a finite gold score."""
        if not self.pairs:
            return
        if self.kind != "feature-extraction":
            raise ConfigError(f"data.pair_columns: sentence pairs are scored for embedding models "
                              f"(feature-extraction); {self.what} is a {self.kind} model")
        gold = self.data_cfg.label_column
        if gold not in data.dataset.column_names:
            raise ConfigError(f"data.pair_columns: pairs need gold similarity scores; "
                              f"data.label_column={gold} is not a column of {self.data_cfg.path} "
                              f"(columns: {', '.join(data.dataset.column_names)})")
        values = data.dataset.select(data.calibration + data.evaluation)[gold]
        bad = [v for v in values if not isinstance(v, (int, float)) or isinstance(v, bool)
               or not np.isfinite(v)]
        if bad:
            raise ConfigError(f"data.label_column={gold}: gold similarity scores must be numbers; "
                              f"{self.data_cfg.path} has {bad[0]!r}")

    def _select(self, rows: list[int]):
        """Sentence pairs: both sides as plain sentences, in turn (pair ``i`` gives two samples,
        each labelled with the pair's row and gold score), so calibration, timing and the cosine
        against FP16 read every sentence and the score pairs them up again."""
        if not self.pairs:
            return super()._select(rows)
        from datasets import Dataset

        ds = self.data().dataset.select(rows)
        gold = ds[self.data_cfg.label_column]
        texts = [str(t) for pair in zip(*(ds[c] for c in self.pairs)) for t in pair]
        labels = [{"pair": int(r), "gold": float(g)} for r, g in zip(rows, gold) for _ in (0, 1)]
        return Dataset.from_dict({PAIR_TEXT: texts, self.data_cfg.label_column: labels})

    def _arrays(self, ds, rows: list[int]) -> list[dict]:
        col = PAIR_TEXT if self.pairs else self.data_cfg.input_column
        return encode(self.tokenizer, [str(t) for t in ds.select(rows)[col]], self.max_length,
                      self.input_names)

    def _collate(self, samples: list[dict]) -> dict:
        return collate(samples, self.input_names, self.tokenizer.pad_token_id)

    # -- serving: what a server needs to read a request as the evaluation read its samples -------
    not_served = None  # every encoder is served (text in)

    def serving_spec(self) -> TextInput:
        """The tokenization the evaluation used and how the outputs are decoded, with the digest
        of every tokenizer file the published artifact carries (``serving_files``)."""
        from pipeline.core.artifact import sha256_file

        labels = getattr(self.config, "id2label", None) or {}
        return TextInput(
            task=self.kind, input_names=tuple(self.input_names), max_length=self.max_length,
            pad_token_id=self.tokenizer.pad_token_id, metric=self.metric_cfg.name,
            top_k=self.metric_cfg.top_k,
            labels=(tuple(str(labels.get(k, labels.get(str(k), k)))
                          for k in range(self.config.num_labels))
                    if self.kind == "sequence-classification" else None),
            files={name: sha256_file(path) for name, path in sorted(self.serving_files().items())})

    def serving_files(self) -> dict[str, Path]:
        """The folder's tokenizer files (and ``config.json``, which names the tokenizer's class
        when its own config does not): they travel with the published model, not the weights."""
        return {name: self.folder / name for name in SERVING_FILES
                if (self.folder / name).is_file()}

    def example(self, batch: int = 1) -> dict:
        """Real samples, at least 8 tokens long so no size is specialised away in export."""
        feeds = super().example(batch)
        short = 8 - feeds["input_ids"].shape[1]
        if short > 0:
            feeds = self._collate([{n: np.pad(a[0], (0, short), constant_values=(
                self.tokenizer.pad_token_id or 0) if n == "input_ids" else 0)
                for n, a in feeds.items()}] * batch)
        return feeds

    # -- metrics ---------------------------------------------------------------------------------
    def _metrics(self, data) -> MetricsSpec:
        if self.kind == "feature-extraction":
            if self.metric_cfg.name != MetricName.agreement:
                raise ConfigError(f"metric={self.metric_cfg.name.value} does not fit a "
                                  "feature-extraction model (an embedding has no classes); use "
                                  "metric=agreement (cosine similarity to the FP16 baseline's outputs)")
            names = ("cosine_mean", "cosine_p1", "max_abs_diff", "mean_abs_diff")
            specs = tuple(agreement_metrics.SPECS[n] for n in names)
            if self.pairs:  # next to the cosine against FP16: the rank correlation with gold
                specs += (pair_metrics.SPECS["spearman"],)
            return MetricsSpec(specs, "cosine_mean")
        return super()._metrics(data)

    def score(self, predictions: list, labels: list, truth: list | None = None) -> dict:
        scores = super().score(predictions, labels, truth)
        if self.pairs and truth is not None:
            scores.update(pair_metrics.score([p["output"] for p in predictions], truth))
        return scores

    def predictions(self, outputs) -> list:
        if self.kind == "feature-extraction":  # no class axis: the vector is the output
            return embedding_predictions(outputs)
        return super().predictions(outputs)

    def same_outputs(self, a, b) -> list[bool]:
        """Parity of two conversions: identical argmax for a classifier, cosine >= 0.9999 for an
        embedding (rounded vectors compared exactly would flag float noise)."""
        a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
        if self.kind == "sequence-classification":
            return list(a.argmax(-1) == b.argmax(-1))
        cos = (a * b).sum(-1) / np.maximum(np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1),
                                            1e-300)
        return list(cos >= COSINE_PARITY)

    def margins(self, outputs) -> list[float]:
        if self.kind == "feature-extraction":
            return [0.0] * len(outputs)
        return super().margins(outputs)


def _preload(model_type: str) -> None:
    """Every stage of this task builds it, and building it imports transformers' auto classes and
    the model type's code (seconds per child process, beyond torch and transformers themselves,
    which the forkserver preloads anyway): the forkserver imports them once for all children."""
    from transformers.models.auto.configuration_auto import model_type_to_module_name

    from pipeline.core import isolate

    mod = model_type_to_module_name(model_type)
    isolate.preload(["transformers.models.auto.modeling_auto",
                     "transformers.models.auto.tokenization_auto",
                     f"transformers.models.{mod}.modeling_{mod.rpartition('.')[2]}"])


def encode(tokenizer, texts: list[str], max_length: int, input_names) -> list[dict]:
    """Each text tokenized alone (truncated to ``max_length``): int64 arrays per input. The
    evaluation's samples and a server's requests both come through here."""
    enc = tokenizer(texts, truncation=True, max_length=max_length)
    return [{n: np.asarray(enc[n][k], dtype=np.int64) for n in input_names}
            for k in range(len(texts))]


def collate(samples: list[dict], input_names, pad_token_id: int | None) -> dict:
    """Pad to the batch's longest sequence: input ids with the pad token, the rest with 0."""
    length = max(len(s["input_ids"]) for s in samples)
    pad = {"input_ids": pad_token_id or 0}
    return {n: np.stack([np.pad(s[n], (0, length - len(s[n])), constant_values=pad.get(n, 0))
                         for s in samples]) for n in input_names}


def embedding_predictions(outputs) -> list:
    """An embedding's predictions: the vector, rounded (what the output-hash ledger hashes)."""
    return [{"decision": None, "output": np.round(row.astype(np.float64), 6).tolist()}
            for row in np.asarray(outputs)]


def _keys(entries) -> list[str]:
    """Key names from transformers' loading info (names, or tuples that start with the name)."""
    return [e if isinstance(e, str) else str(e[0]) for e in (entries or [])]


def _every_input_taken(model: Path, names: tuple, config) -> None:
    """The exporter drops an input the network never reads: a tokenizer that also makes
    ``token_type_ids`` for a model that takes none (DistilBERT's saved with a generic tokenizer
    config) would then be fed a name the ONNX model does not have, in every later stage."""
    import onnx

    taken = {i.name for i in onnx.load(str(model), load_external_data=False).graph.input}
    unused = [n for n in names if n not in taken]
    if unused:
        arch = (getattr(config, "architectures", None) or [config.model_type])[0]
        raise StageError(f"the tokenizer makes {', '.join(unused)}, which {arch} does not read: "
                         "list only the model's inputs in tokenizer_config.json's "
                         f"model_input_names (e.g. {[n for n in names if n in taken]})")
