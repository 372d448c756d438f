"""A decoder served (``pipeline.serve.generate``): tokens streamed as server-sent events equal the
pipeline's own greedy generation, and a sequence is admitted only within its limits.

The tiny Llama of ``tests/llm_tiny.py`` is exported by onnxruntime-genai's model builder
(``tests/decoder_tiny.py``'s ``build``) and
laid out as ``pipeline.registry pull`` lays out a published decoder (the builder's folder plus
``manifest.json``). The reference generation runs onnxruntime-genai's Generator directly in a child
process (greedy, the same prompt and length), not through the server's code. Refusals checked:
a sequence longer than ``--max-seq-len`` (413), a KV cache over ``--kv-budget-mb`` (503 with
Retry-After, while a sequence that fits is served), a malformed body (400); the cap on sequences
at once is checked on the admission itself (a second sequence while one holds the only slot is
refused), where no timing decides which request comes first.
"""
from __future__ import annotations

import pytest
import requests

from tests.serve_helpers import greedy_reference, sse_events, start, tiny_decoder

pytestmark = pytest.mark.slow

PROMPT = "the quick brown fox jumps over"


@pytest.fixture(scope="module")
def decoder(tmp_path_factory):
    return tiny_decoder(tmp_path_factory.mktemp("decoder"))


def _events(response) -> list[tuple[str, dict]]:
    return sse_events(response.iter_lines(decode_unicode=True))


