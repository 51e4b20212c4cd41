"""The V-major GDN family (``state_layout="vk"``, state ``[S, HV, vd, kd]``; SPEC §2, §3).

Decode and the chain against the float64 reference (which reads the same ``H`` through
transposed strides); the family **bitwise** within the layout: the chain (outputs, final
state, every snapshot) against ``K`` V-major decodes, the launch plans against the launchers,
and the carried-state protocol (exact form, eager and lazy, write-backs with several tiles per
head, flushes) against plain V-major decoding. Tolerances as in ``tests/gdn/test_gdn.py`` and
``tests/carry/test_carry.py`` (fp32 arithmetic: rel L2 <= 1e-5; bf16 outputs: 8e-3).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import pmll_lab  # noqa: F401  (first: picks GPU or the Triton interpreter)
from pmll_lab.backend import DEVICE
from pmll_lab.bench import bitwise_equal, errors
from pmll_lab.carry import GdnCarry, carry_accept, gdn_carry_flush, gdn_carry_verify
from pmll_lab.gdn import (gdn_chain, gdn_chain_plan, gdn_chain_ref, gdn_decode,
                          gdn_decode_plan, gdn_decode_ref)
from pmll_lab.inputs import gdn_inputs
from pmll_lab.ops import settings
from pmll_lab.ops.carry import exact as C
from pmll_lab.ops.gdn import decode as D
from pmll_lab.ops.gdn import recurrence
from pmll_lab.ops.gdn.recurrence import vk_config, vk_qk_aligned

from pmll_lab.tolerances import O_TOL, STATE_TOL


def _vk(state):
    """A K-major state ``[S, HV, kd, vd]`` as a contiguous V-major one ``[S, HV, vd, kd]``."""
    return state.transpose(-1, -2).contiguous()


def _close(name, out, want, tol):
    e = errors(out, want)
    assert e["rel_l2"] <= tol, f"{name}: rel_l2 {e['rel_l2']:.3e} > {tol:.0e}"


# (dtype, B, S, HK, HV, kd, vd): GVA 1 and 2, kd != vd, non-power-of-two heads, a head with
# several tiles of value rows.
CASES = [
    (torch.float32, 3, 5, 2, 4, 32, 24),
    (torch.bfloat16, 2, 4, 1, 2, 24, 40),
    (torch.float16, 2, 3, 1, 1, 16, 16),
    (torch.bfloat16, 2, 3, 1, 2, 64, 16),     # two key chunks: the fused key sums combine
]


@pytest.mark.parametrize("dtype,B,S,HK,HV,kd,vd", CASES)
def test_decode_vk_matches_reference(dtype, B, S, HK, HV, kd, vd):
    x = gdn_inputs(5 + kd, B, HK, HV, kd, vd, slots=S, dtype=dtype, state_layout="kv")
    idx = x["state_indices"]
    before = _vk(x["state"])
    o_ref, s_ref = gdn_decode_ref(before, x["q"], x["k"], x["v"], x["g"], x["beta"],
                                  state_indices=idx, state_layout="vk")
    state = before.clone()
    o = gdn_decode(state, x["q"], x["k"], x["v"], x["g"], x["beta"], state_indices=idx,
                   validate=True, state_layout="vk")
    assert o.shape == (B, HV, vd) and o.dtype == dtype
    _close("o", o, o_ref, O_TOL[dtype])
    _close("state", state, s_ref, STATE_TOL)
    keep = torch.ones(S, dtype=torch.bool, device=DEVICE)
    keep[idx.long()] = False
    assert keep.any() and bitwise_equal(state[keep], before[keep])
    # the same H through the K-major kernel: equal within fp32 rounding (not bitwise: another
    # reduction order)
    kv = x["state"].clone()
    o_kv = gdn_decode(kv, x["q"], x["k"], x["v"], x["g"], x["beta"], state_indices=idx,
                      out_dtype=torch.float32, state_layout="kv")
    o_vk = gdn_decode(before.clone(), x["q"], x["k"], x["v"], x["g"], x["beta"],
                      state_indices=idx, out_dtype=torch.float32, state_layout="vk")
    _close("vk vs kv", o_vk, o_kv, O_TOL[torch.float32])


@pytest.mark.parametrize("K", [3, 6])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chain_vk_bitwise_equals_decodes(K, dtype):
    """Outputs, final state and every snapshot; K = 6 runs the runtime row loop."""
    _check_chain_vs_decodes(K, dtype, seed=40 + K)


def _check_chain_vs_decodes(K, dtype, seed, ahead=None):
    """The chain against the reference and, bitwise, against ``K`` V-major decodes; with
    ``ahead = (rows, verify rows, stash rows)``, the chain launches under that ``vk_ahead`` and
    the decodes under the shipped table."""
    B, S, HK, HV, kd, vd = 3, 4, 1, 2, 32, 24
    x = gdn_inputs(seed, B, HK, HV, kd, vd, rows=K, slots=S, dtype=dtype, state_layout="kv")
    idx = x["state_indices"]
    st0 = _vk(x["state"])
    o_ref, s_ref, i_ref = gdn_chain_ref(st0, x["q"], x["k"], x["v"], x["g"], x["beta"],
                                        state_indices=idx, state_layout="vk")
    dec = st0.clone()
    o_dec, s_dec = [], []
    for t in range(K):
        o_dec.append(gdn_decode(dec, x["q"][:, t], x["k"][:, t], x["v"][:, t], x["g"][:, t],
                                x["beta"][:, t], state_indices=idx, state_layout="vk"))
        s_dec.append(dec[idx.long()].clone())
    state = st0.clone()
    inter = torch.full((B, K - 1, HV, vd, kd), 7.0, device=DEVICE)
    with settings.override(**({} if ahead is None else {"vk_ahead": _ahead_table(ahead)})):
        o = gdn_chain(state, x["q"], x["k"], x["v"], x["g"], x["beta"], state_indices=idx,
                      intermediate=inter, validate=True, state_layout="vk")
    _close("o", o, o_ref, O_TOL[dtype])
    _close("state", state, s_ref, STATE_TOL)
    _close("snapshots", inter, i_ref, STATE_TOL)
    for t in range(K):
        assert bitwise_equal(o[:, t], o_dec[t]), f"row {t}: chain output != decode"
        if t < K - 1:
            assert bitwise_equal(inter[:, t], s_dec[t]), f"snapshot {t} != decode state"
    assert bitwise_equal(state, dec), "final state != K decodes"


def _ahead_table(ahead):
    """A ``vk_ahead`` table giving every batch ``ahead = (rows, verify rows, stash rows)`` (the
    verify rows for either state type)."""
    return ((1 << 62, ahead[0], ahead[1], ahead[1], ahead[2]),)


# (rows ahead for decode and the chain, for the verify, stash rows ahead): the shipped
# large-batch row (the folds take 4 pending rows with the state and the rest in the loop),
# every load in the loops, and every row ahead (the shipped small-batch row is what the other
# tests run).
AHEADS = [(0, 2, 4), (0, 0, 0), (8, 8, 8)]


@pytest.mark.parametrize("ahead", AHEADS, ids=lambda a: "ahead%d-%d-%d" % a)
def test_vk_loads_ahead_change_no_bit(ahead):
    """The ``vk_ahead`` setting moves loads, never arithmetic: under each table the chain
    equals decodes run under the shipped table, and the exact carry protocol (lazy, pending
    counts up to the stash's 8 rows) equals plain decoding, bitwise."""
    big = settings.vk_ahead_row(1 << 40)
    assert (big.verify_rows_ahead(torch.float32), big.verify_rows_ahead(torch.bfloat16),
            big.stash_rows_ahead) == (2, 1, 4)
    _check_chain_vs_decodes(3, torch.bfloat16, seed=61, ahead=ahead)
    with settings.override(vk_ahead=_ahead_table(ahead)):
        row = settings.vk_ahead_row(6)
        assert (row.rows_ahead, row.verify_rows_ahead(torch.float32),
                row.stash_rows_ahead) == ahead
        _run_protocol("exact", True, torch.float32, seed=62, steps=6)


def test_vk_stash_ahead_past_small_stash_with_padding():
    """Stash rows ahead past the stash (``cap = 3`` < ``STASH_AHEAD``; lazy, ``K = 2``: one
    pending row restashes at row 1 with no arrival counter, two write back), with a padding
    lane, gating computed in the kernel, a bf16 state and a flush of two layers in one launch,
    under two forced ``vk_ahead`` tables (verify input rows 1 < K, then every row ahead): every
    accepted output and the flushed states equal plain V-major decoding (shipped table),
    bitwise; the padding lane's outputs are zeros."""
    B, S, HK, HV, kd, vd, K, cap, layers = 3, 5, 1, 2, 16, 40, 2, 3, 2
    slots = torch.tensor([3, -1, 0], dtype=torch.int32, device=DEVICE)
    live = [0, 2]
    for ahead in ((3, 1, 7), (8, 8, 8)):
        gen = torch.Generator().manual_seed(63)
        st = [_vk(gdn_inputs(64 + n, 1, HK, HV, kd, vd, slots=S,
                             state_layout="kv")["state"]).to(torch.bfloat16)
              for n in range(layers)]
        plain = [s.clone() for s in st]
        carries = [GdnCarry.empty(S, HV, kd, vd, cap=cap, state_layout="vk") for _ in range(layers)]
        cases = set()                                   # (pending, engaged) of live lanes
        for step in range(4):
            acc = torch.randint(1, K + 1, (B,), generator=gen, dtype=torch.int32)
            for n in range(layers):
                x = gdn_inputs(70 + 10 * step + n, B, HK, HV, kd, vd, rows=K, slots=S,
                               state_layout="kv")
                gv = dict(A_log=torch.rand(HV, generator=gen).to(DEVICE) * 2 - 1,
                          dt_bias=torch.randn(HV, generator=gen).to(DEVICE),
                          a=(torch.randn(B, K, HV, generator=gen) * 3).to(x["q"]),
                          b=(torch.randn(B, K, HV, generator=gen) * 3).to(x["q"]))
                pend = carries[n].pend.clone()
                with settings.override(vk_ahead=_ahead_table(ahead)):
                    o, eng = gdn_carry_verify(st[n], carries[n], x["q"], x["k"], x["v"], **gv,
                                              slot_tab=slots, lazy=True, validate=True,
                                              state_layout="vk")
                assert bool((o[1] == 0).all()) and int(eng[1]) == 1, "padding lane"
                cases |= {(int(pend[int(slots[i])]), int(eng[i])) for i in live}
                for t in range(K):
                    sel = torch.tensor([i for i in live if acc[i] > t], device=DEVICE)
                    o_t = gdn_decode(plain[n], x["q"][sel, t], x["k"][sel, t], x["v"][sel, t],
                                     A_log=gv["A_log"], dt_bias=gv["dt_bias"],
                                     a=gv["a"][sel, t], b=gv["b"][sel, t],
                                     state_indices=slots[sel].contiguous(), state_layout="vk")
                    assert bitwise_equal(o[sel, t], o_t), f"{ahead} step {step} row {t}"
                carry_accept(carries[n], slots, eng, acc.to(DEVICE), rows=K, validate=True)
        assert {(1, 1), (2, 2)} <= cases, f"the case must restash at row 1 and write back: {cases}"
        with settings.override(vk_ahead=_ahead_table(ahead)):
            gdn_carry_flush(st, carries, slots, validate=True, state_layout="vk")
        assert any(bool((c.pend > 0).any()) for c in carries), "the flush must fold rows"
        for n in range(layers):
            assert bitwise_equal(st[n], plain[n]), f"{ahead}: layer {n} flushed state"


def test_plans_vk_bitwise_equal_launchers():
    B, S, HK, HV, kd, vd, K = 2, 3, 1, 2, 16, 24, 3
    x = gdn_inputs(71, B, HK, HV, kd, vd, rows=K, slots=S, dtype=torch.bfloat16, state_layout="kv")
    idx = x["state_indices"]
    st0 = _vk(x["state"])
    a, b = st0.clone(), st0.clone()
    plan = gdn_chain_plan(a, x["q"], x["k"], x["v"], x["g"], x["beta"], state_indices=idx,
                          state_layout="vk")
    for _ in range(2):
        o_p = plan()
        o_l = gdn_chain(b, x["q"], x["k"], x["v"], x["g"], x["beta"], state_indices=idx,
                        state_layout="vk")
        assert bitwise_equal(o_p, o_l) and bitwise_equal(a, b)
    q1, k1, v1, g1, b1 = (x[n][:, 0].contiguous() for n in ("q", "k", "v", "g", "beta"))
    dplan = gdn_decode_plan(a, q1, k1, v1, g1, b1, state_indices=idx, state_layout="vk")
    assert bitwise_equal(dplan(), gdn_decode(b, q1, k1, v1, g1, b1, state_indices=idx,
                                             state_layout="vk"))
    assert bitwise_equal(a, b)


def test_qk_alignment_flag():
    """``QK_ALIGNED`` (the kernels' vector-load hint for q/k rows) is on exactly when every row
    starts on 16 bytes: contiguous rows of 16 bf16 or 4 fp32 keys; off for a view at an odd
    offset, a row stride of 20 bf16 keys (40 bytes), or rows of 12 bf16 keys (24 bytes)."""
    q = torch.randn(2, 3, 2, 16, device=DEVICE).to(torch.bfloat16)
    assert vk_qk_aligned(16, q, q)
    assert vk_qk_aligned(4, *(torch.randn(2, 3, 4, device=DEVICE),) * 2)
    odd = torch.randn(q.numel() + 1, device=DEVICE).to(torch.bfloat16)[1:].view(q.shape)
    assert not vk_qk_aligned(16, odd, q) and not vk_qk_aligned(16, q, odd)
    wide = torch.randn(2, 3, 2, 20, device=DEVICE).to(torch.bfloat16)[..., :16]
    assert not vk_qk_aligned(16, wide, wide)
    q12 = torch.randn(2, 3, 2, 12, device=DEVICE).to(torch.bfloat16)
    assert not vk_qk_aligned(12, q12, q12)


def test_qk_hint_switch():
    """``vk_qk_hint`` off turns the hint off for every launch (read at launch time): the
    launch gets ``QK_ALIGNED=False`` for contiguous rows and still matches the reference."""
    B, S, K, HK, HV, kd, vd = 2, 3, 2, 1, 2, 16, 8
    x = gdn_inputs(89, B, HK, HV, kd, vd, rows=K, slots=S, dtype=torch.bfloat16, state_layout="kv")
    assert vk_qk_aligned(kd, x["q"], x["k"])
    st0 = _vk(x["state"])
    state = st0.clone()
    with settings.override(vk_qk_hint=False):
        assert not vk_qk_aligned(kd, x["q"], x["k"])
        plan = gdn_chain_plan(st0, x["q"], x["k"], x["v"], x["g"], x["beta"],
                              state_indices=x["state_indices"], state_layout="vk")
        assert plan.kwargs["QK_ALIGNED"] is False
        o = gdn_chain(state, x["q"], x["k"], x["v"], x["g"], x["beta"],
                      state_indices=x["state_indices"], state_layout="vk")
    assert vk_qk_aligned(kd, x["q"], x["k"]), "the shipped hint must come back"
    o_ref, s_ref, _ = gdn_chain_ref(st0, x["q"], x["k"], x["v"], x["g"], x["beta"],
                                    state_indices=x["state_indices"], state_layout="vk")
    _close("o", o, o_ref, O_TOL[torch.bfloat16])
    _close("state", state, s_ref, STATE_TOL)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_vk_views_read_in_place(dtype):
    """q and k as views of one fused buffer starting one element in (no row on 16 bytes, so
    the launch drops the alignment hint and reads them in place, SPEC §2): the chain matches
    the reference, and equals V-major decodes of the same views bit for bit; contiguous
    copies launch with the hint."""
    B, S, K, HK, HV, kd, vd = 2, 3, 3, 1, 2, 16, 24
    x = gdn_inputs(83, B, HK, HV, kd, vd, rows=K, slots=S, dtype=dtype, state_layout="kv")
    idx = x["state_indices"]
    nq = HK * kd
    buf = torch.randn(B, K, 2 * nq + 1, device=DEVICE).to(dtype)
    buf[..., 1:1 + nq] = x["q"].flatten(-2)
    buf[..., 1 + nq:] = x["k"].flatten(-2)
    q, k = buf[..., 1:1 + nq].unflatten(-1, (HK, kd)), buf[..., 1 + nq:].unflatten(-1, (HK, kd))
    assert torch.equal(q, x["q"]) and torch.equal(k, x["k"])
    assert not vk_qk_aligned(kd, q, k) and vk_qk_aligned(kd, x["q"], x["k"])
    st0 = _vk(x["state"])
    o_ref, s_ref, _ = gdn_chain_ref(st0, x["q"], x["k"], x["v"], x["g"], x["beta"],
                                    state_indices=idx, state_layout="vk")
    state = st0.clone()
    o = gdn_chain(state, q, k, x["v"], x["g"], x["beta"], state_indices=idx,
                  state_layout="vk", validate=True)
    _close("o", o, o_ref, O_TOL[dtype])
    _close("state", state, s_ref, STATE_TOL)
    dec = st0.clone()
    for t in range(K):
        o_t = gdn_decode(dec, q[:, t], k[:, t], x["v"][:, t], x["g"][:, t], x["beta"][:, t],
                         state_indices=idx, state_layout="vk")
        assert bitwise_equal(o[:, t], o_t), f"row {t}: chain output != decode on the views"
    assert bitwise_equal(state, dec)
    for qq, kk, want in ((q, k, False), (x["q"], x["k"], True)):
        plan = gdn_chain_plan(state, qq, kk, x["v"], x["g"], x["beta"], state_indices=idx,
                              state_layout="vk")
        assert plan.kwargs["QK_ALIGNED"] is want


def test_layout_errors_name_the_argument():
    x = gdn_inputs(3, 2, 1, 2, 16, 24, dtype=torch.float32, state_layout="kv")
    with pytest.raises(ValueError, match="state_layout"):
        gdn_decode(x["state"].clone(), x["q"], x["k"], x["v"], x["g"], x["beta"],
                   state_layout="kvx")
    # a K-major state [S, HV, 16, 24] read as V-major means kd = 24: q's head size 16 differs
    with pytest.raises(ValueError, match="q"):
        gdn_decode(x["state"].clone(), x["q"], x["k"], x["v"], x["g"], x["beta"],
                   state_layout="vk")
    carry = GdnCarry.empty(2, 2, 16, 24)
    xr = gdn_inputs(3, 2, 1, 2, 16, 24, rows=2, dtype=torch.float32, state_layout="kv")
    with pytest.raises(ValueError, match="carry"):
        gdn_carry_verify(xr["state"].clone(), carry, xr["q"], xr["k"], xr["v"], xr["g"],
                         xr["beta"], slot_tab=xr["state_indices"], state_layout="vk")
    with pytest.raises(ValueError, match="state_layout"):
        gdn_carry_flush([xr["state"]], [carry], xr["state_indices"], state_layout="VK")


# ---- carried state, V-major ---------------------------------------------------------------

def _decode_accepted(state, x, slots, acc):
    """Plain V-major decoding of each sequence's first ``acc[b]`` rows (one launch per row over
    the sequences still accepting)."""
    K = x["q"].shape[1]
    outs = []
    for t in range(K):
        live = [b for b in range(len(acc)) if acc[b] > t]
        if not live:
            break
        sel = torch.tensor(live, device=DEVICE)
        o_t = gdn_decode(state, x["q"][sel, t], x["k"][sel, t], x["v"][sel, t], x["g"][sel, t],
                         x["beta"][sel, t], state_indices=slots[sel].contiguous(),
                         state_layout="vk")
        outs.append((t, sel, o_t))
    return outs


@pytest.mark.parametrize("lazy", [False, True], ids=["eager", "lazy"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_carry_vk_exact_bitwise_equals_plain_decoding(lazy, dtype):
    """Steps of verify + accept (random a in 1..K) against plain V-major decoding of the
    accepted rows: every accepted output bitwise; after a flush, every state bitwise. vd = 40
    with 8-row tiles gives several tiles per head, so write-backs that restart the stash at row
    0 exercise the shared-row rule (the interpreter runs the tiles in order)."""
    _, BR, _ = vk_config(16, 40, 3 * 2, state_dtype=torch.float32)
    assert 40 > BR, "the case must have several tiles per head"
    _run_protocol("exact", lazy, dtype, seed=7 if lazy else 8)


def _run_protocol(form, lazy, dtype, seed, *, B=3, S=5, HK=1, HV=2, kd=16, vd=40, K=3,
                  steps=5, state_dtype=torch.float32):
    """``steps`` verifies + accepts of ``form`` on a V-major state (``state_dtype``), each
    accepted output and the flushed states bitwise against plain V-major decoding."""
    gen = torch.Generator().manual_seed(seed)
    x0 = gdn_inputs(seed, B, HK, HV, kd, vd, slots=S, dtype=dtype, state_layout="kv")
    slots = x0["state_indices"]
    state = _vk(x0["state"]).to(state_dtype)
    plain = state.clone()
    carry = GdnCarry.empty(S, HV, kd, vd, state_layout="vk")
    wrote_back = 0
    for step in range(steps):
        x = gdn_inputs(seed + 100 + step, B, HK, HV, kd, vd, rows=K, slots=S, dtype=dtype,
                       state_layout="kv")
        o, eng = gdn_carry_verify(state, carry, x["q"], x["k"], x["v"], x["g"], x["beta"],
                                  slot_tab=slots, form=form, lazy=lazy, validate=True,
                                  state_layout="vk")
        wrote_back += int((eng == 2).sum())
        acc = torch.randint(1, K + 1, (B,), generator=gen, dtype=torch.int32).tolist()
        for row, sel, o_t in _decode_accepted(plain, x, slots, acc):
            assert bitwise_equal(o[sel, row], o_t), f"step {step} row {row}: o differs from decode"
        carry_accept(carry, slots, eng, torch.tensor(acc, dtype=torch.int32, device=DEVICE),
                     rows=K, validate=True)
    assert wrote_back > 0, "the case must exercise write-backs"
    gdn_carry_flush([state], [carry], slots, validate=True, state_layout="vk")
    assert bitwise_equal(state, plain), "flushed state != plain decoding"


def test_carry_vk_tile_larger_than_decode_tile():
    """``vk_tiles`` may give the verify and flush more value rows per program than decode (as
    shipped above B*HV = 128); the protocol stays bitwise equal to plain decoding."""
    with settings.override(vk_tiles=((1 << 62, 8, 16, 1),)):
        assert vk_config(16, 40, 6, "carry", state_dtype="float32")[1] == 16
        assert vk_config(16, 40, 6, state_dtype="float32")[1] == 8
        _run_protocol("exact", True, torch.float32, seed=12, vd=40)
        with pytest.raises(ValueError, match="kind"):
            vk_config(16, 40, 6, "decode", state_dtype="float32")


def test_two_byte_decode_tile_larger_than_carry_tile():
    """``vk_rows_half`` gives decode and the chain on a bf16/fp16 state their own row count (16
    as shipped above B*HV = 256, for heads of 32 to 128 keys) while the carry keeps
    ``vk_tiles``'; the protocol on a bf16 state stays bitwise equal to plain decoding."""
    with settings.override(vk_rows_half=((1 << 62, 16),), vk_tiles=((1 << 62, 8, 8, 1),)):
        for half in (torch.bfloat16, torch.float16):
            assert vk_config(32, 40, 6, state_dtype=half)[1] == 16
            assert vk_config(32, 40, 6, "carry", state_dtype=half)[1] == 8
            assert vk_config(16, 40, 6, state_dtype=half)[1] == 8       # 16 keys: vk_tiles'
            assert vk_config(256, 256, 6, state_dtype=half)[1] == 8     # 256: not measured
        assert vk_config(32, 40, 6, state_dtype=torch.float32)[1] == 8
        _run_protocol("exact", True, torch.bfloat16, seed=13, kd=32, vd=40,
                      state_dtype=torch.bfloat16)


FUSED_SUMS = textwrap.dedent("""
    import torch
    import pmll_lab
    from pmll_lab.backend import DEVICE
    from pmll_lab.bench import bitwise_equal, errors
    from pmll_lab.gdn import gdn_chain, gdn_chain_ref, gdn_decode
    from pmll_lab.ops.gdn import recurrence
    from pmll_lab.inputs import gdn_inputs
    from pmll_lab.ops import settings
    assert recurrence.FMA_SUMS, "PMLL_LAB_FMA_SUMS=1 did not switch the fused key sums on"
    assert settings.gdn().fma_sums
    for layout, kd in (("vk", 64), ("vk", 16), ("kv", 32)):
        B, K, HK, HV, vd = 2, 3, 1, 2, 16
        x = gdn_inputs(97 + kd, B, HK, HV, kd, vd, rows=K, slots=3, dtype=torch.bfloat16,
                       state_layout="kv")
        st0 = x["state"] if layout == "kv" else x["state"].transpose(-1, -2).contiguous()
        idx = x["state_indices"]
        o_ref, s_ref, _ = gdn_chain_ref(st0, x["q"], x["k"], x["v"], x["g"], x["beta"],
                                        state_indices=idx, state_layout=layout)
        st = st0.clone()
        o = gdn_chain(st, x["q"], x["k"], x["v"], x["g"], x["beta"], state_indices=idx,
                      state_layout=layout)
        assert errors(o, o_ref)["rel_l2"] <= 8e-3, (layout, kd, errors(o, o_ref))
        assert errors(st, s_ref)["rel_l2"] <= 1e-5, (layout, kd, errors(st, s_ref))
        dec = st0.clone()
        for t in range(K):
            o_t = gdn_decode(dec, *(x[n][:, t] for n in ("q", "k", "v", "g", "beta")),
                             state_indices=idx, state_layout=layout)
            assert bitwise_equal(o[:, t], o_t), (layout, kd, t)
        assert bitwise_equal(st, dec), (layout, kd)
    print("fused key sums ok")
""")


def test_fused_key_sums_run_where_the_default_turns_them_off():
    """The fused key sums (``recurrence.dot_fma`` with ``fma_sums``; off by default in the
    interpreter for speed) forced on in a fresh process: the chain matches the reference and
    equals decodes bit for bit, V-major with two key chunks and with one, and K-major."""
    env = dict(os.environ, PMLL_LAB_FMA_SUMS="1")
    run = subprocess.run([sys.executable, "-c", FUSED_SUMS], env=env, capture_output=True,
                         text=True, timeout=900)
    assert run.returncode == 0 and "fused key sums ok" in run.stdout, run.stderr[-3000:]
