"""What is served: a registry ref pulled and verified, a pulled folder, or a run's folder.

In: ``REF`` as the user gives it: a folder holding ``model.onnx`` and ``manifest.json`` (what
``pipeline.registry pull`` writes), a run's folder (``artifacts/runs/latest``: its
``report.json`` names the candidate's cached model), or a registry ref (``ocr:production``),
pulled as ``pipeline.registry pull`` pulls it, every blob re-hashed (a run's cached candidate
is re-hashed too). Out: a ``Served``: the model file, the task that reads its inputs and outputs,
the preprocessing its evaluation used (the ``serving`` section the run recorded) and the
output-hash ledger of that evaluation.

The recorded preprocessing is compared with what this code's task does now: an artifact whose
evaluation fed the model differently is refused, never served with other inputs than it was
gated on. Served: the built-in OCR tasks (``from_image``), Hugging Face encoders whose run
recorded a text spec (``serving``: the tokenizer files, shipped beside the model and re-hashed
here, its ``max_length``, the outputs' decoding), and the user's own models of one image input or
of array inputs whose run recorded their spec (the ``data.image`` steps or each input's dtype and
shape, and the output's decoding, whole in the record); any other is one line saying so.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path

from pipeline.core.errors import ConfigError, StageError
from pipeline.runtimes.record import Deployed
from pipeline.task import serving
from pipeline.task.serving import BuiltinImage, ImageInput, ArrayInputs, Serving, TextInput


@dataclass(frozen=True)
class Served:
    ref: str                   # what the user named
    model: Path                # the ONNX file
    model_name: str            # model.name
    reader_key: object         # how requests are read (pipeline.serve.readers.reader)
    spec: Serving | None       # what the evaluation fed the model (task.serving_spec())
    output_sha256: str | None  # the evaluation's output-hash ledger
    evaluation_set: str | None # the digest of the split it was computed on
    runtime: Deployed          # the runtime, precision and hint the gate judged
    kind: str = "predict"      # predict: one answer per request; generate: a decoder's stream
    target_ms: float | None = None  # the p99 target its gate judged (slo.p99_ms), if it did
    # the model's time per request as its gate's benchmark measured it: the p50 at the smallest
    # batch timed, per sample, on runtime.intra_op_threads threads (None: not recorded)
    latency_ms: float | None = None
    # the exact version served, NAME:VERSION@sha256:... (what an alias such as ocr:production
    # pointed at when the server pulled it; an alias moves, this does not), named in every
    # answer; NAME:VERSION alone for a folder that is no longer what was pulled; None for a run
    # that published nothing or a manifest that names no version
    version: str | None = None

    @cached_property
    def max_batch(self) -> int | None:
        """1 when an input of the model declares a batch of 1 (its run kept it: the graph
        fails at batch 2, ``pipeline.task.batch_limit``), else None: any batch."""
        if self.kind != "predict":
            return None
        import onnx

        graph = onnx.load(str(self.model), load_external_data=False).graph
        weights = {i.name for i in graph.initializer}
        for i in graph.input:
            dims = i.type.tensor_type.shape.dim
            if i.name not in weights and dims and dims[0].HasField("dim_value") \
                    and dims[0].dim_value == 1:
                return 1
        return None

    @property
    def named(self) -> str:
        """The ref as the user gave it, then the exact version where that says more (the start-up
        line): ``ocr:production = ocr:int8-...@sha256:...``."""
        return self.ref if self.version in (None, self.ref) else f"{self.ref} = {self.version}"

    @property
    def what(self) -> str:
        """What the server reads and answers, in words (its start-up line)."""
        if self.kind == "generate":
            return "a decoder"
        if isinstance(self.spec, BuiltinImage):
            return f"task {self.reader_key}"
        return self.spec.describe()


def open_ref(ref: str, pulled_into: Path, overrides: list[str] | None = None) -> Served:
    """``ref`` as a folder if one exists there, else as a registry ref pulled into
    ``pulled_into`` (a new folder)."""
    if not ref.strip():
        raise ConfigError("REF is empty: name a registry ref (ocr:production), a pulled folder "
                          "or a run's folder")
    path = Path(ref)
    if path.is_dir():
        if (path / "manifest.json").is_file():
            return _record(path / "manifest.json", lambda record: _from_manifest(
                ref, path / "model.onnx", record))
        if (path / "report.json").is_file():
            return _record(path / "report.json", lambda record: _from_report(ref, record))
        raise ConfigError(f"{ref}: a folder without manifest.json (a pull) or report.json "
                          "(a run)")
    if ":" not in ref and "@" not in ref:
        raise ConfigError(f"{ref}: neither a folder nor a registry ref (NAME:REF, e.g. "
                          "ocr:production)")
    return pulled(ref, pulled_into, registry(overrides or []))


def registry(overrides: list[str]):
    """The registry backend the overrides name (``registry=oci registry.url=...``)."""
    from pipeline.engine.compose import compose
    from pipeline.registry import open_backend

    cfg = compose(overrides).registry
    if cfg is None:
        raise ConfigError("registry=null: there is no registry to pull from")
    return open_backend(cfg)


def pulled(ref: str, dest: Path, backend, digest: str | None = None) -> Served:
    """The registry ref ``ref`` pulled into ``dest`` (a new folder), every blob re-hashed, and
    read; ``digest``: the version to pull, what ``ref`` resolved to when it was looked up (an
    alias that moves meanwhile does not change what is pulled)."""
    from pipeline.registry.names import parse_ref

    name, version = parse_ref(ref)
    entry, path = backend.pull(name, digest or version, dest)
    exact = f"{entry.name}:{entry.version}@{entry.digest}"
    print(f"pulled {exact} into {path}", flush=True)
    model, manifest = Path(path) / "model.onnx", Path(path) / "manifest.json"
    return _record(manifest, lambda record: _from_manifest(ref, model, record, exact))


def _record(path: Path, read):
    """``read(the JSON object in path)``; a file that is not one, or lacks what the pipeline
    writes there (edited by hand, cut short, written by another tool), is one line naming it."""
    try:
        record = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise StageError(f"{path}: not valid JSON ({e}): damaged or cut short; pull or run "
                         "again") from None
    if not isinstance(record, dict):
        raise StageError(f"{path}: a JSON {type(record).__name__}, not the object the pipeline "
                         "writes there")
    try:
        return read(record)
    except (KeyError, TypeError, AttributeError, StopIteration) as e:
        raise StageError(f"{path}: lacks what the pipeline records there ({type(e).__name__}: "
                         f"{e}); was it edited, or written by another version?") from None


def _from_manifest(ref: str, model: Path, manifest: dict, version: str | None = None) -> Served:
    """``version``: what a pull just verified; else the folder's own (``pulled_version``)."""
    if not model.is_file():
        raise StageError(f"{ref}: no model.onnx beside its manifest")
    metrics = manifest.get("metrics") or {}
    return replace(_served(ref, model, manifest["config"], manifest.get("serving"),
                           metrics.get("output_sha256"), manifest.get("evaluation_set"),
                           Deployed.read((manifest.get("runtime") or {}).get("deployed"),
                                         manifest["config"].get("hardware")),
                           model.parent), latency_ms=per_sample(manifest.get("latency")),
                   version=version or pulled_version(model.parent, manifest))


