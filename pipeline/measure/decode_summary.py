"""One model's decode timing as decode_speed records it (``pipeline.measure.decode``'s
``DecodeTiming.summary``), read back by field: what the decoder's report shows per model.

A key the summary lacks (no step was timed, no prompt lengths were kept, an older run) is None
and stays absent when the record is written again (``pipeline.core.json_record``).
"""
from __future__ import annotations

from dataclasses import dataclass

from pipeline.core.json_record import omitted


@dataclass(frozen=True)
class DecodeSummary:
    streams: int | None = omitted()        # sequences decoded together
    new_tokens: int | None = omitted()     # generated per prompt
    tokens_per_s: float | None = omitted()
    generations: int | None = omitted()
    steps: int | None = omitted()          # per-token latencies measured
    token_ms_p50: float | None = omitted()
    token_ms_p99: float | None = omitted()
    ttft_ms_p50: float | None = omitted()  # time to first token
    ttft_ms_p99: float | None = omitted()
    ttft_ms_by_prompt_tokens: dict | None = omitted()  # prompt length -> median TTFT


NOT_TIMED = DecodeSummary()
