"""The server's preprocessing workers (``pipeline.serve.workers``): what a worker sends back must
be something the server can rebuild, or one bad exception would end the link and every request
on that worker with it. The workers themselves are driven end to end in ``test_serve.py``."""
from __future__ import annotations

from pipeline.serve.inputs import BadInput
from pipeline.serve.workers import _portable


class NeedsTwo(Exception):
    def __init__(self, a, b):  # pickled with args=("a b",): unpickling calls NeedsTwo("a b")
        super().__init__(f"{a} {b}")


def test_an_exception_the_server_cannot_rebuild_goes_back_as_one_line():
    sent = _portable(NeedsTwo("bad", "bytes"))
    assert type(sent) is RuntimeError and str(sent) == "NeedsTwo: bad bytes"


def test_a_bad_input_goes_back_as_it_is():
    error = BadInput(415, "not an image")
    assert _portable(error) is error
