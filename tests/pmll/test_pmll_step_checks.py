"""``pmll_step`` argument checks: gate values under ``validate=True`` and which tensor a head-size
mismatch is blamed on. Every refused call must leave the ring bitwise as it was."""

from __future__ import annotations

import pytest
import torch

import pmll_lab  # noqa: F401  (first: picks GPU or the Triton interpreter)
from pmll_lab.bench import bitwise_equal
from pmll_lab.inputs import pmll_inputs
from pmll_lab.pmll import RingMemory, memory_attention, pmll_step, pmll_write

B, H, M, D, T = 2, 2, 5, 16, 3


def _ring(seed):
    """A ring holding one random segment, so a refused write would show."""
    x = pmll_inputs(seed, B, H, T, D)
    mem = RingMemory.empty(B, H, M, D)
    pmll_write(mem, x["k_new"], x["v_new"])
    return mem


@pytest.mark.parametrize("gate_shape", ["bt", "bht"])
def test_pmll_step_validate_rejects_gate_values(gate_shape):
    x = pmll_inputs(601, B, H, T, D, gate=gate_shape)
    mem = _ring(602)
    before = mem.clone()
    for value in (2.0, -0.5, float("nan"), float("inf")):
        gate = x["gate"].clone()
        gate.view(-1)[1] = value
        with pytest.raises(ValueError, match="^gate"):
            pmll_step(mem, x["q"], x["k_new"], x["v_new"], gate, validate=True,
                      impl="reference")
        for name in ("k", "v", "count"):
            assert bitwise_equal(getattr(mem, name), getattr(before, name)), name
    # in-range gates pass and give what the unchecked call gives
    other = mem.clone()
    o1 = pmll_step(mem, x["q"], x["k_new"], x["v_new"], x["gate"], validate=True,
                   impl="reference")
    o2 = pmll_step(other, x["q"], x["k_new"], x["v_new"], x["gate"], impl="reference")
    assert bitwise_equal(o1, o2) and bitwise_equal(mem.k, other.k)
    assert mem.count.tolist() == [2 * T] * B


@pytest.mark.parametrize("impl", ["reference", "fused"])
def test_head_size_mismatch_names_q(impl):
    x = pmll_inputs(611, B, H, T, D)
    mem = _ring(612)
    before = mem.clone()
    q, k, v = x["q"], x["k_new"], x["v_new"]
    half = q[..., :D // 2]
    with pytest.raises(ValueError, match=r"^q: .*\(2, 2, 8\).*memory's and k_ctx's \(2, 2, 16\)"):
        memory_attention(half, k, v, mem, impl=impl)
    with pytest.raises(ValueError, match=r"^q: "):
        pmll_step(mem, half, k, v, impl=impl)
    with pytest.raises(ValueError, match=r"^q: "):             # q's heads differ
        pmll_step(mem, q[:, :1], k, v, impl=impl)
    with pytest.raises(ValueError, match=r"^k: "):              # q right, k wrong
        pmll_step(mem, q, k[..., :D // 2], v, impl=impl)
    with pytest.raises(ValueError, match=r"^mem: "):            # q, k, v agree, the ring not
        pmll_step(RingMemory.empty(B, H, M, 2 * D), q, k, v, impl=impl)
    assert bitwise_equal(mem.k, before.k) and mem.count.tolist() == before.count.tolist()


@pytest.mark.parametrize("validate", ["no", None, 1])
def test_pmll_step_refuses_a_non_bool_validate_without_a_ring_too(validate):
    x = pmll_inputs(3, 2, 2, 3, 16, dtype=torch.float32)
    with pytest.raises(ValueError, match=r"^validate: expected a bool"):
        pmll_step(None, x["q"], x["k_new"], x["v_new"], validate=validate)
