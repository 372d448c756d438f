"""The built-in OCR tasks: a CRNN line recognizer (``crnn``) and a MobileNetV3-style one
(``mobile``), their generated data (``data``), networks (``net``, ``mobile_net``), CTC decoding
(``decode``), pruning helpers (``prune``) and training (``train``); ``task`` is both tasks as
implementations of the task contract (``pipeline.task.contract``)."""
