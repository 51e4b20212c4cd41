"""The launchers' plain-integer helpers give Triton's results (pmll_lab.ops.host)."""

import pmll_lab  # noqa: F401  (first: sets the interpreter on CPU)
import triton
from hypothesis import given, strategies as st

from pmll_lab.ops.host import cdiv, next_power_of_2


@given(st.integers(min_value=0, max_value=2**40))
def test_next_power_of_2_as_triton(n):
    assert next_power_of_2(n) == triton.next_power_of_2(n)


@given(st.integers(min_value=0, max_value=2**40), st.integers(min_value=1, max_value=2**20))
def test_cdiv_as_triton(a, b):
    assert cdiv(a, b) == triton.cdiv(a, b)


def test_numpy_integers_accepted():
    import numpy as np

    assert next_power_of_2(np.int64(100)) == 128 and cdiv(np.int32(129), np.int64(16)) == 9
