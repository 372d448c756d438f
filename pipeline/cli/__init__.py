"""The command lines: ``python -m pipeline`` (main), the decoder path (llm), sweeps, and the
registry and bill tools (``python -m pipeline.registry``, ``python -m pipeline.bill``, whose
``__main__`` modules only call in here)."""
