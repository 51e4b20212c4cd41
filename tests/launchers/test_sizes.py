"""The byte-size helpers (``pmll_lab.sizes``, re-exported by ``pmll_lab.gdn``, ``pmll_lab.carry``
and the roofline experiment) against the bytes real tensors hold (``numel * element_size``),
for every state dtype, and their argument checks (``ValueError`` naming the argument)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import pmll_lab  # noqa: F401  (backend first)
from pmll_lab import carry as C, gdn as G, sizes as Z
from pmll_lab.backend import DEVICE
from pmll_lab.carry import GdnCarry, gdn_carry_verify
from pmll_lab.conv import conv_carry_verify_bytes, conv_chain_bytes
from pmll_lab.experiments import roofline as E
from pmll_lab.gdn import gdn_chain
from pmll_lab.inputs import gdn_inputs
from pmll_lab.pmll import read_bytes, write_bytes

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def nbytes(*ts) -> int:
    return sum(t.numel() * t.element_size() for t in ts)


def test_one_set_everywhere():
    """The library's names are the helpers of ``pmll_lab.sizes`` wherever they are imported."""
    assert G.state_bytes is Z.state_bytes and G.snapshot_bytes is Z.snapshot_bytes
    assert G.carry_stash_bytes is Z.stash_bytes_per_slot is C.stash_bytes_per_slot
    assert C.snapshot_bytes_per_slot is Z.snapshot_bytes_per_slot
    assert E.carry_bytes is Z.carry_bytes and E.stash_row_bytes is Z.stash_row_bytes
    assert C.GDN_CARRY_CAP == Z.CARRY_CAP == 8


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
def test_state_and_snapshot_bytes_are_what_the_buffers_hold(dtype):
    S, B, K, HV, kd, vd = 5, 3, 4, 4, 16, 32
    for shape in ((S, HV, kd, vd), (S, HV, vd, kd)):          # K-major and V-major pools
        pool = torch.empty(shape, dtype=dtype)
        assert S * G.state_bytes(HV, kd, vd, dtype) == nbytes(pool)
    inter = torch.empty(B, K - 1, HV, kd, vd, dtype=dtype)  # what gdn_chain's intermediate is
    assert B * C.snapshot_bytes_per_slot(HV, kd, vd, K, dtype) == nbytes(inter)
    assert B * G.snapshot_bytes(K, HV, kd, vd, dtype) == nbytes(inter)
    assert C.snapshot_bytes_per_slot(HV, kd, vd, 1, dtype) == 0
    # the case: a bf16 pool's snapshots counted at its own width
    if dtype == torch.bfloat16:
        assert C.snapshot_bytes_per_slot(4, 16, 16, 4, torch.bfloat16) == 6144


def test_the_snapshot_shape_counted_is_the_one_the_chain_takes():
    x = gdn_inputs(1, 2, 1, 2, 16, 16, rows=3, slots=2, dtype=torch.float32, state_layout="kv")
    st = x["state"].to(torch.bfloat16)
    inter = torch.zeros(2, 2, 2, 16, 16, dtype=torch.bfloat16, device=DEVICE)
    gdn_chain(st, x["q"], x["k"], x["v"], x["g"], x["beta"], state_indices=x["state_indices"],
              intermediate=inter, state_layout="kv")
    assert nbytes(inter) == 2 * C.snapshot_bytes_per_slot(2, 16, 16, 3, torch.bfloat16)


def test_stash_bytes_are_what_the_carry_holds():
    c = GdnCarry.empty(3, 4, 16, 32, cap=6)
    assert C.stash_bytes_per_slot(4, 16, 32, 6) == nbytes(c.buf[0]) == c.stash_bytes_per_slot
    assert c.bytes == nbytes(c.buf, c.pend)
    assert Z.stash_row_bytes(4, 16, 32) == nbytes(c.u[0, 0], c.g[0, 0], c.k[0, 0])
    assert G.carry_stash_bytes(4, 16, 32) == nbytes(GdnCarry.empty(1, 4, 16, 32).buf)