def pulled_version(folder: Path, manifest: dict) -> str | None:
    """NAME:VERSION@sha256:... of a pulled folder: the version's name from its manifest, and its
    digest, the sha256 of the OCI manifest every backend's pull writes beside it (the bytes the
    registry names the version by), once every file that manifest lists still has its digest;
    the name alone, and why, where the folder is no longer what was pulled (or never was one)."""
    from pipeline.core.artifact import sha256_file
    from pipeline.registry.transfer import OCI_MANIFEST, not_a_pull_of

    name, version = manifest.get("name"), manifest.get("version")
    if not (isinstance(name, str) and isinstance(version, str)):
        return None
    why = not_a_pull_of(folder, name)
    if why is not None:
        print(f"serve: {folder} {why}: its answers name {name}:{version} without a digest")
        return f"{name}:{version}"
    return f"{name}:{version}@sha256:{sha256_file(folder / OCI_MANIFEST)}"


def _from_report(ref: str, report: dict) -> Served:
    if report.get("status") != "complete" or "candidate" not in report.get("lineage", {}):
        raise StageError(f"{ref}: the run did not complete (status {report.get('status')!r}); "
                         "nothing to serve")
    from pipeline.core.artifact import Artifact

    if not (report.get("verdict") or {}).get("passed"):  # what was never published is not served
        raise StageError(f"{ref}: the run's gate did not pass "
                         f"({(report.get('verdict') or {}).get('summary', 'no verdict')}); "
                         "nothing of it was published, so nothing is served")
    lineage = report["lineage"]["candidate"]
    model = Path(lineage["path"]) / "model.onnx"
    if not model.is_file():
        raise StageError(f"{ref}: the candidate's model {model} is gone (make clean-cache?); "
                         "run the pipeline again or serve a registry ref")
    # re-hashed as a pull re-hashes: the cache entry must still be the one the run gated
    if Artifact.read(Path(lineage["path"])).digest != lineage["digest"]:
        raise StageError(f"{ref}: the candidate in the cache is not the one the run gated "
                         f"(digest {lineage['digest'][:12]}); run the pipeline again")
    cand = next(r for r in report["rows"] if r["role"] == "candidate")
    model_path = report["config"]["model"].get("path")
    return replace(_served(ref, model, report["config"], report.get("serving"),
                           cand.get("output_sha256"), None,
                           Deployed.read((report.get("runtimes") or {}).get("deployed"),
                                         report["config"].get("hardware")),
                           Path(model_path) if model_path else None),
                   latency_ms=per_sample(cand.get("latency")), version=published_as(report))


