"""The model server (``python -m pipeline.serve``), started for real on 127.0.0.1 and spoken to
over HTTP, serving the tiny OCR run's published version (a registry ref: pulled and re-hashed).

What is proven here, none of it by timing: every bad input of issue 36 is answered with its 4xx
and one line while a good request sent at the same time succeeds; past the queue limit requests
are answered 503 with Retry-After and the server's memory stays put; SIGTERM answers what is in
flight and exits 0; /predict is refused until warm-up is done; /metrics parses as Prometheus text
and counts what was sent; an artifact whose recorded preprocessing differs from the code's is
refused in one line. Parity with the evaluation's outputs is ``test_serve_parity.py`` (a trained
model: the tiny one's random weights read every line as the same string).
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from tests.conftest import ROOT, one_line, run_folder
from tests.serve_helpers import line_png, metrics, png_claiming, start


@pytest.fixture(scope="module")
def published(tiny_run):
    """(ref, registry overrides) of the tiny run's published version."""
    workdir, proc = tiny_run
    report = json.loads((run_folder(proc) / "report.json").read_text())
    ref = report["published"].split("@")[0]  # ocr:int8-0123...
    return ref, [f"registry.root={workdir / 'registry'}"]


@pytest.fixture(scope="module")
def server(published, tmp_path_factory):
    ref, overrides = published
    running = start(ref, tmp_path_factory.mktemp("serve"), *overrides, "--workers", "2",
                    "--threads", "1")
    yield running
    assert running.stop() == 0, running.log.read_text()


def post(url: str, body, content_type: str = "image/png", **kw) -> requests.Response:
    return requests.post(f"{url}/predict", data=body, headers={"Content-Type": content_type},
                         timeout=120, **kw)


def admitted(pool, url: str):
    """One request sent from ``pool``, returned (a future) once the server has admitted it."""
    sent = pool.submit(post, url, line_png())
    deadline = time.monotonic() + 60
    while metrics(url).get(("serve_queue_depth",)) != 1:
        assert time.monotonic() < deadline, "the request was never admitted"
        time.sleep(0.02)
    return sent


def test_predicts_from_png_and_jpeg_bytes_of_any_size(server):
    from PIL import Image
    import io

    answers = []
    for width, height, fmt in ((96, 32, "PNG"), (640, 150, "JPEG"), (7, 3, "PNG")):
        buf = io.BytesIO()
        Image.new("RGB", (width, height), (200, 200, 200)).save(buf, format=fmt)
        r = post(server.url, buf.getvalue(), f"image/{fmt.lower()}")
        assert r.status_code == 200, r.text
        body = r.json()
        assert isinstance(body["prediction"], str)
        assert {"decode", "preprocess", "queue", "inference", "postprocess", "total"} <= \
            set(body["timing_ms"])
        answers.append(body)
    assert all(a["model"].startswith("ocr:int8-") for a in answers)
    # --port 0 drew a port: the log names the one it is bound to, not 0
    assert f"serve: ready on {server.url}" in server.log.read_text()


def test_every_answer_names_the_exact_version_it_came_from(server, published, tiny_run):
    """The ref served names no digest (an alias would not either, and moves): each answer,
    /readyz and /metrics name the version pulled, NAME:VERSION@sha256:..., as publishing did."""
    report = json.loads((run_folder(tiny_run[1]) / "report.json").read_text())
    exact = report["published"].split(" ")[0]  # ocr:int8-...@sha256:... (local ...)
    ref = published[0]
    assert exact.startswith(ref + "@sha256:") and len(exact) == len(ref) + 8 + 64
    assert post(server.url, line_png()).json()["version"] == exact
    assert requests.get(f"{server.url}/readyz", timeout=30).json()["version"] == exact
    assert metrics(server.url)[("serve_model_info", ("ref", ref), ("version", exact))] == 1
    assert f"serving {ref} = {exact} (" in server.log.read_text()


