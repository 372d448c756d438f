"""The serve bench's CPU bound is issue 36's: the usable cores over the sum of the CPU-ms one
request costs in decode + preprocess, in inference weighted by the batches the batcher formed, and
in the HTTP layer; the results page shows it beside each row, and a section from before (wall-time
shares) still renders. Arithmetic and rendering only: the measuring is a benchmark's."""
from __future__ import annotations

import pytest


def test_bound_is_cores_over_the_sum_with_inference_weighted_by_the_batches_formed():
    from benchmarks.serve import _batches_formed
    from benchmarks.serve_bound import CpuBound

    row = {"steps": [
        {"offered_qps": 10, "meets_slo": True, "batch_sizes": {"1": 10}},
        {"offered_qps": 40, "meets_slo": True, "batch_sizes": {"1": 10, "2": 15}},
        {"offered_qps": 60, "meets_slo": False, "batch_sizes": {"4": 30}}]}
    counts = _batches_formed(row)  # the highest steady step within the target: 40 req/s
    assert counts == {1: 10, 2: 15}
    answered = 10 * 1 + 15 * 2
    bound = CpuBound(cores=2, threads=1, decode_preprocess_cpu_ms=1.0,
                     inference_cpu_ms_by_batch={1: 3.0, 2: 2.0},
                     batch_share={1: 10 / answered, 2: 30 / answered}, http_cpu_ms=0.5)
    assert bound.inference_cpu_ms == pytest.approx(0.25 * 3.0 + 0.75 * 2.0)
    assert bound.cpu_ms_per_request == pytest.approx(1.0 + 2.25 + 0.5)
    assert bound.bound_qps == pytest.approx(2 * 1000.0 / 3.75)
    d = bound.as_dict()
    assert d["bound_qps"] == pytest.approx(bound.bound_qps) and d["http_cpu_ms"] == 0.5
    # no step met the target: the whole sweep's batches
    assert _batches_formed({"steps": row["steps"][2:]}) == {4: 30}


def test_table_shows_the_bound_and_each_rows_fraction_and_an_older_section_still_renders():
    from benchmarks.serve import table, targets
    from benchmarks.serve_bound import CpuBound

    bound = CpuBound(2, 1, 1.0, {1: 3.0}, {1: 1.0}, "the batcher's batches", 1.0)
    step = {"offered_qps": 300.0, "meets_slo": True, "p50_ms": 5.0, "p99_ms": 20.0,
            "network_ms": 1.0, "stage_ms": {"decode": 1.0, "inference": 2.0}}
    section = {"scale": 4.0, "slo_p99_ms": 200.0, "cpu_bound": {"int8": bound.as_dict()},
               "servers": {"int8 pipeline": {"max_qps_within_slo": 300.0, "steps": [step],
                                             "fraction_of_cpu_bound": 0.75,
                                             "inference_busy_share": 0.6,
                                             "server_cpu_ms_per_request": 5.5,
                                             "server_main_cpu_ms_per_request": 3.0,
                                             "client_cpu_ms_per_request": 2.0,
                                             "bound_with_load_generator_qps": 400.0}}}
    text = "\n".join(table(section))
    assert "400 requests/s = 2 cores / 5.00 CPU-ms a request" in text
    assert "| int8 pipeline | 300.0 req/s | 75% | 60% | 5.50 (main 3.00) | 2.00 | 75% |" in text
    assert targets(section)["INT8 producer/consumer reaches >= 80 % of the CPU bound"] == \
        [0.75, False]
    older = {**section, "cpu_bound": {"cores": 2, "model_ms_b1": 1.9, "bound_qps_serial": 318.5,
                                      "decode_preprocess_ms_1_core": 1.2},
             "servers": {"int8 pipeline": {"max_qps_within_slo": 300.0, "steps": [step]}}}
    text = "\n".join(table(older))
    assert "before issue 36's definition" in text and "at most 318 requests/s" in text
    assert "| int8 pipeline | 300.0 req/s | — | — |" in text


