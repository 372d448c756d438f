"""The model server: a published artifact answering HTTP from raw bytes.

``python -m pipeline.serve REF`` (``pipeline.cli.serve``) opens a registry ref or a run's folder
(``artifact``), and serves it with uvicorn and Starlette (``app``): raw PNG/JPEG bytes are checked
and decoded (``inputs``) and preprocessed as the artifact's evaluation preprocessed its samples
(the task's own ``from_image``), in worker processes; a dynamic batcher groups requests of one
shape class and runs the model on its own thread (``batcher``); the task decodes the outputs.
Prometheus metrics (``metrics``), a bounded queue (503 with Retry-After past it), bad input
answered 4xx in one line, a graceful drain on SIGTERM. ``load`` is the open-loop load generator
that measures it from raw bytes. ``readers`` is how each kind of artifact reads a request (an OCR
task's images, a Hugging Face encoder's text through its published tokenizer); ``generate`` serves
a decoder (tokens streamed as server-sent events, KV-cache admission); ``slo`` is
``slo.mode=serve``, the candidate served and judged at the end of a run.
"""
