"""calibrate: activation ranges of the prepared model, from the calibration set, streamed.

In: a ``prepare`` artifact, a method (minmax, entropy, percentile) and the calibration set.
Out: ``calibration.json`` (onnxruntime's ``TensorsData``, which ``quantize_static`` reads back
through ``calibration_cache_path``) and the set's digest, which the artifact's digest covers; the
stage's peak memory and batch count, reported but not digested (``meta["observed"]``). The file is
written canonically (keys sorted): the calibrators' dict order differs between processes, and
equal ranges must give equal bytes, or a rebuilt calibration changes every key below it.

Why streamed: onnxruntime's histogram calibrators keep every intermediate output of every batch
until the end (3.5 GB on a real recognizer). Its calibrators merge ranges and histograms across
``collect_data`` calls, so this stage feeds them one batch per call and memory stays at one
batch's activations whatever the number of samples. Batches are bounded in padded pixels
(``batches(bounded=True)``): a larger set has wider lines, and a batch of 32 of them would
otherwise need more memory than any batch of a small set (measured: 1.14x at 1,024 vs 64 lines). Defaults (bins, percentile, symmetry) are
onnxruntime's own, so the ranges equal what ``quantize_static`` would have computed.
"""
from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.artifact import OBSERVED
from pipeline.core.env import peak_rss_mb
from pipeline.core.errors import StageError
from pipeline.quant.calibration import Feeds, ort_method




def write_ranges(ranges, path: Path) -> None:
    """onnxruntime's calibration cache format (``save_tensors_data``), with sorted keys."""
    import json

    from onnxruntime.quantization.calibrate import CalibrationCacheEncoder

    payload = {**ranges.to_dict(), "smooth_quant": False}
    path.write_text(json.dumps(payload, cls=CalibrationCacheEncoder, sort_keys=True))


@dataclass(frozen=True)
class Calibrate:
    data: object           # DataSplit: the calibration samples
    method: str
    batch_size: int
    # Batches per collect_data call: the memory bound. One, because the histogram calibrators
    # stack a call's outputs into one array, which fails when batch widths differ.
    chunk: int = 1
    name = "calibrate"
    version = 6  # 6: RSS and chunks observed, out of the digest; 5: the data split (with its digest) in the key; 4: calibration.json written with sorted keys
    hardware_dependent = False

    def run(self, parent, out_dir: Path) -> dict:
        from onnxruntime.quantization.calibrate import create_calibrator

        from pipeline.models import task

        t = task(self.data.task)
        ds = t.dataset(self.data)
        rss_before = peak_rss_mb()
        with tempfile.TemporaryDirectory() as tmp:  # the runner puts it inside out_dir
            calibrator = create_calibrator(str(parent.model), None,
                                           augmented_model_path=str(Path(tmp) / "augmented.onnx"),
                                           calibrate_method=ort_method(self.method))
            feeds, chunks = [], 0
            for batch in t.batches(ds, self.batch_size, sort=False, bounded=True):
                feeds.append(batch.feeds)
                if len(feeds) == self.chunk:
                    calibrator.collect_data(Feeds(feeds))
                    feeds, chunks = [], chunks + 1
            if feeds:
                calibrator.collect_data(Feeds(feeds))
                chunks += 1
            try:
                ranges = calibrator.compute_data()
            except ValueError as e:
                raise StageError(f"{self.method} calibration produced no ranges: {e}") from None
            del calibrator
        write_ranges(ranges, out_dir / "calibration.json")
        # The digest covers what quantize reads (the ranges, the set they came from); how it was
        # streamed and the memory it took are observations (artifact.OBSERVED), so an identical
        # calibration.json keeps its digest and quantize is reused.
        return {"method": self.method, "calibration_set": self.data.digest, "samples": len(ds),
                "tensors": len(list(ranges.keys())),
                OBSERVED: {"chunks": chunks, "peak_rss_mb": peak_rss_mb(),
                           "rss_before_mb": rss_before}}
