"""``model=hf`` with a decoder LLM: a local causal-LM folder or a GGUF file, and the text it is
scored on.

In: ``model.path`` (a folder written by ``save_pretrained`` whose ``config.json`` names a
``...ForCausalLM`` architecture, or a ``.gguf`` file), ``model.params.max_length`` and the
run's ``data=`` config. Out: ``Decoder`` (the folder, its content digest, its architecture) and
``TextSet`` (the evaluation or calibration text, tokenized once in the parent by the folder's
own tokenizer into a file named by its sha256, which is part of every stage key that reads it).

Which folders are decoders: ``pipeline.config.decoder_files.is_decoder`` (an architecture ending
in ``ForCausalLM`` or a model type onnxruntime-genai's model builder exports); which of those
are compiled: the
builder's text decoders (``ARCHITECTURES``), anything else is refused in one line. The folder
keeps the encoders' rules: safetensors only (a pickle is refused, never read) and no file it
names outside it (``pipeline.models.files``, ``pipeline.core.userfiles``).

A GGUF file is converted once, tensor by tensor (``pipeline.models.gguf_stream``: dequantized
by the ``gguf`` package, renamed and re-laid out by transformers' GGUF tables, never the whole
model in memory), into a folder of FP32 safetensors shards under
``<workdir>/cache/gguf/<sha256 of the file>``, without ``quantization_config``. The conversion
runs in a child process and is written to a temporary folder renamed into place.
"""
from __future__ import annotations

import contextlib
import io
import json
import math
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

from pipeline.config.decoder_files import MODEL_TYPES, folder_config as _config, is_gguf
from pipeline.core.errors import ConfigError, StageError

# The text decoders onnxruntime-genai 0.18's model builder exports (its create_model's list, less
# the vision, audio, MoE and speculative-decoding variants, which need more than one ONNX file).
ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                 "GemmaForCausalLM", "Gemma2ForCausalLM", "Gemma3ForCausalLM", "PhiForCausalLM",
                 "Phi3ForCausalLM", "GraniteForCausalLM", "OlmoForCausalLM",
                 "NemotronForCausalLM", "SmolLM3ForCausalLM", "InternLM2ForCausalLM",
                 "Ernie4_5ForCausalLM")
DEFAULT_MAX_LENGTH = 256  # tokens per scored sequence: long enough for perplexity, cheap to run


@dataclass(frozen=True)
class Decoder:
    folder: str        # the Hugging Face folder the builder reads (a GGUF file's cached copy)
    digest: str        # its content digest: every stage key holds it
    architecture: str
    given: str         # what the user named (model.path)


def check_folder(folder: Path, key: str) -> Decoder:
    """A decoder folder the builder exports: its architecture, safetensors weights, a tokenizer
    and no file outside it; one line otherwise."""
    from pipeline.core import userfiles
    from pipeline.models.files import hf_files
    from pipeline.models.hf_folder import TOKENIZER_FILES

    cfg = _config(folder)
    if not cfg:
        raise ConfigError(f"{key}: no readable config.json (expected a Hugging Face model folder "
                          "written by save_pretrained)")
    archs = [a for a in cfg.get("architectures") or [] if isinstance(a, str)]
    if not archs:  # the builder picks its exporter by architectures[0]: it has none to read
        kind = cfg.get("model_type")
        hint = dict(zip(MODEL_TYPES, ARCHITECTURES)).get(kind, "...ForCausalLM")
        raise ConfigError(f"{key}: config.json names no architectures (model_type {kind}); "
                          "onnxruntime-genai's model builder reads architectures[0]: add "
                          f'"architectures": ["{hint}"] (save_pretrained writes it)')
    arch = archs[0]
    if arch not in ARCHITECTURES:
        raise ConfigError(f"{key}: architecture {arch} is not among the text decoders this "
                          "pipeline compiles with onnxruntime-genai's model builder "
                          f"(supported: {', '.join(ARCHITECTURES)})")
    digest = userfiles.digest(folder, key)  # first: it refuses links out of the folder
    hf_files(folder, key)  # safetensors only, the files it names inside it
    if not any((folder / f).is_file() for f in TOKENIZER_FILES):
        raise ConfigError(f"{key}: no tokenizer (none of {', '.join(TOKENIZER_FILES)}); save it "
                          "with tokenizer.save_pretrained into the same folder")
    return Decoder(str(folder.resolve()), digest, arch, key.partition("=")[2])


def resolve(path: str, workdir: str | Path) -> Decoder:
    """The decoder behind ``model.path``: the folder itself, or a GGUF file's cached FP32 copy
    (converted now if not cached yet)."""
    p = Path(path)
    key = f"model.path={path}"
    if is_gguf(p):
        if not p.is_file():
            raise ConfigError(f"{key}: {'not a file' if p.exists() else 'no such file'} (a GGUF "
                              "file is converted once into an FP32 folder)")
        folder = gguf_folder(p, Path(workdir) / "cache" / "gguf")
        return Decoder(**{**check_folder(folder, key).__dict__, "given": str(path)})
    if not p.is_dir():
        raise ConfigError(f"{key}: {'not a folder' if p.exists() else 'no such folder'} "
                          "(model=hf takes a local Hugging Face model folder or a .gguf file)")
    return check_folder(p, key)


