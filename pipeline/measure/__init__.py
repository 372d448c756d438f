"""Measuring on the target: timing with confidence intervals (``timing``), the CPU state a
measurement ran in (``corestate``), cold start (``coldstart``) and the serving-side load test
(``serving``). Stages call these; nothing here chooses what to measure."""
