"""Gated DeltaNet decode and the K-row chain with snapshots (SPEC §2, §3a).

Every kernel is checked against the float64 reference (``pmll_lab.reference.gdn``; the reference
itself against fla-core and a closed form in test_gdn_reference.py, bad input in
test_gdn_inputs.py). The chain is checked *bitwise* against K successive decode launches
(outputs, final state, every snapshot), also through strided views of fused buffers, with the
runtime row loop and with overridden block configs; the bytes moved per SPEC §4 exactly.

Tolerances (relative L2, ``||x - ref|| / ||ref||``; the reference is fed exactly the values the
kernel reads, i.e. bf16/fp16 inputs already rounded):
- fp32 state and snapshots, any input dtype: ``STATE_TOL = 1e-5`` (fp32 arithmetic over kd-long
  reductions and up to 8 rows; measured <= 1e-7 on the interpreter for heads up to 256).
- outputs: fp32 ``1e-5`` (measured <= 2.5e-7); fp16 ``1e-3`` (measured ~2e-4); bf16 ``8e-3``
  (one bf16 ulp is 2**-7 relative and the output is rounded once to bf16: measured ~3.3e-3).
"""

from __future__ import annotations

import pytest
import torch

import pmll_lab  # noqa: F401  (first: picks GPU or the Triton interpreter)
from pmll_lab.backend import DEVICE
from pmll_lab.bench import bitwise_equal
from pmll_lab.gdn import (
    chain_bytes, decode_bytes, decodes_bytes, gdn_chain, gdn_chain_ref, gdn_decode,
    gdn_decode_ref, row_io_bytes, snapshot_bytes, state_bytes, carry_stash_bytes,
)
from pmll_lab.inputs import gdn_inputs
from pmll_lab.ops import settings

from pmll_lab.tolerances import O_TOL, STATE_TOL

from _gdn_helpers import _check_close


def _untouched(before, after, idx):
    """Slots not in ``idx`` are bitwise unchanged."""
    keep = torch.ones(before.shape[0], dtype=torch.bool, device=before.device)
    keep[idx.long()] = False
    assert keep.any(), "test must leave some slots untouched"
    assert bitwise_equal(before[keep], after[keep]), "a slot outside state_indices changed"


# ---- kernels vs the float64 reference ----------------------------------------------------------

# (dtype, B, S, HK, HV, kd, vd): GVA ratios 1 and 2, kd != vd, a non-power-of-two head, one
# large head (128 x 64: two column blocks per head).
DECODE_CASES = [
    (torch.float32, 3, 5, 2, 2, 16, 32),
    (torch.float32, 2, 4, 2, 4, 32, 16),
    (torch.float32, 2, 3, 1, 2, 24, 40),
    (torch.bfloat16, 3, 6, 2, 4, 32, 32),
    (torch.bfloat16, 2, 3, 1, 1, 128, 64),
    (torch.float16, 2, 4, 1, 2, 16, 16),
]


@pytest.mark.parametrize("dtype,B,S,HK,HV,kd,vd", DECODE_CASES)
def test_decode_matches_reference(dtype, B, S, HK, HV, kd, vd):
    x = gdn_inputs(11 + kd + vd, B, HK, HV, kd, vd, slots=S, dtype=dtype, state_layout="kv")
    idx = x["state_indices"]
    before = x["state"].clone()
    o_ref, s_ref = gdn_decode_ref(before, x["q"], x["k"], x["v"], x["g"], x["beta"],
                                  state_indices=idx, state_layout="kv")
    state = before.clone()
    o = gdn_decode(state, x["q"], x["k"], x["v"], x["g"], x["beta"], state_indices=idx,
                   validate=True, state_layout="kv")
    assert o.dtype == dtype and o.shape == (B, HV, vd)
    _check_close("o", o, o_ref, O_TOL[dtype])
    _check_close("state", state[idx.long()], s_ref[idx.long()], STATE_TOL)
    _untouched(before, state, idx)
    # fp32 outputs from the same inputs: only fp32 arithmetic separates them from the reference.
    state2 = before.clone()
    o32 = gdn_decode(state2, x["q"], x["k"], x["v"], x["g"], x["beta"], state_indices=idx,
                     out_dtype=torch.float32, state_layout="kv")
    assert o32.dtype == torch.float32
    _check_close("o (fp32 out)", o32, o_ref, O_TOL[torch.float32])
    assert bitwise_equal(state2, state), "out_dtype changed the state"


