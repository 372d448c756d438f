"""The OCR task with a mobile network: MobileNetV3-style blocks instead of CRNN's plain convs.

Everything but the network is the ``ocr`` task's (the same generator, calibration and
evaluation sets under ``<data_dir>/ocr/``, batching, CTC decoding, margins and metrics), so the
two networks are scored on the same lines. ``build_network`` builds ``ocr_mobile_net.MobileCRNN``
(depthwise convs, HardSwish/HardSigmoid, squeeze-excite), whose op mix is where onnxruntime's
default static INT8 is slower than FP32 on a CPU.
"""
from __future__ import annotations

from pipeline.models.ocr.crnn import (GENERATOR_VERSION, INPUT_NAME, METRICS, NAME, OUTPUT_NAME,
                                 PRIMARY_METRIC, SEEDS, batches, build_with, dataset, decode,
                                 example_input, from_image, margins, metrics, sample_digest,
                                 sample_hashes, serving_spec, stack)

__all__ = ["GENERATOR_VERSION", "INPUT_NAME", "METRICS", "NAME", "OUTPUT_NAME", "PRIMARY_METRIC",
           "SEEDS", "batches", "build_network", "dataset", "decode", "example_input", "from_image",
           "margins", "metrics", "sample_digest", "sample_hashes", "serving_spec", "stack"]


def build_network(widths, hidden, weights: dict | None = None):
    from pipeline.models.ocr.mobile_net import MobileCRNN

    return build_with(MobileCRNN, widths, hidden, weights)
