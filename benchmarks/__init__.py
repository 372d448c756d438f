"""``make bench``: the numbers the issues ask for, measured side by side with peers, written to
``bench.json`` (``run``), and the results page generated from it (``results``). Lives outside the
``pipeline`` package: the harness is not part of the library it measures."""