def _bad_inputs():
    good = line_png()
    truncated = good[:len(good) // 2]
    return [
        ("not an image", b"this is not an image at all", "application/octet-stream", 415,
         "not a PNG or JPEG"),
        ("empty", b"", "image/png", 400, "empty body"),
        ("100 MB", b"\0" * (100 * 1024 * 1024), "image/png", 413, "over the limit"),
        ("bomb", png_claiming(40000, 40000), "image/png", 413, "40000x40000"),
        ("invalid UTF-8", b"caf\xe9 \xff\xfe", "text/plain; charset=utf-8", 400, "UTF-8"),
        ("truncated", truncated, "image/png", 400, "truncated or corrupt"),
        # 98 bytes, under every header limit, but brought to the model's height keeping its
        # aspect it is a line 524288 wide: gigabytes of activations had it reached the model
        ("extreme aspect", _png(16384, 1), "image/png", 413, "--max-input-values"),
        ("a zero-pixel side", png_claiming(0, 32), "image/png", 400, "a PNG whose header"),
    ]


def _png(width: int, height: int) -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("L", (width, height), 255).save(buf, format="PNG")
    return buf.getvalue()


@pytest.mark.parametrize("name,body,ctype,status,words", _bad_inputs(),
                         ids=[b[0] for b in _bad_inputs()])
def test_bad_input_is_one_line_4xx_while_a_good_request_succeeds(server, name, body, ctype,
                                                                 status, words):
    with ThreadPoolExecutor(2) as pool:
        bad = pool.submit(post, server.url, body, ctype)
        good = pool.submit(post, server.url, line_png(seed=1))
        bad, good = bad.result(), good.result()
    assert bad.status_code == status, bad.text
    line = bad.json()["error"]
    assert words in line and "\n" not in line, line
    assert good.status_code == 200, good.text
    assert isinstance(good.json()["prediction"], str)


def test_a_streamed_body_over_the_limit_is_refused_before_it_is_read_whole(server):
    """No Content-Length (chunked): the server counts what streams in and stops at the limit."""
    chunk = b"\0" * (1024 * 1024)
    sent = []

    def body():
        for _ in range(100):
            sent.append(1)
            yield chunk

    try:
        r = post(server.url, body())
        assert r.status_code == 413, r.text
        assert "over the limit" in r.json()["error"]
    except requests.ConnectionError:
        pass  # the server answered and closed while the client was still sending: also refused
    assert post(server.url, line_png()).status_code == 200  # and it keeps serving


def test_metrics_parse_as_prometheus_text_and_count_requests(server):
    before = metrics(server.url)
    ok = [post(server.url, line_png(seed=s)) for s in range(3)]
    bad = post(server.url, b"")
    after = metrics(server.url)
    assert [r.status_code for r in ok] == [200] * 3 and bad.status_code == 400

    def delta(*key):
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert delta("serve_requests_total", ("outcome", "ok")) == 3
    assert delta("serve_requests_total", ("outcome", "bad_input")) == 1
    assert delta("serve_errors_total", ("status", "400")) == 1
    for stage in ("decode", "preprocess", "queue", "inference", "postprocess", "total"):
        assert delta("serve_stage_seconds_count", ("stage", stage)) == 3, stage
    assert delta("serve_batch_size_count") == 3  # one batch each: they were sent one by one
    assert ("serve_queue_depth",) in after


def test_wrong_routes_and_methods_are_answered_in_json_too(server):
    for r in (requests.get(f"{server.url}/predict", timeout=30),
              requests.post(f"{server.url}/nowhere", data=b"x", timeout=30)):
        assert r.status_code in (404, 405) and r.json()["error"].startswith(
            ("GET /predict", "POST /nowhere")), r.text


def _stall(url: str, sent: bytes = b"abcd"):
    """A client that sends its headers, a Content-Length of 1000 and ``sent``, then nothing."""
    import socket
    from urllib.parse import urlparse

    u = urlparse(url)
    sock = socket.create_connection((u.hostname, u.port), timeout=60)
    sock.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\n"
                 b"Content-Length: 1000\r\n\r\n" + sent)
    return sock