def test_decode_default_slots_and_options():
    """state_indices=None addresses slots 0..B-1; scale and use_qk_l2norm=False are honoured."""
    B, S, HK, HV, kd, vd = 2, 4, 1, 2, 16, 32
    x = gdn_inputs(5, B, HK, HV, kd, vd, slots=S, dtype=torch.float32, state_layout="kv")
    before = x["state"].clone()
    for scale, l2 in [(None, True), (0.37, True), (0.21, False)]:
        o_ref, s_ref = gdn_decode_ref(before, x["q"], x["k"], x["v"], x["g"], x["beta"],
                                      scale=scale, use_qk_l2norm=l2, state_layout="kv")
        state = before.clone()
        o = gdn_decode(state, x["q"], x["k"], x["v"], x["g"], x["beta"], scale=scale,
                       use_qk_l2norm=l2, validate=True, state_layout="kv")
        _check_close(f"o scale={scale} l2={l2}", o, o_ref, 1e-5)
        _check_close("state", state[:B], s_ref[:B], STATE_TOL)
        assert bitwise_equal(state[B:], before[B:])


# (dtype, K, B, S, HK, HV, kd, vd)
CHAIN_CASES = [
    (torch.float32, 1, 2, 3, 2, 4, 16, 32),
    (torch.float32, 3, 3, 5, 2, 2, 32, 16),
    (torch.float32, 8, 2, 4, 1, 2, 16, 16),
    (torch.bfloat16, 4, 3, 4, 2, 4, 32, 32),
    (torch.bfloat16, 8, 2, 3, 1, 2, 16, 32),
    (torch.float16, 2, 2, 3, 2, 2, 32, 16),
    (torch.bfloat16, 3, 1, 2, 1, 1, 64, 128),
]


@pytest.mark.parametrize("dtype,K,B,S,HK,HV,kd,vd", CHAIN_CASES)
def test_chain_matches_reference(dtype, K, B, S, HK, HV, kd, vd):
    x = gdn_inputs(100 + K * kd + vd, B, HK, HV, kd, vd, rows=K, slots=S, dtype=dtype,
                   state_layout="kv")
    idx = x["state_indices"]
    before = x["state"].clone()
    o_ref, s_ref, i_ref = gdn_chain_ref(before, x["q"], x["k"], x["v"], x["g"], x["beta"],
                                        state_indices=idx, state_layout="kv")
    state = before.clone()
    inter = torch.full((B, K - 1, HV, kd, vd), float("nan"), device=DEVICE)
    o = gdn_chain(state, x["q"], x["k"], x["v"], x["g"], x["beta"], state_indices=idx,
                  intermediate=inter, validate=True, state_layout="kv")
    assert o.dtype == dtype and o.shape == (B, K, HV, vd)
    _check_close("o", o, o_ref, O_TOL[dtype])
    _check_close("state", state[idx.long()], s_ref[idx.long()], STATE_TOL)
    if K > 1:
        _check_close("intermediate", inter, i_ref, STATE_TOL)
    _untouched(before, state, idx)


# ---- exactness: chain == K successive decodes, bitwise -----------------------------------------

# (dtype, K, HK, HV, kd, vd): several K including 1 and 8; the 128 x 64 head has two column
# blocks, so programs of one head run separately.
BITWISE_CASES = [
    (torch.bfloat16, 1, 2, 4, 32, 16),
    (torch.bfloat16, 2, 1, 2, 16, 32),
    (torch.float32, 5, 2, 2, 32, 32),
    (torch.bfloat16, 8, 1, 2, 32, 16),
    (torch.float32, 8, 1, 1, 128, 64),
]


