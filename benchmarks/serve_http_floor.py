"""The HTTP layer alone, for the serve bench's CPU bound: the server's stack (uvicorn with its
defaults, Starlette, the body read by the server's own ``_read_body`` under the same size limit)
answering ``POST /predict`` with a JSON body shaped like the server's answer (a prediction, the
model's name, the time of each stage), and no model, decoding or queue behind it. What one
request costs here is what any server from raw bytes pays before its model's work begins: reading
and parsing a request whose body is a 30 KB image, routing it, writing the answer.

``python -m benchmarks.serve_http_floor PORT_FILE``: serves on 127.0.0.1, a free port, written to
PORT_FILE once listening.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from pipeline.serve.app import _read_body
from pipeline.serve.config import ServeConfig

STAGES = ("decode", "preprocess", "queue", "inference", "postprocess", "total")


def app() -> Starlette:
    limit = ServeConfig().max_body_bytes

    async def predict(request: Request) -> JSONResponse:
        start = time.perf_counter()
        body = await _read_body(request, limit)
        elapsed = (time.perf_counter() - start) * 1000.0
        # an answer of the server's shape: a text line's prediction, the model, stage timings
        return JSONResponse({"prediction": f"{len(body):08d} chars of a recognised line",
                             "model": "ocr:int8-0123456789abcdef@sha256:" + "0" * 64,
                             "timing_ms": {k: round(elapsed, 4) for k in STAGES}})

    return Starlette(routes=[Route("/predict", predict, methods=["POST"])])


def main(argv: list) -> int:
    from benchmarks.serve_process import serve_announcing

    return serve_announcing(app(), Path(argv[0]))


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
