"""How many of the ranked units the mixed search keeps float: the smallest prefix that passes.

In: the number of ranked units ``n``, a test ``passes(k)`` (is the model with the top ``k`` units
float within the accuracy budget? one full evaluation each) that is monotone enough to search
(more float never hurts much), and ``stop()`` (the time budget is spent). Out: the smallest
passing ``k`` found, or None; every ``k`` tried is the caller's to record.

Why galloping, not plain bisection over ``0..n``: a ranking that works puts the few units that
matter first, so the answer is usually a handful of units out of dozens or hundreds. Bisection
always pays about log2(n) full evaluations, starting with half the network float; galloping
tries 1, 2, 4, ... units, then bisects between the last failing and the first passing try: about
2·log2(k) evaluations for an answer ``k``, and never more than ``limit(n)``. With 68 units and
an answer of 3 (the bench's 64-block network) that is 4 evaluations (1, 2, 4, 3) where bisection
spent 6 (34, 17, 8, 4, 2, 3). Computes only: no stage, runner or recipe here.
"""
from __future__ import annotations

import math
from typing import Callable


def smallest_passing(n: int, passes: Callable[[int], bool],
                     stop: Callable[[], bool] = lambda: False) -> int | None:
    """The smallest ``k`` in ``1..n`` with ``passes(k)``, knowing ``passes(0)`` is False: tries
    1, 2, 4, ... (capped at ``n``), then bisects between the last failing and the first passing
    ``k``. ``stop()`` is asked before each try; once it says stop, the smallest passing ``k``
    tried so far comes back (None if none passed)."""
    lo, hi, k = 0, None, 1
    while hi is None:
        if k > n or stop():
            return None
        if passes(k):
            hi = k
        elif k == n:
            return None
        else:
            lo, k = k, min(2 * k, n)
    while hi - lo > 1 and not stop():
        mid = (lo + hi) // 2
        if passes(mid):
            hi = mid
        else:
            lo = mid
    return hi


def limit(n: int) -> int:
    """The most tries ``smallest_passing`` makes for ``n`` units: ceil(log2 n) + 1 doublings,
    then a bisection over the last doubling's half (ceil(log2 n) - 1 more at most)."""
    if n <= 1:
        return n
    return 2 * math.ceil(math.log2(n))