@pytest.mark.parametrize("dtype,K,HK,HV,kd,vd", BITWISE_CASES)
def test_chain_bitwise_equals_successive_decodes(dtype, K, HK, HV, kd, vd):
    B, S = 3, 5
    x = gdn_inputs(200 + K, B, HK, HV, kd, vd, rows=K, slots=S, dtype=dtype, state_layout="kv")
    idx = x["state_indices"]
    before = x["state"].clone()

    s_chain = before.clone()
    inter = torch.full((B, K - 1, HV, kd, vd), float("nan"), device=DEVICE)
    o_chain = gdn_chain(s_chain, x["q"], x["k"], x["v"], x["g"], x["beta"], state_indices=idx,
                        intermediate=inter, validate=True, state_layout="kv")

    s_dec = before.clone()
    outs, snaps = [], []
    for t in range(K):
        outs.append(gdn_decode(s_dec, x["q"][:, t], x["k"][:, t], x["v"][:, t], x["g"][:, t],
                               x["beta"][:, t], state_indices=idx, validate=True,
                               state_layout="kv"))
        if t < K - 1:
            snaps.append(s_dec[idx.long()].clone())
    assert bitwise_equal(o_chain, torch.stack(outs, dim=1)), "outputs differ"
    assert bitwise_equal(s_chain, s_dec), "final states differ"
    if K > 1:
        assert bitwise_equal(inter, torch.stack(snaps, dim=1)), "snapshots differ"

    # Without a snapshot buffer the chain computes the same outputs and final state.
    s_plain = before.clone()
    o_plain = gdn_chain(s_plain, x["q"], x["k"], x["v"], x["g"], x["beta"], state_indices=idx,
                        state_layout="kv")
    assert bitwise_equal(o_plain, o_chain) and bitwise_equal(s_plain, s_chain)


def _chain_and_decodes(x):
    """(chain outputs, chain state, snapshots), (decode outputs, decode state, snapshots)."""
    idx, K = x["state_indices"], x["q"].shape[1]
    B, HV, kd, vd = idx.shape[0], *x["state"].shape[1:]
    s_chain, s_dec = x["state"].clone(), x["state"].clone()
    inter = torch.full((B, K - 1, HV, kd, vd), float("nan"), device=DEVICE)
    o_chain = gdn_chain(s_chain, x["q"], x["k"], x["v"], x["g"], x["beta"], state_indices=idx,
                        intermediate=inter, state_layout="kv")
    outs, snaps = [], []
    for t in range(K):
        outs.append(gdn_decode(s_dec, x["q"][:, t], x["k"][:, t], x["v"][:, t], x["g"][:, t],
                               x["beta"][:, t], state_indices=idx, state_layout="kv"))
        if t < K - 1:
            snaps.append(s_dec[idx.long()].clone())
    return (o_chain, s_chain, inter), (torch.stack(outs, 1), s_dec, torch.stack(snaps, 1))


@pytest.mark.parametrize("K", [3, 8])
def test_chain_runtime_row_loop_equals_unrolled(K):
    """Chains longer than ``chain_unroll_max_rows`` run a runtime row loop (one compiled body
    for every row; perf-notes-archive v10): with the loop forced on and forced off, outputs, final
    states and snapshots are bit for bit those of K decodes, and within tolerance of the
    float64 reference."""
    x = gdn_inputs(230 + K, 3, 1, 2, 64, 32, rows=K, slots=5, dtype=torch.bfloat16,
                   state_layout="kv")
    got = {}
    for unroll_max in (0, 8):
        with settings.override(chain_unroll_max_rows=unroll_max):
            got[unroll_max] = _chain_and_decodes(x)
        for a, b_ in zip(*got[unroll_max]):
            assert bitwise_equal(a, b_), f"unroll up to {unroll_max} rows"
    for a, b_ in zip(got[0][0], got[8][0]):
        assert bitwise_equal(a, b_)
    o_ref = gdn_chain_ref(x["state"].double(), x["q"], x["k"], x["v"], x["g"], x["beta"],
                          state_indices=x["state_indices"], state_layout="kv")[0]
    _check_close("o", got[0][0][0], o_ref, O_TOL[torch.bfloat16])


