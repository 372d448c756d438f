"""The YOLO zoo entries' parity check (benchmarks/zoo/ultralytics_entry.py): each reference box
paired with the nearest of the pipeline's, so near-tied scores listed in another order still
agree, while a missing, extra or reclassified detection does not."""
from __future__ import annotations

import pytest

from benchmarks.zoo.ultralytics_entry import paired


def test_boxes_pair_with_their_nearest_whatever_their_order():
    ref = [[10, 10, 50, 20], [10, 30, 50, 40], [60, 10, 90, 20]]
    mine = [(0, [10.2, 30, 50, 40.4]), (0, [10, 10, 50, 20]), (1, [60, 10.9, 90, 20])]
    assert paired(mine, ref, [0, 0, 1]) == pytest.approx(0.9)
    assert paired([], [], []) == 0.0


def test_a_missing_extra_or_reclassified_detection_is_no_match():
    ref, classes = [[10, 10, 50, 20], [60, 10, 90, 20]], [0, 1]
    assert paired([(0, [10, 10, 50, 20])], ref, classes) is None
    assert paired([(0, [10, 10, 50, 20]), (0, [60, 10, 90, 20])], ref, classes) is None
    # same count and classes, but one box elsewhere: paired, and its distance says how far
    assert paired([(0, [10, 10, 50, 20]), (1, [160, 10, 190, 20])], ref, classes) == 100.0
