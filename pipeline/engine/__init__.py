"""The engine: overrides into a typed ``Config`` (compose), stages run through a cache that cannot
lie (runner), and timed stages on a Ray cluster (cluster). It knows no order of work."""
