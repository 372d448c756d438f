"""The decoder's Ray Serve deployment (``pipeline.serve.ray_serve.generate_application``) on a
local Ray cluster started here: the tiny Llama's tokens come through Ray Serve's HTTP proxy as
server-sent events, one event per token, equal to onnxruntime-genai's greedy generation run
directly; a request over the sequence length is the HTTP server's 413.
"""
from __future__ import annotations

import time

import pytest
import requests

from tests.serve_helpers import greedy_reference, local_ray, sse_events, tiny_decoder

pytestmark = pytest.mark.slow

PROMPT = "the quick brown fox jumps over"


def test_a_replica_streams_the_greedy_tokens_through_the_proxy(tmp_path):
    pytest.importorskip("ray.serve")
    from pipeline.core import isolate
    from pipeline.serve.artifact import open_ref
    from pipeline.serve.config import ServeConfig
    from pipeline.serve.ray_serve import generate_application

    folder = tiny_decoder(tmp_path / "decoder")
    served = open_ref(str(folder), tmp_path / "pulled")
    with local_ray() as (serve, url):
        cfg = ServeConfig(intra_op_threads=1, max_seq_len=64, max_sequences=2, warmup_runs=1)
        serve.run(generate_application(served, cfg, num_cpus=0.5), route_prefix="/llm")
        deadline = time.monotonic() + 300
        while requests.get(f"{url}/llm/readyz", timeout=30).status_code != 200:
            assert time.monotonic() < deadline, "the replica never warmed up"
            time.sleep(0.5)
        with requests.post(f"{url}/llm/generate", json={"prompt": PROMPT, "max_new_tokens": 10},
                           stream=True, timeout=120) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith(
                "text/event-stream"), r.text
            events = sse_events(r.iter_lines(decode_unicode=True))
        too_long = requests.post(f"{url}/llm/generate",
                                 json={"prompt": PROMPT, "max_new_tokens": 65}, timeout=60)
    tokens = [e["id"] for kind, e in events if kind == "token"]
    assert events[-1][0] == "done" and tokens == events[-1][1]["tokens"]
    assert tokens == isolate.call("reference generation", greedy_reference, str(folder), PROMPT,
                                  10)
    assert too_long.status_code == 413 and "--max-seq-len" in too_long.json()["error"]