def test_a_stalled_body_holds_no_place_in_the_queue_and_a_client_that_leaves_is_no_error(
        published, tmp_path):
    """Queue limit 2 and three clients that stall mid-body: a good request is still answered
    (the body is read before a request is admitted), each stalled one gets 408 once
    --body-timeout-s passes, and a client that hangs up mid-body counts as disconnected, not as
    a 500 of the server's."""
    ref, overrides = published
    running = start(ref, tmp_path, *overrides, "--queue-limit", "2", "--body-timeout-s", "3",
                    "--workers", "1", "--threads", "1")
    try:
        before = metrics(running.url)
        stalled = [_stall(running.url) for _ in range(3)]
        assert post(running.url, line_png()).status_code == 200
        for sock in stalled:
            answer = b""
            while chunk := sock.recv(4096):  # the server closes it after the answer
                answer += chunk
            answer = answer.decode()
            assert answer.startswith("HTTP/1.1 408") and "--body-timeout-s" in answer, answer
            sock.close()
        gone = _stall(running.url)
        gone.close()
        deadline = time.monotonic() + 30
        while metrics(running.url).get(("serve_requests_total", ("outcome", "disconnected")),
                                       0) < 1:
            assert time.monotonic() < deadline, "the client that left was never counted"
            time.sleep(0.05)
        after = metrics(running.url)

        def delta(*key):
            return after.get(key, 0.0) - before.get(key, 0.0)

        assert delta("serve_errors_total", ("status", "408")) == 3
        assert delta("serve_requests_total", ("outcome", "error")) == 0
        assert delta("serve_errors_total", ("status", "500")) == 0
    finally:
        assert running.stop() == 0, running.log.read_text()


def test_overload_is_503_with_retry_after_and_memory_stays_bounded(published, tmp_path):
    """Queue limit 2, and a batcher that holds a lone request 8 s hoping for company (long, so a
    busy host still sends all the others while the two are held): while two are held, every
    other request must be refused at once, not queued. Then, with a wait limit no request can
    meet (a microsecond), one held request is enough to refuse the next by the wait it would
    have, once answered requests gave the server its service times."""
    ref, overrides = published
    running = start(ref, tmp_path, *overrides, "--queue-limit", "2", "--max-wait-ms", "8000",
                    "--max-queue-ms", "0.001", "--workers", "1", "--threads", "1")
    try:
        held = ThreadPoolExecutor(2)
        first = [held.submit(post, running.url, line_png(width=96 + 4 * k)) for k in range(2)]
        deadline = time.monotonic() + 60
        while metrics(running.url).get(("serve_queue_depth",)) != 2:
            assert time.monotonic() < deadline, "the two requests were never admitted"
            time.sleep(0.02)
        rss = running.rss_mb()
        with ThreadPoolExecutor(8) as pool:
            refused = list(pool.map(lambda k: post(running.url, line_png(seed=k)), range(100)))
        assert all(r.status_code == 503 for r in refused), {r.status_code for r in refused}
        assert all(r.headers["Retry-After"] == "1" for r in refused)
        assert "overloaded" in refused[0].json()["error"]
        assert running.rss_mb() - rss < 50, "memory grew while refusing"
        assert all(f.result().status_code == 200 for f in first)  # the held ones are answered
        m = metrics(running.url)
        assert m[("serve_requests_total", ("outcome", "overloaded"))] == 100
        with ThreadPoolExecutor(1) as pool:
            again = admitted(pool, running.url)
            late = post(running.url, line_png(seed=7))
            assert late.status_code == 503 and late.headers["Retry-After"] == "1"
            assert "--max-queue-ms" in late.json()["error"], late.json()
            assert again.result().status_code == 200  # and it serves again
    finally:
        assert running.stop() == 0, running.log.read_text()


def _children(pid: int) -> set[int]:
    from pathlib import Path

    return {int(k) for t in Path(f"/proc/{pid}/task").iterdir()
            for k in (t / "children").read_text().split()}


def test_sigterm_answers_what_is_in_flight_then_exits_0(published, tmp_path):
    """SIGTERM to the whole process group, as a terminal's Ctrl-C and systemd's stop send it,
    the workers too, while the batcher holds the lone request 5 s hoping for company: the
    request is answered and the server exits 0. The workers are the server's to stop: none dies
    of the signal and none is started in its place (a replacement still starting when the
    server stopped printed a traceback)."""
    import os
    import signal

    ref, overrides = published
    running = start(ref, tmp_path, *overrides, "--max-wait-ms", "5000", "--workers", "1",
                    "--threads", "1")
    before = _children(running.proc.pid)
    with ThreadPoolExecutor(1) as pool:
        inflight = admitted(pool, running.url)
        os.killpg(running.proc.pid, signal.SIGTERM)
        time.sleep(2)  # a dead worker is replaced within a second
        assert _children(running.proc.pid) == before
        answer = inflight.result()
    assert answer.status_code == 200, answer.text
    assert running.proc.wait(60) == 0, running.log.read_text()
    log = running.log.read_text()
    assert "drained and stopped" in log and "Traceback" not in log, log
    with pytest.raises(requests.ConnectionError):  # nothing listens any more
        requests.get(f"{running.url}/healthz", timeout=5)