def test_tokens_stream_as_the_pipelines_greedy_generation_and_limits_refuse(decoder, tmp_path):
    from pipeline.core import isolate

    running = start(str(decoder), tmp_path, "--threads", "1", "--kv-budget-mb", "0.02",
                    "--max-seq-len", "64", "--max-new-tokens", "8")
    try:
        ready = requests.get(f"{running.url}/readyz", timeout=30).json()
        per_token = ready["kv_bytes_per_token"]
        assert per_token == 2 * 2 * 2 * 16 * 4  # K and V, 2 layers, 2 KV heads of 16, float32
        fits = int(0.02 * 1024 * 1024 // per_token)  # positions the budget holds
        with requests.post(f"{running.url}/generate", json={"prompt": PROMPT,
                                                            "max_new_tokens": 12},
                           stream=True, timeout=60) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith(
                "text/event-stream"), r.text
            events = _events(r)
        tokens = [e["id"] for kind, e in events if kind == "token"]
        done = [e for kind, e in events if kind == "done"]
        assert len(done) == 1 and events[-1][0] == "done"
        assert tokens == done[0]["tokens"] and 1 <= len(tokens) <= 12
        # a longer sequence than the budget's KV cache holds: 503, and the server goes on
        prompt_len = done[0]["prompt_tokens"]
        over = requests.post(f"{running.url}/generate",
                             json={"prompt": PROMPT, "max_new_tokens": fits - prompt_len + 1},
                             timeout=60)
        too_long = requests.post(f"{running.url}/generate",
                                 json={"prompt": PROMPT, "max_new_tokens": 65}, timeout=60)
        malformed = requests.post(f"{running.url}/generate", json={"text": PROMPT}, timeout=60)
        again = requests.post(f"{running.url}/generate", data=PROMPT.encode(),
                              headers={"Content-Type": "text/plain"}, stream=True, timeout=60)
        assert again.status_code == 200 and _events(again)[-1][0] == "done"
        metrics = requests.get(f"{running.url}/metrics", timeout=30).text
    finally:
        assert running.stop() == 0, running.log.read_text()
    assert tokens == isolate.call("reference generation", greedy_reference, str(decoder), PROMPT,
                                  12)
    assert over.status_code == 503 and over.headers.get("Retry-After"), over.text
    assert "KV cache" in over.json()["error"] and "--kv-budget-mb" in over.json()["error"]
    assert too_long.status_code == 413 and "--max-seq-len" in too_long.json()["error"]
    assert malformed.status_code == 400 and '"prompt"' in malformed.json()["error"]
    assert "serve_time_to_first_token_seconds_count 2.0" in metrics
    assert "serve_sequences_active 0.0" in metrics and "serve_kv_reserved_bytes 0.0" in metrics


def test_admission_caps_sequences_and_kv_bytes():
    from pipeline.serve.generate import Admission, Refused

    a = Admission(max_sequences=1, budget_bytes=1000, available=lambda: 10 ** 12)
    a.admit(600)
    with pytest.raises(Refused, match="--max-sequences") as e:
        a.admit(1)
    assert e.value.status == 503
    a.release(600)
    with pytest.raises(Refused, match="--kv-budget-mb"):
        a.admit(1001)
    a.admit(1000)  # exactly the budget fits
    a.release(1000)
    short = Admission(max_sequences=4, budget_bytes=10 ** 12, available=lambda: 300 * 2 ** 20)
    with pytest.raises(Refused, match="available"):  # the machine's memory, less the margin
        short.admit(100 * 2 ** 20)
    assert (short.active, short.reserved) == (0, 0)


@pytest.fixture(scope="module")
def slower_decoder(tmp_path_factory):
    """A wider tiny Llama (8 layers, hidden 512: about 30 M parameters): its stream of a hundred
    tokens lasts long enough for a signal to land in the middle of it (the 2-layer one finishes a
    hundred tokens in a few milliseconds)."""
    return tiny_decoder(tmp_path_factory.mktemp("decoder-wide"), "tiny-llama-wide", layers=8,
                        hidden=512, intermediate=2048)


def test_sigterm_finishes_the_stream_in_flight_refuses_new_ones_and_exits_0(slower_decoder,
                                                                             tmp_path):
    """SIGTERM after the stream's first token: the stream still ends with every token of the
    greedy generation and its done event, a request sent after the signal is refused (503, or no
    connection once uvicorn closed its socket), and the process exits 0. The server's own line at
    the signal says a sequence was generating then: the test checks its premise, not a timing."""
    import signal

    from pipeline.core import isolate

    new = 100
    running = start(str(slower_decoder), tmp_path, "--threads", "1")
    with requests.post(f"{running.url}/generate", json={"prompt": PROMPT, "max_new_tokens": new},
                       stream=True, timeout=120) as r:
        assert r.status_code == 200, r.text
        lines = r.iter_lines(decode_unicode=True)
        head = []
        for line in lines:  # up to the first token's data
            head.append(line)
            if line.startswith("data: "):
                break
        running.proc.send_signal(signal.SIGTERM)
        try:
            late = requests.post(f"{running.url}/generate", json={"prompt": PROMPT}, timeout=30)
            late_answer = (late.status_code, late.json().get("error", ""))
        except requests.ConnectionError:
            late_answer = ("no connection", "")
        events = sse_events(head + list(lines))  # the rest of the stream, read after the signal
    code = running.proc.wait(120)
    log = running.log.read_text()
    assert code == 0, log
    assert "SIGTERM: stopping; 1 sequence(s) generating in flight" in log, log
    assert "drained and stopped" in log
    tokens = [e["id"] for k, e in events if k == "token"]
    assert events[0][0] == "token" and events[-1][0] == "done", events[-1]
    assert tokens == events[-1][1]["tokens"]
    assert tokens == isolate.call("reference generation", greedy_reference, str(slower_decoder),
                                  PROMPT, new)
    assert late_answer[0] in (503, "no connection"), late_answer
    if late_answer[0] == 503:
        assert "shutting down" in late_answer[1]
    with pytest.raises(requests.ConnectionError):  # nothing listens any more
        requests.get(f"{running.url}/healthz", timeout=5)


def test_decode_batch_streams_each_sequences_greedy_tokens_and_survives_a_client_gone(decoder,
                                                                                       tmp_path):
    """``--decode-batch 4``: onnxruntime-genai's Engine decodes the sequences together. Four
    prompts sent at once, one of whose clients hangs up after its first token, the others
    streaming to the end: each finished stream is that prompt's own greedy generation (the
    Generator run alone, in a child), and the server then serves a fifth as before. A budget
    smaller than the Engine's buffer (4 rows of --max-seq-len) is refused at start, exit 3."""
    from concurrent.futures import ThreadPoolExecutor

    from pipeline.core import isolate

    prompts = [PROMPT, "a b c d", "once upon a time there", "hello"]
    running = start(str(decoder), tmp_path, "--threads", "1", "--max-seq-len", "64",
                    "--decode-batch", "4", "--max-wait-ms", "50")

    def stream(k: int):
        with requests.post(f"{running.url}/generate",
                           json={"prompt": prompts[k], "max_new_tokens": 12},
                           stream=True, timeout=120) as r:
            assert r.status_code == 200, r.text
            if k == 1:  # this client goes away after its first token
                next(line for line in r.iter_lines(decode_unicode=True) if line.startswith("data"))
                return None
            return _events(r)

    try:
        assert requests.get(f"{running.url}/readyz", timeout=30).json()["decode_batch"] == 4
        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(stream, range(4)))
        after = requests.post(f"{running.url}/generate",
                              json={"prompt": prompts[0], "max_new_tokens": 12}, timeout=120)
    finally:
        assert running.stop() == 0, running.log.read_text()
    for k, events in enumerate(results):
        if k == 1:
            continue
        tokens = [e["id"] for kind, e in events if kind == "token"]
        assert events[-1][0] == "done" and tokens == events[-1][1]["tokens"]
        assert tokens == isolate.call("reference", greedy_reference, str(decoder), prompts[k], 12)
    assert after.status_code == 200 and "event: done" in after.text
    # the Engine's buffer (4 x 64 positions) over the budget: refused before serving
    small = tmp_path / "small"
    small.mkdir()
    with pytest.raises(AssertionError, match=r"(?s)exit 2\).*--decode-batch 4.*--kv-budget-mb"):
        start(str(decoder), small, "--threads", "1", "--max-seq-len", "64", "--decode-batch", "4",
              "--kv-budget-mb", "0.01", timeout=120)


def test_an_engine_that_cannot_start_fails_each_request_with_why_instead_of_hanging():
    """Not a model at all: ``og.Engine`` refuses it on the loop's thread, and every sequence
    asked of the loop (the server's warm-up first) raises the reason at once."""
    from pipeline.serve.decode_engine import EngineLoop

    loop = EngineLoop(object(), max_batch=2)
    for _ in range(2):
        with pytest.raises(RuntimeError, match="Engine cannot run this model"):
            list(loop.generate([1, 2, 3], 4))
    loop.stop()
    loop.thread.join(timeout=30)
    assert not loop.thread.is_alive()