def context(decoder: Decoder) -> int:
    """The decoder's context in tokens: ``config.json``'s ``max_position_embeddings``, within its
    sliding attention window if it declares one (``sliding_window``)."""
    folder = Path(decoder.folder)
    positions = int(_config(folder).get("max_position_embeddings", 2048))
    window = sliding_window(folder)
    return min(positions, window) if window else positions


def sliding_window(folder: Path) -> int | None:
    """The attention window ``config.json`` declares (Mistral, Phi-3, Gemma 2 and 3), or None
    (none, or turned off: Qwen2's ``use_sliding_window: false``). Inside the window every token
    attends to its whole past, so a model scored, gated and served within it computes what
    transformers does; past it, the model builder's export of Mistral and Phi-3 attends to
    everything (no local window in its attention), which transformers does not: measured on a
    tiny Mistral with a 128-token window, logits 11.8 apart at 250 tokens, 1e-5 within 128."""
    config = _config(folder)
    window = config.get("sliding_window")
    if not isinstance(window, int) or isinstance(window, bool) or window <= 0 \
            or config.get("use_sliding_window") is False:
        return None
    return window


def cap_context(folder: Path, tokens: int) -> None:
    """The built folder's ``genai_config.json`` limited to ``tokens`` positions (its context and
    its search's max_length): what is published is never run past what was checked."""
    import json

    path = folder / "genai_config.json"
    config = json.loads(path.read_text())
    model, search = config.setdefault("model", {}), config.setdefault("search", {})
    for holder, key in ((model, "context_length"), (search, "max_length")):
        holder[key] = min(int(holder.get(key) or tokens), tokens)
    path.write_text(json.dumps(config, indent=4))


def max_length(params: dict, context: int) -> int:
    """Tokens per scored sequence: ``model.params.max_length`` (a whole number, checked at
    compose), else ``DEFAULT_MAX_LENGTH``, within the context; one line otherwise."""
    n = int(params.get("max_length", min(DEFAULT_MAX_LENGTH, context)))
    if not 2 <= n <= context:
        raise ConfigError(f"model.params.max_length={n}: must be in 2..{context} (the "
                          "model's context, or its sliding attention window)")
    return n


def lengths(q, params: dict, context: int) -> None:
    """Before any stage: decode timing generates ``q.new_tokens`` after prompts of up to
    ``q.prompt_tokens`` tokens cut from the scored sequences, and onnxruntime-genai refuses a
    generation longer than the context, which would otherwise be found in the last stage."""
    longest = min(q.prompt_tokens, max_length(params, context))
    if longest + q.new_tokens > context:
        raise ConfigError(f"quant.decoder.new_tokens={q.new_tokens}: after prompts of up to "
                          f"{longest} tokens (quant.decoder.prompt_tokens, "
                          f"model.params.max_length) that is {longest + q.new_tokens} positions; "
                          f"the model's context is {context} (config.json "
                          "max_position_embeddings, or its sliding_window)")


def gguf_folder(path: Path, cache: Path) -> Path:
    """The FP32 folder a GGUF file converts to, cached by the file's sha256."""
    from pipeline.core import isolate
    from pipeline.core.artifact import sha256_file

    final = cache / sha256_file(path)
    if (final / "config.json").is_file():
        return final
    cache.mkdir(parents=True, exist_ok=True)
    tmp = cache / f".tmp-{final.name[:16]}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        isolate.call(f"GGUF conversion of {path.name}", _convert, str(path.resolve()), str(tmp))
        try:
            tmp.rename(final)
        except OSError:  # converted meanwhile by a concurrent run: theirs is the same
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def _convert(path: str, out: str) -> None:
    """In a child: the GGUF file, tensor by tensor (``pipeline.models.gguf_stream``), into
    ``out``."""
    from pipeline.models.gguf_stream import convert
    from pipeline.models.hf_folder import offline

    offline()
    # transformers also reads tokenizer.json, tokenizer_config.json, config.json... from the
    # GGUF's folder (following links anywhere), none of them in the cache key (the GGUF's
    # sha256): it is shown a folder of its own holding only a link to the GGUF, so that what is
    # converted is the GGUF and nothing beside it
    alone = Path(out).parent / (Path(out).name + "-src")
    alone.mkdir()
    name = "model.gguf"
    (alone / name).symlink_to(path)
    try:
        # the GGUF reader draws its own progress bar, which no logging setting silences
        with contextlib.redirect_stderr(io.StringIO()):
            convert(path, str(alone), name, out)
    except Exception as e:  # noqa: BLE001 - a file transformers cannot read: one line
        raise StageError(f"model.path={path}: transformers cannot read this GGUF file "
                         f"({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''})"
                         ) from None
    finally:
        shutil.rmtree(alone, ignore_errors=True)


