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
import threading
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
    import uvicorn

    port_file = Path(argv[0])
    server = uvicorn.Server(uvicorn.Config(app(), host="127.0.0.1", port=0, log_level="warning",
                                           access_log=False))

    def announce():
        while not (server.started and server.servers):
            time.sleep(0.05)
        port_file.write_text(str(server.servers[0].sockets[0].getsockname()[1]))

    threading.Thread(target=announce, daemon=True).start()
    server.run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