def test_a_server_offered_its_bound_reports_what_it_answered_and_how_busy_the_cores_were():
    from benchmarks.serve import saturated, table

    # offered 1000 req/s for 10 s on 2 cores, answered 7,600: 760 req/s; the server spent 15.2
    # CPU-s and the load generator 2.28, 87.4 % of the 20 core-seconds
    step = {"offered_qps": 1000.0, "seconds": 10.0, "ok": 7600, "achieved_qps": 760.0,
            "errors": {"503": 2400}, "p99_ms": 230.0, "inference_busy_share": 0.77,
            "server": {"cpu_s": 15.2, "main_cpu_s": 8.0}, "client_cpu_s": 2.28}
    sweep = [{"achieved_qps": 600.0}, {"achieved_qps": 800.0}, {"achieved_qps": 700.0}]
    got = saturated(step, sweep, bound_qps=1000.0, cores=2)
    assert got["answered_qps"] == 760.0 and got["fraction_of_cpu_bound"] == pytest.approx(0.76)
    assert got["server_cpu_ms_per_request"] == pytest.approx(2.0)
    assert got["client_cpu_ms_per_request"] == pytest.approx(0.3)
    assert got["cores_busy_share"] == pytest.approx(0.874)
    assert got["errors"] == {"503": 2400}
    # shedding costs CPU: the sweep's step at 800 answered more than the one at the bound
    assert got["most_answered_qps"] == 800.0 and got["most_answered_fraction"] == 0.8
    # a server without the probe (no CPU read): no busy share, nothing invented
    bare = saturated({**step, "server": {}, "client_cpu_s": None}, [], 1000.0, 2)
    assert bare["cores_busy_share"] is None and bare["server_cpu_ms_per_request"] is None
    row = {"max_qps_within_slo": 600.0, "steps": [{"offered_qps": 600.0, "meets_slo": True,
                                                   "p50_ms": 5.0, "p99_ms": 20.0,
                                                   "network_ms": 1.0, "stage_ms": {}}],
           "saturated": got}
    text = "\n".join(table({"scale": 4.0, "slo_p99_ms": 200.0, "cpu_bound": {},
                            "servers": {"int8 pipeline": row}}))
    assert "Offered 1000 req/s" in text
    assert "int8 pipeline answered 760 req/s (76% of its bound, cores 87% busy" in text
    assert "at most 800 in any step (80%)" in text


def test_the_soak_is_flat_only_without_errors_growth_or_a_late_p99_past_the_target():
    from benchmarks import serve

    assert serve._slope_per_minute([(0, 100.0), (60, 103.0), (120, 106.0)]) == \
        pytest.approx(3.0)
    assert serve._slope_per_minute([(0, 1.0), (60, float("nan"))]) is None  # too few points

    def met(**soak) -> bool:
        flat = {"errors": {}, "window_p99_ms_first_last": [20.0, 22.0],
                "rss_slope_mb_per_min": 0.1}
        section = {"servers": {}, "slo_p99_ms": 100.0, "soak": {**flat, **soak}}
        (value, ok), = [v for k, v in serve.targets(section).items() if k.startswith("soak")]
        return ok

    assert met()
    assert not met(errors={"503": 2})
    assert not met(window_p99_ms_first_last=[20.0, 150.0])
    assert not met(rss_slope_mb_per_min=5.0)  # over bench.load.leak_mb_per_min (2 MB/min)


def test_int8_over_fp32_is_shown_for_the_model_alone_and_end_to_end():
    from benchmarks.serve import int8_vs_fp32

    report = {"rows": [{"role": "fp32", "latency": {"1": {"p50": 2.0}, "8": {"p50": 9.0}}},
                       {"role": "candidate", "latency": {"1": {"p50": 1.0}, "8": {"p50": 3.0}}}]}
    servers = {"int8 pipeline": {"max_qps_within_slo": 300.0, "steps": [{"p50_ms": 4.0}]},
               "fp32 pipeline": {"max_qps_within_slo": 200.0, "steps": [{"p50_ms": 5.0}]}}
    v = int8_vs_fp32(report, servers)
    assert v["model_only_p50_speedup"] == {"1": 2.0, "8": 3.0}
    assert v["served_max_qps_ratio"] == 1.5 and v["served_p50_speedup_first_step"] == 1.25
    assert "served_max_qps_ratio" not in int8_vs_fp32(report, {})  # a server that did not run


def test_a_ratio_beats_1_only_when_its_interval_does():
    """Each server's rate is bracketed by its steps' p99 intervals: the highest rate whose
    interval lies wholly within the target, the lowest above it wholly past it (or failing); a
    step straddling the target, or unsteady, decides nothing. The ratio's interval divides the
    brackets crosswise, and the target reads true only when its low end is above 1."""
    from benchmarks.serve import bracket, ratio_interval, targets

    def st(qps, lo, hi, steady=True, errors=None, sent=1000):
        return {"offered_qps": qps, "p99_ci_ms": [lo, hi], "steady": steady,
                "errors": errors or {}, "sent": sent}

    fast = {"steps": [st(100, 10, 20), st(200, 30, 60), st(300, 150, 400)],
            "max_qps_within_slo": 200.0}
    slow = {"steps": [st(100, 20, 40), st(140, 60, 130), st(150, 90, 95, steady=False),
                      st(200, 50, 90, errors={"503": 30})], "max_qps_within_slo": 100.0}
    assert bracket(fast, 100.0) == (200, 300)
    # 140 straddles, 150 never steadied: neither decides; 200 failed 3 % of its requests
    assert bracket(slow, 100.0) == (100, 200)
    assert ratio_interval(fast, slow, 100.0) == (1.0, 3.0)
    assert bracket({"steps": [st(100, 10, None)]}, 100.0) == (0.0, None)  # too few requests
    assert ratio_interval(fast, {"steps": [st(100, 10, 20)]}, 100.0) == (0.0, 3.0)
    section = {"slo_p99_ms": 100.0, "servers": {"int8 pipeline": fast, "int8 inline": slow}}
    (value, ok), = [v for k, v in targets(section).items() if "beats inline" in k]
    assert value["ratio"] == 2.0 and value["ci95"] == [1.0, 3.0] and not ok
    slow["steps"][1] = st(140, 101, 130)  # now past the target for sure: the bracket tightens
    assert bracket(slow, 100.0) == (100, 140)
    (value, ok), = [v for k, v in targets(section).items() if "beats inline" in k]
    assert value["ci95"][0] == pytest.approx(200 / 140) and ok