def test_block_config_override():
    """The ``kv_block`` setting (tuning sweeps): every kernel launched inside its override uses
    the given ``BV`` and warps, so the chain still equals K decodes bitwise and the reference
    within tolerance; the default comes back on exit, also after an error; bad values are
    rejected."""
    from pmll_lab.ops.gdn.recurrence import block_config

    def block_config_override(block_v, num_warps):
        return settings.override(kv_block=(block_v, num_warps))

    default = block_config(128, 64)
    x = gdn_inputs(231, 2, 1, 2, 64, 64, rows=3, slots=3, dtype=torch.float32, state_layout="kv")
    with block_config_override(16, 2):
        assert block_config(64, 64) == (64, 16, 2) and block_config(128, 8) == (128, 8, 2)
        chain, dec = _chain_and_decodes(x)
    for a, b_ in zip(chain, dec):
        assert bitwise_equal(a, b_)
    _check_close("state", chain[1], gdn_chain_ref(x["state"].double(), x["q"], x["k"], x["v"],
                                                  x["g"], x["beta"],
                                                  state_indices=x["state_indices"],
                                                  state_layout="kv")[1], STATE_TOL)
    assert block_config(128, 64) == default
    assert block_config(64, 64) == (64, 64, 1), "a config cached inside the block leaked out"
    with block_config_override(32, 4):
        with block_config_override(8, 2):
            assert block_config(64, 64) == (64, 8, 2)
        assert block_config(64, 64) == (64, 32, 4), "nested override must restore the outer one"
    assert block_config(64, 64) == (64, 64, 1)
    with pytest.raises(RuntimeError), block_config_override(8, 1):
        raise RuntimeError("inside")
    assert block_config(128, 64) == default
    for bad in ((12, 1), (16, 0), (16, 3), (True, 1)):
        with pytest.raises(ValueError, match="^kv_block:"), block_config_override(*bad):
            pass


# ---- strided views of one fused projection buffer ----------------------------------------------

