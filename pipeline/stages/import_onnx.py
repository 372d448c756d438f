"""import: an ONNX file the user brings, taken in as the export would have made it.

In: the task key and the file (``model=onnx model.path=...``) with its sha256. Out: ``model.onnx``
in the artifact: the file as given, its opset upgraded to 13 when lower (per-channel QDQ needs
13: a per-channel model at opset 12 is invalid) with onnx's version converter, external data
loaded from the model's own folder only and saved inside the model. Declarations the task
found untrue by running the graph (``pipeline.models.onnx_file``) are corrected: an input batch
fixed at 1 becomes dynamic when the graph ran at batch 2 (one that fails there keeps its batch of
1, and the run feeds it a sample at a time), outputs are declared as the graph returns them
(``redeclared`` in the stage's record). Parity: the upgraded model against the file as
given (at batch 1 when it fixes its batch), on real samples, must agree (max output difference
within ``tolerance``, identical predictions); there is no torch network, so no torch parity.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pipeline.core.errors import StageError
from pipeline.engine.runner import CHECKS_ONLY
from pipeline.stages._parity import compare, node_counts, require

MIN_OPSET = 13


@dataclass(frozen=True)
class ImportOnnx:
    task: object           # the task's key (a Source of kind onnx)
    path: str
    sha256: str            # of the file and its external data: a replaced one is a new artifact
    data: object           # DataSplit: the samples parity is checked on
    hardware: object = field(metadata=CHECKS_ONLY)  # runs its checks: not in the key
    # (name, size, mtime_ns, inode) of each file when the run hashed them (pipeline.models.run):
    # unchanged means the bytes are the ones in the key, without hashing the file again; empty:
    # hash again and compare. Not in the key: the digest is.
    stamp: tuple = field(default=(), metadata=CHECKS_ONLY)
    tolerance: float = 1e-3
    name = "import"
    version = 2  # 2: a fixed batch of 1 made dynamic, outputs declared as the graph runs
    hardware_dependent = False

    def run(self, parent, out_dir: Path) -> dict:
        import onnx
        from onnx import version_converter

        from pipeline.runtimes import onnxruntime as ort
        from pipeline.models import task
        from pipeline.core.userfiles import stamp_of
        from pipeline.models.files import onnx_digest as digest
        from pipeline.models.files import onnx_files

        t = task(self.task)
        # external data inside the model's folder, and the bytes the key was made from
        if (stamp_of(onnx_files(self.path)) != self.stamp if self.stamp
                else digest(self.path) != self.sha256):
            raise StageError(f"model.path={self.path} (or its external data) changed since the "
                             "run started; run again")
        model = onnx.load(self.path)  # external data from the model's folder (checked above)
        before = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
        after = before
        if before < MIN_OPSET:
            try:
                model = version_converter.convert_version(model, MIN_OPSET)
            except Exception as e:  # noqa: BLE001 - the converter's errors are long; keep one line
                raise StageError(f"model.path={self.path}: opset {before} cannot be upgraded to "
                                 f"{MIN_OPSET} ({type(e).__name__}: "
                                 f"{str(e).splitlines()[0][:200]})") from None
            after = MIN_OPSET
        fixed = getattr(t, "fixed_batch", ())
        # a graph that fails at batch 2 keeps its batch of 1 declared: what it can run
        dynamic = () if t.max_batch == 1 else fixed
        changed = {}
        if dynamic or getattr(t, "learned_outputs", False):  # what running the graph showed
            from pipeline.models.onnx_file import redeclared

            redeclared(model, dynamic, t.outputs)
            changed = {"batch_made_dynamic": list(dynamic),
                       "outputs": {o.name: list(o.shape) for o in t.outputs}}
        target = out_dir / "model.onnx"
        onnx.save(model, str(target))
        onnx.checker.check_model(str(target))
        ds = t.dataset(self.data)
        given = ort.session(Path(self.path), self.hardware)
        taken = ort.session(target, self.hardware)
        # the file as given runs only the batch it declares
        parity = compare(lambda f: ort.run(given, f), lambda f: ort.run(taken, f), t, ds,
                         batch_size=1 if fixed else 16)
        require(parity, self.tolerance, f"the opset {before} -> {after} upgrade"
                f"{' and the corrected declarations' if changed else ''} changed outputs")
        return {"opset": after, "opset_given": before, "source": self.path,
                "source_sha256": self.sha256, "parity_vs_file": parity, "redeclared": changed,
                "nodes": node_counts(target)}