def test_a_compared_server_is_tested_at_the_pipelines_decided_rate_until_the_ratio_is():
    """``deciding``: while a compared server's own rate lies below the pipeline's decided one
    and none of its steps between them was decided past the target, the next rate is the
    geometric middle of its highest and the pipeline's; it stops once a step decides, when it
    holds as much as the pipeline, and after ``count`` rates."""
    from benchmarks.serve import deciding, ratio_interval

    def st(qps, lo, hi, **kw):
        return {"offered_qps": qps, "p99_ci_ms": [lo, hi], "steady": True, "errors": {},
                "sent": 1000, **kw}

    pipe = {"steps": [st(400, 20, 30), st(700, 90, 99), st(1000, 250, 260)],
            "max_qps_within_slo": 700.0}
    # its own edge undecided (straddles at 470), decided only at the pipeline's rate
    inline = {"steps": [st(450, 90, 130), st(470, 140, 285), st(700, 2000, 2800)],
              "max_qps_within_slo": 450.0}
    assert ratio_interval(pipe, inline, 200.0)[0] == 1.0
    rates = deciding(inline, pipe, 200.0, 2)
    first = next(rates)
    assert first == pytest.approx((450 * 700) ** 0.5)
    inline["steps"].append(st(first, 150, 260, deciding=True))  # straddles again: go on, higher
    second = next(rates)
    assert first < second < 700 and second == pytest.approx((first * 700) ** 0.5)
    inline["steps"].append(st(second, 400, 600, deciding=True))  # decided past the target
    assert list(rates) == []
    assert ratio_interval(pipe, inline, 200.0)[0] == pytest.approx(700 / second)
    # nothing to decide: no pipeline row, a server as fast, one already decided below, count 0
    assert list(deciding(inline, None, 200.0, 2)) == []
    assert list(deciding({**inline, "max_qps_within_slo": 700.0}, pipe, 200.0, 2)) == []
    decided = {"steps": [st(450, 90, 130), st(500, 300, 400)], "max_qps_within_slo": 450.0}
    assert list(deciding(decided, pipe, 200.0, 2)) == []
    assert list(deciding(inline | {"steps": inline["steps"][:3]}, pipe, 200.0, 0)) == []
    # the count caps it: every step held
    held = {"steps": [st(450, 90, 130)], "max_qps_within_slo": 450.0}
    for rate in deciding(held, pipe, 200.0, 3):
        held["steps"].append(st(rate, 90, 120, deciding=True))
    assert len(held["steps"]) == 4

def test_the_decoder_rows_show_the_engine_beside_one_generator_per_sequence():
    from benchmarks.serve_decoder import decoder_table

    def part(all_rate: float, batch: int) -> dict:
        return {"server": {"max_sequences": 8, "max_seq_len": 128, "kv_budget_mb": 45.0,
                           "kv_bytes_per_token": 46080, "intra_op_threads": 1,
                           "decode_batch": batch},
                "steps": [{"streams": 4, "ttft_ms_p50": 300.0, "ttft_ms_max": 600.0,
                           "tokens_per_s_per_stream_p50": all_rate / 4,
                           "tokens_per_s_per_stream_min": all_rate / 5,
                           "tokens_per_s_all": all_rate, "refused": {}}],
                "rss_ready_mb": 400.0, "rss_peak_mb": 500.0, "rss_growth_mb": 100.0,
                "kv_admitted_8_streams_mb": 33.75}

    dec = {"model": "SmolLM2", "prompt_tokens": 64, "new_tokens": 32, **part(58.0, 0),
           "engine": part(99.0, 8)}
    text = "\n".join(decoder_table(dec))
    assert "| 4 | 300 / 600 ms | 14.5 / 11.6 | 58.0 | 0 |" in text
    assert "`--decode-batch 8`" in text and "| 4 | 300 / 600 ms | 24.8 / 19.8 | 99.0 | 0 |" in text
    assert "With the Engine: not measured (boom)" in "\n".join(
        decoder_table({**dec, "engine": {"error": "boom"}}))
