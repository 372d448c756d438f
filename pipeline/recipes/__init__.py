"""Sequences of stages: the order of work (``main``), and the sub-recipes it branches to (INT8,
the mixed search, float regions, ``quant=auto``'s choice among roles, decoders, the pruning
preflight). Capabilities live below, in their own folders; nothing here computes on its own."""
