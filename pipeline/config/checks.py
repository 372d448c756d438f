"""Checks every config group shares: numbers that must be finite, counts that must be positive.

In: a config dataclass. Out: nothing, or a ``ConfigError`` naming the field, its value and what it
must be. Why ``finite`` exists: every comparison with NaN is false, so a range check alone lets
NaN and infinity through.
"""
from __future__ import annotations

import dataclasses
import math

from pipeline.core.errors import ConfigError


def finite(obj, path: str = "") -> None:
    """Refuse NaN and infinity in any float of a config tree (lists included)."""
    for f in dataclasses.fields(obj):
        value, key = getattr(obj, f.name), f"{path}{f.name}"
        if dataclasses.is_dataclass(value):
            finite(value, f"{key}.")
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(v, float) and not math.isfinite(v):
                raise ConfigError(f"{key}={value}: must be a finite number")


def positive(obj, group: str, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if value <= 0:
            raise ConfigError(f"{group}.{name}={value}: must be a positive integer")