def test_predict_is_refused_until_warm_up_is_done(published, tmp_path):
    """Polled from the moment the process starts: /healthz may answer before /readyz does, and
    while /readyz says 503 a prediction is 503 too; once ready, it stays ready and answers."""
    import socket

    ref, overrides = published
    with socket.socket() as s:  # a free port, so the test can poll before the server is ready
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env_url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "pipeline.serve", ref, "--port", str(port),
                             *overrides], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.STDOUT)
    seen = []
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                ready = requests.get(f"{env_url}/readyz", timeout=5)
            except requests.ConnectionError:
                time.sleep(0.02)
                continue
            if ready.status_code == 200:
                break
            assert ready.status_code == 503
            refused = post(env_url, line_png())
            seen.append(refused.status_code)
            if refused.status_code == 200:  # it became ready between the two requests
                assert requests.get(f"{env_url}/readyz", timeout=5).status_code == 200
                continue
            assert refused.status_code == 503 and "warming up" in refused.json()["error"]
        assert ready.status_code == 200, "never ready"
        assert ready.json()["status"] == "ready"
        answered = sum(code == 200 for code in seen)
        assert post(env_url, line_png()).status_code == 200
        assert requests.get(f"{env_url}/readyz", timeout=5).status_code == 200
        # the batches metric counts what answered clients, not warm-up's own requests; the 503s
        # of warm-up are counted as unavailable
        m = metrics(env_url)
        assert m[("serve_batch_size_count",)] == answered + 1, m
        assert m[("serve_requests_total", ("outcome", "unavailable"))] == \
            sum(code == 503 for code in seen)
    finally:
        proc.terminate()
        assert proc.wait(60) == 0