@pytest.mark.parametrize("state_dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
def test_carry_verify_bytes_count_the_tensors_a_verify_touches(state_dtype):
    """A verify of ``K`` rows on 3 sequences with pending counts ``p``, one writing back: the
    slots' states read, one written, the ``p`` pending and ``K`` new stash rows, the rows'
    inputs and outputs, and slot / pend / engaged, summed from the tensors themselves."""
    B, K, HK, HV, D = 3, 2, 1, 2, 16
    x = gdn_inputs(3, B, HK, HV, D, D, rows=K, slots=4, dtype=torch.bfloat16, state_layout="kv")
    st = x["state"].to(state_dtype)
    c = GdnCarry.empty(4, HV, D, D, state_layout="kv")
    sl = x["state_indices"]
    pend, wb = np.array([0, 3, 7]), np.array([False, False, True])
    o, e = gdn_carry_verify(st, c, x["q"], x["k"], x["v"], x["g"], x["beta"], slot_tab=sl,
                            state_layout="kv")
    touched = sum(nbytes(st[s]) for s in sl.tolist()) + nbytes(st[0]) * int(wb.sum())
    rows = int(pend.sum()) + B * K
    touched += rows * nbytes(c.u[0, 0], c.g[0, 0], c.k[0, 0])
    touched += nbytes(x["q"], x["k"], x["v"], x["g"], x["beta"], o)
    touched += nbytes(sl, c.pend[sl.long()], e)
    got = Z.carry_verify_bytes(pend, wb, K, HK, HV, D, D, torch.bfloat16, state_dtype)
    assert got == touched
    assert E.carry_bytes(pend, wb, K, HK, HV, D, torch.bfloat16, state_dtype) == got


def test_decode_and_chain_bytes_count_their_tensors():
    B, K, HK, HV, D = 2, 3, 1, 2, 16
    x = gdn_inputs(4, B, HK, HV, D, D, rows=K, slots=2, dtype=torch.bfloat16, state_layout="kv")
    st = x["state"]
    o = torch.empty(B, K, HV, D, dtype=torch.bfloat16)
    inter = torch.empty(B, K - 1, HV, D, D)
    rows = nbytes(x["q"], x["k"], x["v"], x["g"], x["beta"], o)
    want = 2 * nbytes(st) + nbytes(inter) + rows + nbytes(x["state_indices"])
    assert G.chain_bytes(B, K, HK, HV, D, D, torch.bfloat16) == want
    assert G.decodes_bytes(B, K, HK, HV, D, D) == K * G.decode_bytes(B, HK, HV, D, D)
    assert G.decode_bytes(B, HK, HV, D, D) == 2 * nbytes(st) + rows // K + 4 * B


def test_bad_arguments_are_named():
    cases = [
        (lambda: C.snapshot_bytes_per_slot(4, 16, 16, 0), r"^rows: must be >= 1, got 0"),
        (lambda: C.snapshot_bytes_per_slot(4, 16, 16, -2), r"^rows: must be >= 1"),
        (lambda: G.carry_stash_bytes(4, 16, 16, cap=-1), r"^cap: must be >= 1, got -1"),
        (lambda: C.stash_bytes_per_slot(0, 16, 16), r"^num_v_heads: must be >= 1"),
        (lambda: G.state_bytes(4, 16, 16, "bfloat16"), r"^state_dtype: must be one of"),
        (lambda: G.state_bytes(4, 16, 16, torch.int32), r"^state_dtype: must be one of"),
        (lambda: G.state_bytes(4, 16.0, 16), r"^k_dim: expected an int"),
        (lambda: G.state_bytes(True, 16, 16), r"^num_v_heads: expected an int"),
        (lambda: G.decode_bytes(-1, 1, 2, 16, 16), r"^batch: must be >= 0"),
        (lambda: G.row_io_bytes(1, 2, 16, 16, torch.float64), r"^dtype: must be one of"),
        (lambda: G.row_io_bytes(1, 2, 16, 16, out_dtype=torch.int8), r"^out_dtype: "),
        (lambda: G.chain_bytes(2, 0, 1, 2, 16, 16), r"^rows: must be >= 1"),
        (lambda: Z.carry_verify_bytes([0, 9], [False, True], 2, 1, 2, 16, 16),
         r"^pend: entries must lie in \[0, 8\]"),
        (lambda: Z.carry_verify_bytes([0, 1], [False], 2, 1, 2, 16, 16), r"^write_back: "),
        (lambda: Z.carry_verify_bytes([0.5], [False], 2, 1, 2, 16, 16), r"^pend: expected"),
        (lambda: E.carry_bytes([1], [True], 0, 1, 2, 16, torch.bfloat16), r"^rows: must be"),
        (lambda: conv_chain_bytes(2, 0, 64), r"^rows: must be >= 1"),
        (lambda: conv_chain_bytes(2, 2, 64, dtype="bf16"), r"^dtype: must be one of"),
        (lambda: conv_carry_verify_bytes(2, 2, 64, write_back=1.5), r"^write_back: must be"),
        (lambda: conv_carry_verify_bytes(2, 2, 64, pending=-1), r"^pending: must be"),
        (lambda: write_bytes(1, 1, 0, 16, 4, dtype=torch.float32), r"^capacity: must be >= 1"),
        (lambda: write_bytes(1, 1, 8, 16, 4, dtype=torch.float32, gate="x"), r"^gate: "),
        (lambda: read_bytes([9], 1, 8, 16, 0, dtype=torch.float32), r"^lengths: entries"),
    ]
    for fn, match in cases:
        with pytest.raises(ValueError, match=match):
            fn()
    # numpy ints (a DataFrame's columns) count as ints
    assert G.state_bytes(np.int64(4), np.int32(16), 16) == 4 * 16 * 16 * 4
    assert Z.carry_verify_bytes(np.array([1, 2]), np.array([1, 0]), 2, 1, 2, 16, 16) > 0
