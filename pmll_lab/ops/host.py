"""Plain-integer host helpers for the launchers.

``triton.cdiv`` and ``triton.next_power_of_2`` are Triton "constexpr functions" in Triton 3.6:
callable from Python, but each host call goes through the wrapper that unwraps constexpr
arguments (about 5 µs per call measured on this project's 2-core CPU, Python 3.11, 2026-11-29,
against well under 1 µs here). A verify launch calls them several times, so the launchers use
these instead: same results for the non-negative integers they are given.
"""

from __future__ import annotations

import operator


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for integers (any ``__index__`` type: int, NumPy ints), ``b > 0`` (as
    ``triton.cdiv``). Raises ``TypeError`` for a non-integer."""
    return -(-operator.index(a) // operator.index(b))


def next_power_of_2(n: int) -> int:
    """Smallest power of two ``>= n`` for ``n >= 1``; 0 for ``n = 0`` (as
    ``triton.next_power_of_2``); any ``__index__`` type. Raises ``TypeError`` for a
    non-integer."""
    n = operator.index(n)
    return 1 << (n - 1).bit_length() if n > 0 else 0
