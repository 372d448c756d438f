"""Metrics any model can be scored with, each with its direction (``spec.MetricSpec``): classifier
top-k (``classification``), CTC text recognition with the user's character set (``ctc``), and,
without labels, agreement with the FP16 baseline's outputs (``agreement``) or its detections
(``detection``: a detector's head decoded into boxes), and Spearman's rho of
sentence pairs against gold similarity scores (``pairs``), and a decoder's perplexity and
next-token agreement with FP32 (``generation``). ``outputs`` hashes decoded outputs and
compares two evaluations."""
from pipeline.metrics import agreement, classification, ctc, detection, generation, pairs

SPECS = {**classification.SPECS, **ctc.SPECS, **agreement.SPECS, **detection.SPECS, **pairs.SPECS,
         **generation.SPECS}
