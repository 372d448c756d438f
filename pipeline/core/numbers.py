"""Numbers as a person reads them: the text of a table cell for every kind of measured value.

In: a number (or a structure of numbers) and what kind it is. Out: a short string with its unit,
rounded to what the measurement can tell: ``1.67x (CI 1.56-1.72)``, ``3.32 ms``, ``99.50 %``,
``0.05 points``, ``0.9998``, ``6.27 MB``, ``1,234``. Used by the run report (``report.md``) and
by the results page that ``make bench`` renders from ``bench.json`` (``benchmarks/results.py``),
so one value reads the same in both.

``readable`` renders a value whose kind is not declared (the results page's targets are plain
JSON: a number, a list, a dict of named numbers): its shape says some of it (a dict with
``median`` and ``ci95`` is a ratio with its interval), the words around it say the rest (a dict
key ``p50_ms``, a target named "... >= 1.8x faster ..."); anything else is a plain number. It never
prints JSON: a structure becomes named values, so a section added tomorrow still reads.
"""
from __future__ import annotations

import math
import re

NONE = "—"  # no value: not measured, not applicable


def _missing(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def number(v, decimals: int | None = None) -> str:
    """A plain number: integers with thousands separators; floats to two decimals from 1 to
    100 (99.50 and 1.00 keep their second digit: it is what tells two accuracies or ratios
    apart), one decimal to 1,000, none above; three significant digits below 1."""
    if _missing(v):
        return NONE
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if math.isinf(v):
        return "∞" if v > 0 else "-∞"
    if decimals is not None:
        return f"{v:,.{decimals}f}"
    a = abs(v)
    if a == 0:
        return "0"
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 100:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.3g}"


def ratio(median, ci=None) -> str:
    """A speedup or any ratio of two timings, with its 95 % interval when there is one."""
    if _missing(median):
        return NONE
    text = f"{median:.2f}x"
    if ci is not None and len(ci) == 2 and not any(_missing(c) for c in ci):
        text += f" (CI {ci[0]:.2f}-{ci[1]:.2f})"
    return text


def ms(v) -> str:
    """Milliseconds (latencies): two decimals below 100 ms, where sub-millisecond models live."""
    return NONE if _missing(v) else f"{number(float(v))} ms"


def seconds(v) -> str:
    return NONE if _missing(v) else f"{number(float(v))} s"


def percent(v, fraction: bool = False) -> str:
    """A percentage, two decimals (99.50 %); ``fraction``: ``v`` is a share of 1 (0.995)."""
    if _missing(v):
        return NONE
    return f"{100 * v if fraction else v:.2f} %"


def points(v) -> str:
    """A difference of two percentages (an accuracy drop), in percentage points."""
    return NONE if _missing(v) else f"{v:.2f} points"


def in_unit(v, unit: str = "%") -> str:
    """A metric's value in its own unit: a percentage with two decimals and its sign (87.50 %),
    anything else (a cosine, a rank correlation) with four, where its drops live."""
    if _missing(v):
        return NONE
    return f"{v:.2f} %" if unit == "%" else f"{v:.4f}"


def drop_in_unit(v, unit: str = "%") -> str:
    """A metric's drop: points of a percentage (0.05 points), else four decimals (0.0096)."""
    return points(v) if unit == "%" else (NONE if _missing(v) else f"{v:.4f}")


def cosine(v) -> str:
    """A cosine similarity: four decimals, since 0.99 and 0.9999 are very different models."""
    return NONE if _missing(v) else f"{v:.4f}"


def size(nbytes) -> str:
    """A size in bytes, in decimal units (a model file of 6,270,000 bytes reads 6.27 MB)."""
    if _missing(nbytes):
        return NONE
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{int(nbytes)} B"


def megabytes(mb) -> str:
    return NONE if _missing(mb) else size(mb * 1e6)


def count(n) -> str:
    return NONE if _missing(n) else f"{int(round(n)):,}"


def rate(v) -> str:
    """Requests (or items) per second."""
    return NONE if _missing(v) else f"{number(float(v))}/s"


def is_ratio_ci(v) -> bool:
    """The shape every timing comparison is stored in: median of per-round ratios and its CI."""
    return isinstance(v, dict) and "median" in v and "ci95" in v