@dataclass(frozen=True)
class TextSet:
    """Text the decoder is scored on: the data's text column tokenized once by the folder's own
    tokenizer (each row one sequence of at most ``max_length`` tokens; rows with fewer than two
    tokens score nothing and are dropped), kept as a JSON file named by its sha256 so that a
    stage's child reads ids instead of loading the data set and the tokenizer again."""
    path: str          # <workdir>/cache/tokens/<sha256>.json
    sha256: str        # of that file: every stage key that reads it holds it
    split: str         # evaluation | calibration
    sequences: int

    def token_ids(self) -> list[list[int]]:
        from pipeline.core.artifact import sha256_file

        if sha256_file(Path(self.path)) != self.sha256:
            raise StageError(f"{self.path}: the tokenized {self.split} text changed since it "
                             "was written (rerun to rebuild it)")
        return json.loads(Path(self.path).read_text())


# 95 % of a normal interval: the half-width of a share measured on n positions is at most
# Z95 * 50 / sqrt(n) points (at a share of one half, the widest)
Z95 = 1.96


def scored_tokens(text: TextSet) -> int:
    """Positions scored: a sequence of n tokens predicts n - 1 of them."""
    return sum(len(s) - 1 for s in text.token_ids())


def enough_text(evaluation: TextSet, agreement_limit: float | None, key: str) -> None:
    """Before any stage: the evaluation text must be long enough for the gate to tell its
    budget from noise. Top-1 agreement on n scored tokens is uncertain by up to
    +-Z95 * 50 / sqrt(n) points; where that is wider than its limit, a candidate passes or fails
    by which tokens happened to be drawn (one 38-token sequence: +-15.9 points against a limit
    of 10), so it is refused in one line naming how many tokens it needs. A limit of 0 asks for
    exact agreement, which any count can refute: not refused."""
    if not agreement_limit or agreement_limit <= 0:
        return
    n = scored_tokens(evaluation)
    need = math.ceil((Z95 * 50 / agreement_limit) ** 2)
    if n < need:
        raise ConfigError(
            f"{key}: the evaluation text scores {n} tokens in {evaluation.sequences} "
            f"sequence{'s' if evaluation.sequences != 1 else ''}; top-1 agreement on {n} tokens is "
            f"uncertain by up to +-{Z95 * 50 / math.sqrt(max(n, 1)):.1f} points (95 %), wider "
            f"than its limit of {agreement_limit:g} points (gate.max_accuracy_drop): score at "
            f"least {need} tokens (more or longer rows: data.evaluation_samples, "
            "model.params.max_length)")


def _token_file(ids: list[list[int]], cache: Path, split: str) -> TextSet:
    import hashlib

    data = json.dumps(ids, separators=(",", ":")).encode()
    sha = hashlib.sha256(data).hexdigest()
    path = cache / f"{sha}.json"
    if not path.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        tmp = cache / f".tmp-{sha[:16]}-{uuid.uuid4().hex[:8]}"
        tmp.write_bytes(data)
        tmp.replace(path)
    return TextSet(str(path), sha, split, len(ids))


@dataclass(frozen=True)
class TextSets:
    """A run's text: what it is scored on, what calibrates GPTQ, and the first evaluation
    sequences (the mixed search's cheap ranking when there is no calibration text)."""
    evaluation: TextSet
    calibration: TextSet
    ranking: TextSet


def text_sets(decoder: Decoder, data_cfg, params: dict, context: int,
              workdir: str | Path, ranking: int = 4) -> TextSets:
    """The evaluation and calibration text of a run, tokenized, and the first ``ranking``
    evaluation sequences (the mixed search's cheap sensitivity trials); one line for data that
    has no text, or too little of it."""
    from pipeline.data.load import load
    from pipeline.models.hf_folder import folder_tokenizer

    if data_cfg is None:
        raise ConfigError("data= is required for a decoder: perplexity is measured on your text "
                          "(e.g. data=jsonl data.path=text.jsonl data.input_column=text)")
    data = load(data_cfg)
    if data_cfg.input_column not in data.dataset.column_names:
        raise ConfigError(f"data.input_column={data_cfg.input_column}: not a column of "
                          f"{data_cfg.path} (columns: {', '.join(data.dataset.column_names)})")
    longest = max_length(params, context)
    tok = folder_tokenizer(Path(decoder.folder))
    cache = Path(workdir) / "cache" / "tokens"
    ids = {}
    for split, rows in (("evaluation", data.evaluation), ("calibration", data.calibration)):
        texts = [str(t) for t in data.dataset.select(rows)[data_cfg.input_column]]
        tokens = tok(texts, truncation=True, max_length=longest)["input_ids"] if texts else []
        ids[split] = [list(map(int, s)) for s in tokens if len(s) >= 2]
    if not ids["evaluation"]:
        raise ConfigError(f"data.path={data_cfg.path}: no evaluation row of "
                          f"{data_cfg.input_column} has two tokens: nothing to score")
    return TextSets(_token_file(ids["evaluation"], cache, "evaluation"),
                    _token_file(ids["calibration"], cache, "calibration"),
                    _token_file(ids["evaluation"][:ranking], cache, "ranking"))