def published_as(report: dict) -> str | None:
    """NAME:VERSION@sha256:... the run published its candidate as; None when it published
    nothing (no registry, or publishing failed). The report records the ref followed by where
    it went (``ocr:int8-...@sha256:... (local artifacts/registry)``); one written before the
    ``publish`` record has only ``published``, set once publishing succeeded."""
    publish = report.get("publish")
    if isinstance(publish, dict):
        ref = publish.get("ref") if publish.get("status") == "published" else None
    else:
        ref = report.get("published")
    return ref.split(" ", 1)[0] if isinstance(ref, str) and ref.strip() else None


def per_sample(latency) -> float | None:
    """The p50 per sample at the smallest batch a benchmark timed (``{"1": {"p50": ms}}``), or
    None when the record holds none (an older run, a decoder)."""
    try:
        batch = min(int(b) for b in latency)
        ms = float(latency[str(batch)]["p50"]) / batch
    except (TypeError, ValueError, KeyError, AttributeError):
        return None
    return ms if 0 < ms < float("inf") else None


def _served(ref, model, config: dict, spec: dict | None, ledger, eval_set, runtime,
            files: Path | None) -> Served:
    """``files``: where the files the spec names are (a pull's folder, or the run's model.path)."""
    served = _served_as(ref, model, config, _spec(ref, spec), ledger, eval_set, runtime, files)
    # the target its gate judged: a run that did not check it (gate.check_slo_p99=false) was
    # not held to one, and neither is its server
    target = (config.get("slo") or {}).get("p99_ms")
    judged = (config.get("gate") or {}).get("check_slo_p99", True)
    return replace(served, target_ms=float(target) if target and judged else None)


def _spec(ref: str, record: dict | None) -> Serving | None:
    """The recorded serving spec, typed; one this code cannot read (a key it lacks: a record
    written by another version, or edited) is one line, as for a built-in task whose
    preprocessing changed, rather than a reader that fails in every worker."""
    from pipeline.core.errors import PipelineError

    try:
        return serving.read(record)
    except (KeyError, TypeError, ValueError, PipelineError) as e:
        # PipelineError: a recorded data.image step this code's checks refuse, which says why
        cause = str(e) if isinstance(e, PipelineError) else f"{type(e).__name__}: {e}"
        raise ConfigError(f"{ref}: its evaluation's preprocessing cannot be rebuilt by this code "
                          f"({cause}); serve it with the version that built it") from None


def _served_as(ref, model, config: dict, spec: Serving | None, ledger, eval_set, runtime,
               files: Path | None) -> Served:
    from pipeline.models import TASKS, task

    source = config["model"]["source"]
    if (Path(model).parent / "genai_config.json").is_file():  # an onnxruntime-genai decoder
        return Served(ref, Path(model), config["model"]["name"], None, None, ledger, eval_set,
                      runtime, kind="generate")
    if isinstance(spec, TextInput):
        return Served(ref, Path(model), config["model"]["name"], _text_key(ref, spec, files),
                      spec, ledger, eval_set, runtime)
    if isinstance(spec, (ImageInput, ArrayInputs)):  # the user's own model: the spec is its key
        return Served(ref, Path(model), config["model"]["name"], spec, spec, ledger, eval_set,
                      runtime)
    if source not in TASKS:
        raise ConfigError(f"{ref}: model.source={source}: its run recorded no serving spec (an "
                          "image input beside others, or a run older than serving); the server "
                          "reads the built-in tasks, Hugging Face encoders and the user's own "
                          "models of one image input or of array inputs")
    current = task(source).serving_spec()
    if spec is None:  # published before runs recorded it: this code's preprocessing is assumed
        print(f"serve: {ref} records no preprocessing; serving with the task's own ({source})")
    elif spec != current:
        was, now = spec.to_dict(), current.to_dict()
        changed = sorted(k for k in set(was) | set(now) if was.get(k) != now.get(k))
        raise ConfigError(f"{ref}: its evaluation's preprocessing differs from this code's in "
                          f"{', '.join(changed)}; serve it with the version that built it")
    return Served(ref, Path(model), config["model"]["name"], source, current, ledger, eval_set,
                  runtime)


def _text_key(ref: str, spec: TextInput, folder: Path | None):
    """A text model's reader key, once every tokenizer file its evaluation used is found beside
    the model (or in the run's model folder) with the bytes it had then."""
    from pipeline.core.artifact import sha256_file
    from pipeline.serve.readers import TextKey

    if folder is None:
        raise StageError(f"{ref}: no folder holds its tokenizer files")
    for name, digest in sorted(spec.files.items()):
        path = folder / name
        if not path.is_file():
            raise StageError(f"{ref}: {path} is missing: the tokenizer its evaluation used "
                             "travels with the model; serve a registry ref or pull it again")
        if sha256_file(path) != digest:
            raise StageError(f"{ref}: {path} changed since the evaluation (sha256 "
                             f"{digest[:12]} then); serve the published version, whose files "
                             "are the evaluated ones")
    return TextKey(str(folder), spec)