def test_a_bad_ref_is_one_line_and_exit_2(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "pipeline.serve", str(tmp_path / "nothing")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    one_line(proc, 2, "nothing", "registry ref")
    proc = subprocess.run([sys.executable, "-m", "pipeline.serve", ""], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    one_line(proc, 2, "REF is empty")
    proc = subprocess.run([sys.executable, "-m", "pipeline.serve", str(tmp_path),
                           "--mode", "fast"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    one_line(proc, 2, "--mode", "pipeline, inline")


def test_numbers_that_cannot_work_are_refused_before_anything_is_read(tmp_path):
    """A port past 65535 (the kernel would take it modulo 65536: another port), a batch wait
    that is not finite or past ten seconds (every request would hang), a batch that large."""
    for flag, value, words in (("--port", "70000", "0 to 65535"),
                               ("--max-wait-ms", "inf", "--max-wait-ms"),
                               ("--max-wait-ms", "nan", "--max-wait-ms"),
                               ("--max-wait-ms", "1e9", "--max-wait-ms"),
                               ("--max-batch", "1000000000000", "--max-batch"),
                               ("--body-timeout-s", "0", "--body-timeout-s"),
                               ("--port", "abc", "--port"),
                               ("--host", "999.1.1.1", "--host 999.1.1.1")):
        proc = subprocess.run([sys.executable, "-m", "pipeline.serve", str(tmp_path / "x"),
                               flag, value], cwd=ROOT, capture_output=True, text=True,
                              timeout=120)
        one_line(proc, 2, words)


def test_limits_that_refuse_even_the_warm_up_request_are_a_bad_argument(published):
    ref, overrides = published
    proc = subprocess.run([sys.executable, "-m", "pipeline.serve", ref, "--port", "0",
                           "--max-body-bytes", "10", *overrides], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    one_line(proc, 2, "warm-up request", "--max-body-bytes")


def test_a_damaged_manifest_is_one_line_naming_it(published, tmp_path):
    ref, overrides = published
    pulled = tmp_path / "pulled"
    subprocess.run([sys.executable, "-m", "pipeline.registry", "pull", ref, "--out", str(pulled),
                    *overrides], cwd=ROOT, check=True, capture_output=True, timeout=120)
    text = (pulled / "manifest.json").read_text()
    for damage in (text[:len(text) // 2], "[1, 2]", "{}"):
        (pulled / "manifest.json").write_text(damage)
        proc = subprocess.run([sys.executable, "-m", "pipeline.serve", str(pulled)], cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
        one_line(proc, 3, "manifest.json")


def test_an_artifact_evaluated_with_other_preprocessing_is_refused(published, tmp_path):
    """A pulled version whose manifest says its lines were 64 pixels tall: this code would feed
    the model 32-pixel lines, so it is not served."""
    ref, overrides = published
    pulled = tmp_path / "pulled"
    subprocess.run([sys.executable, "-m", "pipeline.registry", "pull", ref, "--out", str(pulled),
                    *overrides], cwd=ROOT, check=True, capture_output=True, timeout=120)
    edited = tmp_path / "edited"
    shutil.copytree(pulled, edited)
    manifest = json.loads((edited / "manifest.json").read_text())
    assert manifest["serving"]["image"]["height"] == 32  # what the run recorded
    manifest["serving"]["image"]["height"] = 64
    (edited / "manifest.json").write_text(json.dumps(manifest))
    proc = subprocess.run([sys.executable, "-m", "pipeline.serve", str(edited)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    one_line(proc, 2, "preprocessing differs", "image")


def test_a_run_whose_cached_model_was_edited_is_refused(tiny_run, tmp_path):
    """Serving a run's folder re-hashes its cached candidate: a copy of the run whose model file
    was altered after the gate is one line and exit 3, nothing served."""
    _, proc = tiny_run
    report = json.loads((run_folder(proc) / "report.json").read_text())
    original = Path(report["lineage"]["candidate"]["path"])
    entry = tmp_path / "cache" / original.name  # a cache entry's folder is named by its key
    shutil.copytree(original, entry)
    report["lineage"]["candidate"]["path"] = str(entry)
    run = tmp_path / "run"
    run.mkdir()
    (run / "report.json").write_text(json.dumps(report))
    model = entry / "model.onnx"
    model.write_bytes(model.read_bytes() + b"\0")
    proc = subprocess.run([sys.executable, "-m", "pipeline.serve", str(run)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    one_line(proc, 3, "corrupt", "model.onnx")


def _workers(pid: int) -> list[int]:
    """The server's preprocessing processes (children started by multiprocessing's spawn, from
    whichever of its threads)."""
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:  # a thread, or a child, may end while it is read
            for c in (task / "children").read_text().split():
                if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes():
                    out.append(int(c))
        except (FileNotFoundError, ProcessLookupError):
            continue
    return out


def _replaced(pid: int, dead: list[int], count: int) -> list[int]:
    """The server's workers once none of ``dead`` is among them and ``count`` are up again."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        now = _workers(pid)
        if len(now) == count and not set(now) & set(dead):
            return now
        time.sleep(0.05)
    raise AssertionError(f"workers {dead} were not replaced: {_workers(pid)}")


def test_a_dead_worker_fails_its_request_and_the_server_goes_on(server):
    import os
    import signal

    restarts = ("serve_worker_restarts_total",)
    before = metrics(server.url)[restarts]
    workers = _workers(server.proc.pid)
    assert len(workers) == 2, workers
    # A worker that dies idle costs no request: it is replaced, the other goes on.
    os.kill(workers[0], signal.SIGKILL)
    workers = _replaced(server.proc.pid, workers[:1], 2)
    assert [post(server.url, line_png(seed=k)).status_code for k in range(3)] == [200] * 3
    # Workers that die holding a request fail it (500, one line) and are replaced. Both are
    # frozen first, so the request is surely still in one of them when they are killed.
    for w in workers:
        os.kill(w, signal.SIGSTOP)
    with ThreadPoolExecutor(1) as pool:
        held = admitted(pool, server.url)
        time.sleep(0.3)  # its body is read and written to a worker's socket just after
        for w in workers:
            os.kill(w, signal.SIGKILL)
        lost = held.result(timeout=120)
    assert lost.status_code == 500, lost.text
    assert "worker died" in lost.json()["error"]
    _replaced(server.proc.pid, workers, 2)
    after = [post(server.url, line_png(seed=k)) for k in range(3)]
    assert [r.status_code for r in after] == [200] * 3, [r.text for r in after]
    assert metrics(server.url)[restarts] == before + 3



def test_a_run_whose_gate_failed_is_not_served(tiny_run, tmp_path):
    _, proc = tiny_run
    report = json.loads((run_folder(proc) / "report.json").read_text())
    report["verdict"] = {**report["verdict"], "passed": False, "summary": "FAIL"}
    (tmp_path / "report.json").write_text(json.dumps(report))
    proc = subprocess.run([sys.executable, "-m", "pipeline.serve", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    one_line(proc, 3, "gate did not pass", "FAIL")
