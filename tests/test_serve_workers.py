"""The messages between the server and its preprocessing workers (``pipeline.serve.workers``): a
JSON header and raw bytes, never a pickle. What a worker prepared arrives whole (every array's
dtype, shape and values, the size class, the timings); a refusal arrives as its status and line;
any other failure as one line; an array that is not numbers is refused. The workers themselves
are driven end to end in ``test_serve.py``."""
from __future__ import annotations

import numpy as np
import pytest

from pipeline.serve.inputs import BadInput, Prepared
from pipeline.serve.workers import WorkerError, answer, frame, prepared_frame, split


def _received(whole: bytes):
    return answer(*split(whole))


def test_prepared_arrays_arrive_whole():
    feeds = {"image": np.random.default_rng(0).random((1, 1, 32, 77), dtype=np.float32),
             "input_ids": np.arange(12, dtype=np.int64).reshape(1, 12),
             "mask": np.ones((1, 12), dtype=np.int32)}
    got = _received(prepared_frame(7, Prepared(feeds, 77, 1.25, 0.5)))
    assert (got.size, got.decode_ms, got.preprocess_ms) == (77, 1.25, 0.5)
    assert list(got.feeds) == list(feeds)
    for name, a in feeds.items():
        assert got.feeds[name].dtype == a.dtype and np.array_equal(got.feeds[name], a)
        assert got.feeds[name].flags.writeable  # a copy, not a view of the frame


def test_a_refusal_keeps_its_status_and_line_and_a_failure_is_one_line():
    refused = _received(frame({"id": 3, "ok": False, "status": 413, "line": "too many pixels"}))
    assert isinstance(refused, BadInput) and (refused.status, refused.line) == (413,
                                                                                "too many pixels")
    failed = _received(frame({"id": 3, "ok": False, "line": "ValueError: odd bytes"}))
    assert isinstance(failed, WorkerError) and str(failed) == "ValueError: odd bytes"


@pytest.mark.parametrize("dtype", ["|O", "<U4", "|V8"])
def test_an_array_that_is_not_numbers_is_refused(dtype):
    header = {"id": 1, "ok": True, "size": 1, "decode_ms": 0.0, "preprocess_ms": 0.0,
              "arrays": [["x", dtype, [1]]]}
    got = _received(frame(header, b"\0" * 8))
    assert isinstance(got, WorkerError) and dtype in str(got)
