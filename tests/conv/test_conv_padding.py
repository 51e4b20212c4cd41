"""Padding lanes (slot -1) in every conv launcher: update, chain, carry verify, flush, accept.

As for the GDN kernels (tests/gdn/test_padding.py): a lane whose slot is -1 reads and writes no
window, intermediate window, stash or ``pend``; its outputs are zeros; every live lane gives the
bits it gives without the padding lane. Windows, stashes and ``pend`` live inside larger
sentinel-filled buffers, so a write through slot -1 (just before slot 0) shows up.
"""

from __future__ import annotations

import pytest
import torch

import pmll_lab  # noqa: F401  (first: picks GPU or the Triton interpreter)
from pmll_lab.backend import DEVICE
from pmll_lab.bench import bitwise_equal
from pmll_lab.carry import carry_accept
from pmll_lab.conv import ConvCarry, conv_carry_flush, conv_carry_verify, conv_chain, conv_update
from pmll_lab.inputs import conv_inputs

S, DIM, HEAD = 4, 48, 16
SLOTS_PAD = [2, -1, 0]
LIVE = [0, 2]
KW = dict(qk_channels=32, head_dim=HEAD)


def _idx(slots):
    return torch.tensor(slots, dtype=torch.int32, device=DEVICE)


def _guarded(t: torch.Tensor, fill):
    big = torch.full((t.shape[0] + 2, *t.shape[1:]), fill, dtype=t.dtype, device=t.device)
    big[1:-1] = t
    return big[1:-1], big


def _guards_intact(*pairs):
    for big, fill in pairs:
        assert bool((big[0] == fill).all()) and bool((big[-1] == fill).all()), "guard written"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("K", [1, 3])
def test_update_and_chain_padding_lane(dtype, K):
    c = conv_inputs(71, 3, DIM, rows=K, slots=S, dtype=dtype)
    a, big = _guarded(c["conv_state"], 77.0)
    b = c["conv_state"].clone()
    w, bias = c["weight"], c["bias"]
    if K == 1:
        x = c["x"][:, 0].contiguous()
        y = conv_update(a, x, w, bias, state_indices=_idx(SLOTS_PAD), validate=True, **KW)
        want = conv_update(b, x[LIVE], w, bias, state_indices=_idx([2, 0]), **KW)
    else:
        inter = torch.full((3, K - 1, DIM, a.shape[2]), 5.0, dtype=dtype, device=DEVICE)
        y = conv_chain(a, c["x"], w, bias, state_indices=_idx(SLOTS_PAD), intermediate=inter,
                       validate=True, **KW)
        inter2 = torch.empty(2, K - 1, DIM, a.shape[2], dtype=dtype, device=DEVICE)
        want = conv_chain(b, c["x"][LIVE], w, bias, state_indices=_idx([2, 0]),
                          intermediate=inter2, **KW)
        assert bitwise_equal(inter[LIVE], inter2)
        assert bool((inter[1] == 5.0).all()), "a padding lane wrote intermediate windows"
    assert bitwise_equal(y[LIVE], want), "live outputs changed by the padding lane"
    assert bool((y[1] == 0).all()), "padding lane outputs must be zeros"
    assert bitwise_equal(a, b), "windows"
    _guards_intact((big, 77.0))


def _carry(seed, dtype):
    gen = torch.Generator().manual_seed(seed)
    stash, sbig = _guarded(torch.randn(S, 8, DIM, generator=gen).to(dtype).to(DEVICE), 55.0)
    pend, pbig = _guarded(torch.tensor([3, 1, 5, 2], dtype=torch.int32, device=DEVICE), 99)
    return ConvCarry(stash, pend), sbig, pbig


@pytest.mark.parametrize("lazy", [False, True])
def test_carry_verify_accept_flush_padding_lane(lazy):
    K, dtype = 4, torch.bfloat16
    c = conv_inputs(72, 3, DIM, rows=K, slots=S, dtype=dtype)
    a, big = _guarded(c["conv_state"], 77.0)
    b = c["conv_state"].clone()
    ca, sbig, pbig = _carry(73, dtype)
    cb = ConvCarry(ca.stash.clone(), ca.pend.clone())
    w, bias = c["weight"], c["bias"]
    y, eng = conv_carry_verify(a, ca, c["x"], w, bias, slot_tab=_idx(SLOTS_PAD), lazy=lazy,
                               validate=True, **KW)
    live_idx = _idx([SLOTS_PAD[i] for i in LIVE])
    want, eng2 = conv_carry_verify(b, cb, c["x"][LIVE], w, bias, slot_tab=live_idx, lazy=lazy,
                                   **KW)
    assert bitwise_equal(y[LIVE], want) and bitwise_equal(eng[LIVE], eng2)
    assert bool((y[1] == 0).all()) and int(eng[1]) == 1
    assert bitwise_equal(a, b) and bitwise_equal(ca.stash, cb.stash)
    assert bitwise_equal(ca.pend, cb.pend)
    acc = torch.tensor([2, 3, 4], dtype=torch.int32, device=DEVICE)
    carry_accept(ca, _idx(SLOTS_PAD), eng, acc, rows=K, validate=True)
    carry_accept(cb, live_idx, eng2, acc[LIVE].contiguous(), rows=K)
    assert bitwise_equal(ca.pend, cb.pend), "accept touched a pend through the padding lane"
    conv_carry_flush([a], [ca], _idx(SLOTS_PAD), validate=True)
    conv_carry_flush([b], [cb], live_idx)
    assert bitwise_equal(a, b), "flush"
    _guards_intact((big, 77.0), (sbig, 55.0), (pbig, 99))


def test_only_minus_one_is_padding():
    c = conv_inputs(74, 2, DIM, slots=S)
    args = (c["conv_state"], c["x"], c["weight"], c["bias"])
    for bad in ([-2, 0], [0, S], [1, 1]):
        with pytest.raises(ValueError, match="state_indices"):
            conv_update(*args, state_indices=_idx(bad), validate=True, **KW)
    carry = ConvCarry.empty(S, DIM)
    for bad in ([-2, 0], [0, S]):
        with pytest.raises(ValueError, match="slot_tab"):
            conv_carry_verify(c["conv_state"], carry, c["x"][:, None], c["weight"], c["bias"],
                              slot_tab=_idx(bad), validate=True, **KW)
        with pytest.raises(ValueError, match="slot_tab"):
            conv_carry_flush([c["conv_state"]], [carry], _idx(bad), validate=True)
    conv_update(*args, state_indices=_idx([-1, -1]), validate=True, **KW)