def _fused_views(seed, B, K, HK, HV, kd, vd, dtype):
    """q, k, v as column slices of one [K, B, C] projection buffer permuted to [B, K, C]
    (C odd, q starting at column 3: batch, row and head strides are all non-standard and the
    views are not 16-byte aligned), g and beta as slices of an fp32 [B, K, 2*HV + 3] gate
    buffer; plus the same values as contiguous tensors."""
    x = gdn_inputs(seed, B, HK, HV, kd, vd, rows=K, slots=B + 2, dtype=dtype, state_layout="kv")
    nq, nv, q0 = HK * kd, HV * vd, 3
    C = q0 + 2 * nq + nv + 6
    gen = torch.Generator().manual_seed(seed)
    buf = torch.randn(K, B, C, generator=gen).to(dtype).to(DEVICE).permute(1, 0, 2)
    cols = {"q": (q0, q0 + nq), "k": (q0 + nq, q0 + 2 * nq), "v": (q0 + 2 * nq, q0 + 2 * nq + nv)}
    for name, (a, b) in cols.items():
        buf[..., a:b] = x[name].reshape(B, K, b - a)
    gb = torch.randn(B, K, 2 * HV + 3, generator=gen).to(DEVICE)
    gb[..., 1:HV + 1] = x["g"]
    gb[..., HV + 2:2 * HV + 2] = x["beta"]
    views = {name: buf[..., a:b].unflatten(-1, (-1, kd if name != "v" else vd))
             for name, (a, b) in cols.items()}
    views.update(g=gb[..., 1:HV + 1], beta=gb[..., HV + 2:2 * HV + 2])
    for name, t in views.items():
        assert not t.is_contiguous() and t.stride(-1) == 1, name
        assert torch.equal(t, x[name]), name
    return x, views


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_input_views_read_in_place(dtype):
    """q, k, v, g, beta as views of fused buffers (odd offsets, non-standard strides) give
    bitwise the results of contiguous copies: the kernel reads them through their strides and
    its arithmetic does not depend on their alignment (SPEC §2: no copies)."""
    B, K, HK, HV, kd, vd = 2, 3, 1, 2, 16, 32
    x, views = _fused_views(31, B, K, HK, HV, kd, vd, dtype)
    idx = x["state_indices"]
    s_c, s_v = x["state"].clone(), x["state"].clone()
    i_c = torch.empty(B, K - 1, HV, kd, vd, device=DEVICE)
    i_v = torch.empty_like(i_c)
    o_c = gdn_chain(s_c, x["q"], x["k"], x["v"], x["g"], x["beta"], state_indices=idx,
                    intermediate=i_c, state_layout="kv")
    o_v = gdn_chain(s_v, views["q"], views["k"], views["v"], views["g"], views["beta"],
                    state_indices=idx, intermediate=i_v, validate=True, state_layout="kv")
    assert bitwise_equal(o_v, o_c) and bitwise_equal(s_v, s_c) and bitwise_equal(i_v, i_c)
    # Decode reads the row-t views in place too.
    d_c, d_v = x["state"].clone(), x["state"].clone()
    for t in range(K):
        o1 = gdn_decode(d_c, *(x[n][:, t] for n in ("q", "k", "v", "g", "beta")),
                        state_indices=idx, state_layout="kv")
        o2 = gdn_decode(d_v, *(views[n][:, t] for n in ("q", "k", "v", "g", "beta")),
                        state_indices=idx, validate=True, state_layout="kv")
        assert bitwise_equal(o1, o2) and bitwise_equal(d_c, d_v)
    assert bitwise_equal(d_v, s_v)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_state_and_snapshot_views(dtype):
    """The state and the snapshot buffer as strided views (padded key rows and value columns):
    results match the reference, chain == successive decodes bitwise on the same views, and
    nothing outside the views' elements is written. (Against a *contiguous* state the bits may
    differ on a GPU: the compiler picks the state block's register layout from its alignment,
    and that sets the order of the key-dim sums.)"""
    B, K, HK, HV, kd, vd = 2, 3, 1, 2, 16, 32
    x, views = _fused_views(37, B, K, HK, HV, kd, vd, dtype)
    idx = x["state_indices"]
    S = x["state"].shape[0]
    o_ref, s_ref, i_ref = gdn_chain_ref(x["state"], x["q"], x["k"], x["v"], x["g"], x["beta"],
                                        state_indices=idx, state_layout="kv")

    def state_view():
        big = torch.randn(S, HV, kd + 3, vd + 5, device=DEVICE)
        view = big[:, :, 1:kd + 1, 2:vd + 2]
        view.copy_(x["state"])
        return big, view

    big, sv = state_view()
    big_before = big.clone()
    inter_big = torch.zeros(B, K - 1, HV, kd, vd + 7, device=DEVICE)
    iv = inter_big[..., :vd]
    o = gdn_chain(sv, views["q"], views["k"], views["v"], views["g"], views["beta"],
                  state_indices=idx, intermediate=iv, validate=True, state_layout="kv")
    _check_close("o", o, o_ref, O_TOL[dtype])
    _check_close("state", sv[idx.long()], s_ref[idx.long()], STATE_TOL)
    _check_close("intermediate", iv, i_ref, STATE_TOL)
    pad = torch.ones_like(big, dtype=torch.bool)
    pad[:, :, 1:kd + 1, 2:vd + 2] = False
    assert bitwise_equal(big[pad], big_before[pad]), "wrote outside the state view"
    assert bool((inter_big[..., vd:] == 0).all()), "wrote outside the snapshot view"
    untouched = torch.ones(S, dtype=torch.bool, device=DEVICE)
    untouched[idx.long()] = False
    assert bitwise_equal(sv[untouched], x["state"][untouched])

    _, sd = state_view()
    outs = []
    for t in range(K):
        outs.append(gdn_decode(sd, *(views[n][:, t] for n in ("q", "k", "v", "g", "beta")),
                               state_indices=idx, validate=True, state_layout="kv"))
        if t < K - 1:
            assert bitwise_equal(sd[idx.long()], iv[:, t])
    assert bitwise_equal(torch.stack(outs, 1), o) and bitwise_equal(sd, sv)