# --- values of undeclared kind -------------------------------------------------------------

_FORMATS = {"ratio": ratio, "ms": ms, "seconds": seconds, "percent": percent, "points": points,
            "cosine": cosine, "megabytes": megabytes, "rate": rate}

# What a target's name says about its number, first match wins. Only words that name a unit
# without doubt: "within 3 %" does not (an A/A ratio and a spread are both written so).
_LABEL_KINDS = [
    ("cosine", re.compile(r"\bcosine\b", re.I)),
    ("ratio", re.compile(r"\d(?:\.\d+)?x\b|\bspeedup\b|\bfaster\b|\bslower\b|\bA/A\b|\bratio\b",
                         re.I)),
    ("points", re.compile(r"\bpoints?\b", re.I)),
    ("percent", re.compile(r"\(% of\b")),
    ("ms", re.compile(r"\bms\b|\bmilliseconds\b", re.I)),
    ("rate", re.compile(r"\bQPS\b")),
    ("seconds", re.compile(r"\d\s?s\b")),
]

# What a dict key says about its value (keys are snake_case: p50_ms, rss_mb, peer_cosine, ...).
_KEY_KINDS = [
    ("cosine", re.compile(r"cosine")),
    ("ratio", re.compile(r"_vs_|speedup|ratio")),
    ("ms", re.compile(r"(^|_)ms$|^p\d+$")),
    ("rate", re.compile(r"qps|_per_s(ec|econd)?$")),
    ("seconds", re.compile(r"(^|_)(seconds|s)$")),
    ("megabytes", re.compile(r"(^|_)mb$")),
    ("points", re.compile(r"(^|_)(drop|points)(_|$)")),
    ("percent", re.compile(r"percent|(^|_)pct$")),
]


def kind_of(label: str, rules=_LABEL_KINDS) -> str | None:
    """The kind of number a label names (``ratio``, ``ms``, ...), or None."""
    for kind, pattern in rules:
        if pattern.search(label or ""):
            return kind
    return None


def _item_names(label: str, n: int) -> list[str] | None:
    """The names a label gives a list's items: "... (before, after)" or "... of fp32, fp16,
    candidate"; None unless it names exactly ``n``."""
    for pattern in (r"\(([^()]+)\)\s*$", r"\bof ([^:()]+)$"):
        m = re.search(pattern, label or "")
        if m:
            names = [s.strip() for s in m.group(1).split(",")]
            if len(names) == n > 1 and all(names):
                return names
    return None


def _scalar(v, kind: str | None) -> str:
    if _missing(v):
        return NONE
    if isinstance(v, bool) or isinstance(v, str):
        return number(v) if isinstance(v, bool) else v
    if kind and isinstance(v, (int, float)) and not (kind == "ratio" and isinstance(v, int)):
        return _FORMATS[kind](v)
    return number(v)


def readable(v, label: str = "", kind: str | None = None, _depth: int = 0,
             _in_list: bool = False) -> str:
    """Any measured value as text: a ratio with its CI, named values for a dict, the items of a
    list (named when ``label`` names them), a number in the unit ``kind`` or the label names."""
    if kind is None and _depth == 0:
        kind = kind_of(label)
    if is_ratio_ci(v):
        return ratio(v["median"], v.get("ci95"))
    if isinstance(v, dict):
        if not v:
            return NONE
        parts = []
        for k, x in v.items():
            name = str(k).replace("_", " ")
            # inside a named group its name decides (peer_cosine: mean, p1, min are cosines)
            sub = (kind if _depth else None) or kind_of(str(k).lower(), _KEY_KINDS)
            text = readable(x, "", sub, _depth + 1)
            nested = isinstance(x, (dict, list)) and not is_ratio_ci(x)
            parts.append(f"{name} ({text})" if nested else f"{name} {text}")
        return ("; " if _depth == 0 else ", ").join(parts)
    if isinstance(v, (list, tuple)):
        if not v:
            return NONE
        items = [readable(x, "", kind, _depth + 1, True) for x in v]
        names = _item_names(label, len(v)) if _depth == 0 else None
        if names:
            return ", ".join(f"{n} {t}" for n, t in zip(names, items))
        return (" / " if _in_list else ", ").join(items)  # a list of pairs: 1 / 2, 3 / 4
    return _scalar(v, kind)
