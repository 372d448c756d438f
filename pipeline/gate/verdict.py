"""The gate's answer: each check with its value, limit and verdict, and what it was judged against.

In: the checks ``pipeline.gate.judge`` made. Out: a ``Verdict`` that recipes, the reports, the
manifest and the command line read by field, and ``as_dict`` for the JSON a run writes
(``verdict.json``, ``report.json``: the shape every earlier run wrote, which sweeps and the
server read back). Hints (which other artifact would pass) are added by the recipe's tail and
join the summary line; they never change the outcome.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Check:
    name: str        # accuracy_drop, speedup_ci_low, ... (stable: sweeps and reports key on it)
    value: float | None  # None: no valid measurement, and the check failed closed
    limit: object
    passed: bool
    detail: str

    @classmethod
    def of(cls, name: str, value, limit, ok, detail: str, missing: str = "") -> Check:
        """A check that fails closed: a missing or non-finite value fails, whatever ``ok``, and
        its detail says which measurement was absent (``missing``) when it is known."""
        finite = (isinstance(value, (int, float)) and not isinstance(value, bool)
                  and math.isfinite(value))
        return cls(name, value if finite else None, limit, bool(finite and ok(value)),
                   detail if finite else
                   f"{name}: {missing or 'no valid measurement'} (fails closed)")

    def as_dict(self) -> dict:
        return {"check": self.name, "value": self.value, "limit": self.limit,
                "passed": self.passed, "detail": self.detail}


@dataclass
class Verdict:
    checks: list                     # Check, in the order they were judged
    reference: str = "FP16"          # what the accuracy was judged against, as the details name it
    hints: list = field(default_factory=list)  # which other artifact would pass, and how to get it
    served: dict | None = None       # slo.mode=serve: the served load's measurement (serve/slo.py)

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    @property
    def failed(self) -> list:
        """The names of the checks that failed."""
        return [c.name for c in self.checks if not c.passed]

    @property
    def summary(self) -> str:
        line = "PASS" if self.passed else "FAIL: " + "; ".join(
            c.detail for c in self.checks if not c.passed)
        return line + "".join(f"; hint: {h}" for h in self.hints)

    def check(self, name: str) -> Check | None:
        return next((c for c in self.checks if c.name == name), None)

    def add_hint(self, hint: str) -> None:
        self.hints.append(hint)

    def as_dict(self) -> dict:
        out = {"passed": self.passed, "checks": [c.as_dict() for c in self.checks],
               "summary": self.summary, "reference": self.reference}
        if self.hints:
            out["hint"] = "; ".join(self.hints)
        if self.served is not None:
            out.update(served=self.served)
        return out
