"""The naive baseline ``make bench``'s serve section compares the server with: one FastAPI handler
per request, as a first service is written. The handler (a plain ``def``, so FastAPI runs it in
its thread pool) decodes the bytes, preprocesses them, runs the model on a session with ONNX
Runtime's default threads and decodes the text, all on the request's thread: no worker
processes, no batching, no queue bound, no input checks beyond what Pillow raises.

``python -m benchmarks.serve_naive MODEL.onnx PORT_FILE``: serves on 127.0.0.1, a free port,
written to PORT_FILE once listening.
"""
# No ``from __future__ import annotations``: FastAPI reads the handler's annotations at runtime,
# and ``Request`` must be a class there, not a string, or it becomes a query parameter (422).
import io
import sys
import time
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse


def app_for(model: Path):
    import onnxruntime as ort
    from PIL import Image

    from pipeline.models.ocr import crnn

    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    app = FastAPI()

    @app.post("/predict")
    def predict(request: Request):
        import anyio

        body = anyio.from_thread.run(request.body)
        start = time.perf_counter()
        image = Image.open(io.BytesIO(body))
        image.load()
        feeds = {name: crnn.from_image(image)}
        logits = session.run(None, feeds)[0]
        text = crnn.decode(logits)[0]
        return JSONResponse({"prediction": text,
                             "timing_ms": {"total": (time.perf_counter() - start) * 1000.0}})

    return app


def main(argv: list) -> int:
    from benchmarks.serve_process import serve_announcing

    return serve_announcing(app_for(Path(argv[0])), Path(argv[1]))


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
