"""Plain-integer host helpers for the launchers.

``triton.cdiv`` and ``triton.next_power_of_2`` are Triton "constexpr functions" in Triton 3.6:
callable from Python, but each host call goes through the wrapper that unwraps constexpr
arguments (about 5 µs per call measured on this project's 2-core CPU, Python 3.11, 2026-11-29,
against well under 1 µs here). A verify launch calls them several times, so the launchers use
these instead: same results for the non-negative integers they are given.
"""

from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for integers, ``b > 0`` (as ``triton.cdiv``)."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """Smallest power of two ``>= n`` for ``n >= 1``; 0 for ``n = 0`` (as
    ``triton.next_power_of_2``)."""
    return 1 << (n - 1).bit_length() if n > 0 else 0