def test_gva_reads_key_head_h_div_group():
    """HV = 2*HK equals HK = HV with q, k repeat_interleaved (bitwise): value head h reads key
    head h // 2, not h % HK."""
    B, K, HK, HV, kd, vd = 2, 2, 2, 4, 16, 16
    x = gdn_inputs(41, B, HK, HV, kd, vd, rows=K, slots=B, dtype=torch.bfloat16, state_layout="kv")
    s1, s2 = x["state"].clone(), x["state"].clone()
    o1 = gdn_chain(s1, x["q"], x["k"], x["v"], x["g"], x["beta"], state_layout="kv")
    qr = x["q"].repeat_interleave(2, dim=2)
    kr = x["k"].repeat_interleave(2, dim=2)
    o2 = gdn_chain(s2, qr, kr, x["v"], x["g"], x["beta"], state_layout="kv")
    assert bitwise_equal(o1, o2) and bitwise_equal(s1, s2)
    # and a different mapping (h % HK) would give different outputs
    qm = x["q"].repeat(1, 1, 2, 1)
    km = x["k"].repeat(1, 1, 2, 1)
    o3 = gdn_chain(x["state"].clone(), qm, km, x["v"], x["g"], x["beta"], state_layout="kv")
    assert not torch.equal(o1, o3)


# ---- bytes per SPEC §4 ------------------------------------------------------------------------

def test_bytes_moved_per_spec():
    HK, HV, kd, vd = 16, 32, 128, 128
    hb = state_bytes(HV, kd, vd)
    assert hb == HV * kd * vd * 4
    io_bf16 = (2 * HK * kd + HV * vd) * 2 + 2 * HV * 4 + HV * vd * 2
    assert row_io_bytes(HK, HV, kd, vd, torch.bfloat16) == io_bf16
    assert row_io_bytes(HK, HV, kd, vd, torch.bfloat16, torch.float32) == io_bf16 + HV * vd * 2
    for B in (1, 64):
        assert decode_bytes(B, HK, HV, kd, vd) == B * (2 * hb + io_bf16 + 4)
        for K in (1, 4, 8):
            assert chain_bytes(B, K, HK, HV, kd, vd) == B * ((K + 1) * hb + K * io_bf16 + 4)
            assert decodes_bytes(B, K, HK, HV, kd, vd) == K * decode_bytes(B, HK, HV, kd, vd)
        assert chain_bytes(B, 1, HK, HV, kd, vd) == decode_bytes(B, HK, HV, kd, vd)
    assert snapshot_bytes(1, HV, kd, vd) == 0 and snapshot_bytes(4, HV, kd, vd) == 3 * hb
    assert carry_stash_bytes(HV, kd, vd) == 8 * (HV * vd + HV + HV * kd) * 4


def test_decode_and_chain_take_int64_slots():
    """Slot indices as int64 (the dtype torch indexing produces) give the same bits as int32."""
    x = gdn_inputs(77, 3, 1, 2, 16, 16, rows=2, slots=5, dtype=torch.bfloat16, state_layout="kv")
    idx32 = x["state_indices"]
    a, b = x["state"].clone(), x["state"].clone()
    o32 = gdn_chain(a, x["q"], x["k"], x["v"], x["g"], x["beta"], state_indices=idx32,
                    state_layout="kv")
    o64 = gdn_chain(b, x["q"], x["k"], x["v"], x["g"], x["beta"], state_indices=idx32.long(),
                    validate=True, state_layout="kv")
    assert bitwise_equal(o32, o64) and bitwise_equal(a, b)
    q1, k1, v1, g1, b1 = (x[n][:, 0].contiguous() for n in ("q", "k", "v", "g", "beta"))
    d32 = gdn_decode(a, q1, k1, v1, g1, b1, state_indices=idx32, state_layout="kv")
    d64 = gdn_decode(b, q1, k1, v1, g1, b1, state_indices=idx32.long(), state_layout="kv")
    assert bitwise_equal(d32, d64) and bitwise_equal(a, b)
