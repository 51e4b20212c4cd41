"""Causal depthwise conv and its carry twin (SPEC §3b, §3c; issues 3 and 4).

Kernels run through the Triton interpreter on CPU (small shapes) or on the GPU. Tolerances
(relative L2 against the float64 reference, ``pmll_lab.bench.errors``):

- outputs in fp32 (fp32 inputs, or bf16 inputs with ``out_dtype=float32``): 1e-5. The arithmetic
  is fp32 over d_conv <= 4 taps, then SiLU and the l2norm: a few ulp.
- outputs in bf16: 8e-3 (one bf16 rounding, 2**-9 relative, dominates).
- windows and stash rows: bitwise (they hold exact copies of the inputs).

Bitwise (SPEC §2 "Exactness"): conv_chain == successive conv_update (outputs, final and
intermediate windows); carried verify + accept + flush == plain conv_update of the accepted
inputs (outputs of accepted rows, windows after flush).
"""

from __future__ import annotations

import pytest
import torch

import pmll_lab  # noqa: F401  (first: picks GPU or interpreter)
from pmll_lab.backend import DEVICE
from pmll_lab.bench import bitwise_equal, errors
from pmll_lab.conv import (
    ConvCarry,
    conv_block_config,
    conv_carry_flush,
    conv_carry_verify,
    conv_chain,
    conv_update,
)
from pmll_lab.inputs import conv_inputs, generator
from pmll_lab.reference import conv as ref

TOL_F32 = 1e-5
TOL_BF16 = 8e-3

# Small Qwen3-Next-shaped conv: HK=2, HV=4, kd=vd=32 -> qk_channels 128, dim 256.
QK, HD = 128, 32
DIM = 2 * 2 * 32 + 4 * 32
# Several channel-block programs per sequence (race exposure): HK=4, HV=8, kd=vd=32 -> dim 512.
QK_WIDE, DIM_WIDE = 256, 512


def _tol(dtype):
    return TOL_F32 if dtype == torch.float32 else TOL_BF16


def _check_close(out, expect, tol, what):
    e = errors(out, expect)
    assert e["rel_l2"] <= tol, f"{what}: rel_l2 {e['rel_l2']:.3g} > {tol} (max_abs {e['max_abs']:.3g})"


def _same(out, expect_f64, what):
    """``out`` holds exactly the float64 reference's values (windows, stash)."""
    assert bitwise_equal(out, expect_f64.to(out.device, out.dtype)), f"{what}: not bitwise equal"
    assert torch.equal(out.double().cpu(), expect_f64), f"{what}: reference not representable"


def _randn(gen, *shape, dtype):
    return torch.randn(*shape, generator=gen).to(dtype).to(DEVICE)


def _guarded(gen, shape, region, dtype):
    """A bigger buffer of random sentinels and the view ``big[region]`` of ``shape``."""
    big_shape = [s.stop + 2 if isinstance(s, slice) else s for s in region]
    big = torch.randn(*big_shape, generator=gen).to(dtype).to(DEVICE)
    view = big[region]
    assert tuple(view.shape) == tuple(shape)
    return big, view


def _outside(big, region):
    mask = torch.ones(big.shape, dtype=torch.bool, device=big.device)
    mask[region] = False
    return big[mask].clone()


def _accept(carry, slot_tab, engaged, accepted):
    """Local pending update (SPEC §3b): pend = a after a write-back, else pend + a."""
    idx = slot_tab.long()
    acc = accepted.to(torch.int32)
    carry.pend[idx] = torch.where(engaged == 2, acc, carry.pend[idx] + acc)


# ---- conv_update / conv_chain vs reference ----------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("qk,state_len,act", [(0, 3, "silu"), (QK, 3, "silu"), (QK, 5, "silu"),
                                              (QK, 4, None)])
def test_update_matches_reference(dtype, qk, state_len, act):
    B, S = 3, 6
    d = conv_inputs(11, B, DIM, slots=S, state_len=state_len, dtype=dtype)
    # x as a strided view of a fused projection [B, 2*DIM + 8]
    fused = _randn(generator(12), B, 2 * DIM + 8, dtype=dtype)
    fused[:, 8:8 + DIM] = d["x"]
    x = fused[:, 8:8 + DIM]
    assert x.stride(0) != DIM
    kw = dict(activation=act, qk_channels=qk, head_dim=HD if qk else None)
    state = d["conv_state"].clone()
    y = conv_update(state, x, d["weight"], d["bias"], state_indices=d["state_indices"],
                    validate=True, **kw)
    y32 = conv_update(d["conv_state"].clone(), x, d["weight"], d["bias"],
                      state_indices=d["state_indices"], out_dtype=torch.float32, **kw)
    y_ref, s_ref = ref.conv_update(d["conv_state"], d["x"], d["weight"], d["bias"],
                                   state_indices=d["state_indices"], **kw)
    assert y.dtype == dtype and y32.dtype == torch.float32
    _check_close(y, y_ref, _tol(dtype), "y")
    _check_close(y32, y_ref, TOL_F32, "y (fp32 out)")
    _same(state, s_ref, "conv_state")          # includes the untouched slots
    untouched = sorted(set(range(S)) - set(d["state_indices"].tolist()))
    assert untouched and bitwise_equal(state[untouched], d["conv_state"][untouched])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("K", [1, 2, 4, 8])
def test_chain_matches_reference_and_successive_updates(dtype, K):
    B, S, SL = 3, 5, 4
    d = conv_inputs(20 + K, B, DIM, rows=K, slots=S, state_len=SL, dtype=dtype)
    kw = dict(qk_channels=QK, head_dim=HD)
    # x [B, K, dim] as a view of a [K, B, dim + 4] buffer: K-stride < B-stride swapped.
    buf = _randn(generator(3), K, B, DIM + 4, dtype=dtype)
    buf[:, :, 2:2 + DIM] = d["x"].transpose(0, 1)
    x = buf.transpose(0, 1)[:, :, 2:2 + DIM]
    gen = generator(4)
    big_inter, inter = _guarded(gen, (B, K - 1, DIM, SL),
                                (slice(1, B + 1), slice(0, K - 1), slice(0, DIM), slice(1, SL + 1)),
                                dtype)
    inter_region = (slice(1, B + 1), slice(0, K - 1), slice(0, DIM), slice(1, SL + 1))
    guard_before = _outside(big_inter, inter_region)
    state = d["conv_state"].clone()
    y = conv_chain(state, x, d["weight"], d["bias"], state_indices=d["state_indices"],
                   intermediate=inter, validate=True, **kw)
    y_ref, s_ref, i_ref = ref.conv_chain(d["conv_state"], d["x"], d["weight"], d["bias"],
                                         state_indices=d["state_indices"], **kw)
    _check_close(y, y_ref, _tol(dtype), "y")
    _same(state, s_ref, "final windows")
    _same(inter, i_ref, "intermediate windows")
    assert torch.equal(_outside(big_inter, inter_region), guard_before), "intermediate guard written"

    # bitwise: K successive conv_update launches
    state2 = d["conv_state"].clone()
    ys = []
    for t in range(K):
        ys.append(conv_update(state2, x[:, t], d["weight"], d["bias"],
                              state_indices=d["state_indices"], **kw))
        if t < K - 1:
            assert bitwise_equal(state2[d["state_indices"].long()], inter[:, t]), f"window {t}"
    assert bitwise_equal(torch.stack(ys, 1), y), "outputs differ from successive updates"
    assert bitwise_equal(state2, state), "final windows differ from successive updates"


def test_chain_groups_of_odd_head_dim_over_several_blocks():
    """head_dim 24 (not a power of two), dim 384 over two channel-block programs."""
    hd, qk, dim = 24, 2 * 4 * 24, 2 * 4 * 24 + 8 * 24
    W, WP, ROWS, _ = conv_block_config(dim, hd)
    assert (W, WP) == (24, 32) and -(-dim // (W * ROWS)) >= 2
    d = conv_inputs(31, 2, dim, rows=3, dtype=torch.float32)
    kw = dict(qk_channels=qk, head_dim=hd, l2_eps=1e-5)
    state = d["conv_state"].clone()
    y = conv_chain(state, d["x"], d["weight"], d["bias"], **kw)
    y_ref, s_ref, _ = ref.conv_chain(d["conv_state"], d["x"], d["weight"], d["bias"], **kw)
    _check_close(y, y_ref, TOL_F32, "y")
    _same(state, s_ref, "windows")
    norms = y[..., :qk].reshape(2, 3, -1, hd).double().norm(dim=-1)
    assert torch.allclose(norms, torch.ones_like(norms), atol=1e-4), "q/k groups not unit norm"


def test_bitwise_whatever_the_alignment_of_the_views():
    """Same values through views at odd element offsets (misaligned on a GPU) give the same bits:
    the l2norm sum has a fixed order (``row_sum_pairwise``), not the layout's. The carried verify
    is run with random pending stash rows (``pend`` 2 and 1), so the fold reads the misaligned
    stash, and both views equal the plain chain over ``[pending rows | new rows]``."""
    B, K = 2, 3
    d = conv_inputs(35, B, DIM, rows=K, dtype=torch.bfloat16)
    kw = dict(qk_channels=QK, head_dim=HD)
    gen = generator(36)
    xbuf = _randn(gen, B, K, DIM + 3, dtype=torch.bfloat16)
    xbuf[:, :, 1:1 + DIM] = d["x"]
    x_odd = xbuf[:, :, 1:1 + DIM]
    sbuf = _randn(gen, B, DIM, 5, dtype=torch.bfloat16)
    sbuf[:, :, 1:4] = d["conv_state"]
    st_odd, st = sbuf[:, :, 1:4], d["conv_state"].clone()
    y = conv_chain(st, d["x"], d["weight"], d["bias"], **kw)
    y_odd = conv_chain(st_odd, x_odd, d["weight"], d["bias"], **kw)
    assert bitwise_equal(y, y_odd) and bitwise_equal(st, st_odd.contiguous())

    pend = [2, 1]
    rows = _randn(gen, B, 8, DIM, dtype=torch.bfloat16)               # random stash rows
    pend_t = torch.tensor(pend, dtype=torch.int32, device=DEVICE)
    carry = ConvCarry(rows.clone(), pend_t.clone())
    tbuf = _randn(gen, B, 8, DIM + 1, dtype=torch.bfloat16)
    tbuf[:, :, 1:] = rows
    carry_odd = ConvCarry(tbuf[:, :, 1:], pend_t.clone())                # odd element offset
    slots = torch.arange(B, dtype=torch.int32, device=DEVICE)
    st_c = d["conv_state"].clone()
    y_c, eng = conv_carry_verify(st_c, carry, d["x"], d["weight"], d["bias"], slot_tab=slots,
                                 **kw)
    st_c_odd = sbuf[:, :, 1:4].copy_(d["conv_state"])
    y_c_odd, eng_odd = conv_carry_verify(st_c_odd, carry_odd, x_odd, d["weight"], d["bias"],
                                         slot_tab=slots, **kw)
    assert eng.tolist() == eng_odd.tolist() == [2, 2]                 # eager, p > 0: write-back
    assert bitwise_equal(y_c_odd, y_c) and bitwise_equal(st_c_odd.contiguous(), st_c)
    assert bitwise_equal(carry_odd.stash.contiguous(), carry.stash)
    for b, p in enumerate(pend):
        seq = torch.cat([rows[b, :p], d["x"][b]])[None]               # [1, p + K, DIM]
        st_b = d["conv_state"][b:b + 1].clone()
        inter = torch.empty(1, p + K - 1, DIM, 3, dtype=torch.bfloat16, device=DEVICE)
        y_b = conv_chain(st_b, seq, d["weight"], d["bias"], intermediate=inter, **kw)
        assert bitwise_equal(y_c[b], y_b[0, p:]), f"sequence {b}: outputs"
        assert bitwise_equal(st_c[b], inter[0, p - 1]), f"sequence {b}: folded window"
        assert bitwise_equal(carry.stash[b, :K], d["x"][b]), f"sequence {b}: stashed rows"


# ---- peer oracle: HF transformers' Qwen3-Next torch conv update -------------------------------

def test_reference_matches_hf_qwen3_next_conv_update():
    """Our float64 reference == HF's torch ``causal_conv1d_update`` (+ its ``l2norm`` on the q
    and k heads, as Qwen3-Next's GDN applies it), in float64, one and several tokens."""
    try:
        from transformers.models.qwen3_next import modeling_qwen3_next as hf
    except Exception as exc:  # noqa: BLE001 - report exactly why the peer is missing
        pytest.fail(f"peer oracle unavailable: transformers.models.qwen3_next does not import "
                    f"({type(exc).__name__}: {exc}); install transformers (extra 'peers')")
    hf_update = getattr(hf.causal_conv1d_update, "__wrapped__", hf.causal_conv1d_update)
    B, d_conv = 3, 4
    for state_len, K in [(3, 1), (4, 1), (4, 3), (6, 2)]:
        d = conv_inputs(40 + K, B, DIM, rows=K, state_len=state_len, dtype=torch.float32)
        f64 = {k: v.to("cpu", torch.float64) for k, v in d.items() if k != "state_indices"}
        hf_state = f64["conv_state"].clone()
        y_hf = hf_update(f64["x"].transpose(1, 2), hf_state, f64["weight"], f64["bias"], "silu")
        y_hf = y_hf.transpose(1, 2)                                       # [B, K, dim]
        q, k, v = y_hf.split([QK // 2, QK // 2, DIM - QK], dim=-1)
        q = hf.l2norm(q.reshape(B, K, -1, HD)).reshape(B, K, -1)
        k = hf.l2norm(k.reshape(B, K, -1, HD)).reshape(B, K, -1)
        y_hf = torch.cat([q, k, v], dim=-1)
        y_ref, s_ref, _ = ref.conv_chain(f64["conv_state"], f64["x"], f64["weight"], f64["bias"],
                                         qk_channels=QK, head_dim=HD)
        assert d_conv == f64["weight"].shape[1]
        torch.testing.assert_close(y_ref, y_hf, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(s_ref, hf_state, rtol=0, atol=0)
        # and without activation / l2norm (the bare conv)
        hf_state = f64["conv_state"].clone()
        y_bare = hf_update(f64["x"].transpose(1, 2), hf_state, f64["weight"], None, None)
        y_ref, _, _ = ref.conv_chain(f64["conv_state"], f64["x"], f64["weight"], None,
                                     activation=None)
        torch.testing.assert_close(y_ref, y_bare.transpose(1, 2), rtol=1e-12, atol=1e-12)


# ---- carry verify vs the protocol reference ---------------------------------------------------

def _carry_setup(seed, B, S, dim, K, dtype, pend, *, cap=8, state_len=3):
    """Inputs, a guarded conv_state view and a guarded ConvCarry with random stash and ``pend``."""
    d = conv_inputs(seed, B, dim, rows=K, slots=S, state_len=state_len, dtype=dtype)
    gen = generator(seed + 1000)
    s_region = (slice(1, S + 1), slice(0, dim), slice(1, state_len + 1))
    big_s, state = _guarded(gen, (S, dim, state_len), s_region, dtype)
    state.copy_(d["conv_state"])
    t_region = (slice(1, S + 1), slice(1, cap + 1), slice(4, dim + 4))
    big_t, stash = _guarded(gen, (S, cap, dim), t_region, dtype)
    stash.copy_(torch.randn(S, cap, dim, generator=gen).to(dtype))
    p_region = (slice(2, S + 2),)
    big_p = torch.full((S + 4,), 77, dtype=torch.int32, device=DEVICE)
    pend_view = big_p[p_region]
    pend_view.copy_(torch.as_tensor(pend, dtype=torch.int32))
    carry = ConvCarry(stash, pend_view)
    guards = [(big_s, s_region), (big_t, t_region), (big_p, p_region)]
    return d, state, carry, [(b, r, _outside(b, r)) for b, r in guards]


def _guards_intact(guards):
    for big, region, before in guards:
        assert torch.equal(_outside(big, region), before), "write outside the buffer view"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("lazy", [False, True])
@pytest.mark.parametrize("K,qk", [(3, QK_WIDE), (5, 0)])
def test_carry_verify_matches_protocol_reference(dtype, lazy, K, qk):
    """pend covers 0, small, p + K > CAP (write-back in both forms) and p = CAP; dim 512 runs
    several channel-block programs per sequence, so a write-back restarting the stash at row 0
    would expose a cross-program race in the (sequential) interpreter."""
    B, S, cap = 5, 8, 8
    pend = [0, 2, 4, 6, 8, 1, 3, 7]
    d, state, carry, guards = _carry_setup(50 + K, B, S, DIM_WIDE, K, dtype, pend, cap=cap)
    W, _, ROWS, _ = conv_block_config(DIM_WIDE, HD if qk else None)
    assert -(-DIM_WIDE // (W * ROWS)) >= 2
    slot_tab = torch.tensor([4, 0, 6, 3, 1], dtype=torch.int32, device=DEVICE)  # p = 8,0,3,6,2
    kw = dict(qk_channels=qk, head_dim=HD if qk else None)
    state0, stash0, pend0 = state.clone(), carry.stash.clone(), carry.pend.clone()
    y, engaged = conv_carry_verify(state, carry, d["x"], d["weight"], d["bias"], slot_tab=slot_tab,
                                   lazy=lazy, validate=True, **kw)
    y_ref, e_ref, s_ref, t_ref = ref.conv_carry_verify(
        state0, stash0, pend0, d["x"], d["weight"], d["bias"], slot_tab=slot_tab, lazy=lazy, **kw)
    assert engaged.dtype == torch.int32 and engaged.tolist() == e_ref.tolist()
    p = pend0[slot_tab.long()].tolist()
    expect = [2 if ((pi + K > cap) if lazy else pi > 0) else 1 for pi in p]
    assert engaged.tolist() == expect
    assert 2 in expect and (1 in expect)
    _check_close(y, y_ref, _tol(dtype), "y")
    _same(state, s_ref, "conv_state")
    _same(carry.stash, t_ref, "stash")
    assert torch.equal(carry.pend, pend0), "verify must leave pend to the caller"
    _guards_intact(guards)
    # outputs bitwise equal to conv_update from the folded window
    folded = [ref.conv_carry_flush([state0], [stash0], [pend0], slot_tab[b:b + 1])[0][int(slot_tab[b])]
              for b in range(B)]
    st = torch.stack(folded).to(dtype).to(DEVICE)
    y_plain = conv_chain(st, d["x"], d["weight"], d["bias"], **kw)
    assert bitwise_equal(y, y_plain), "carry outputs differ from the plain chain"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_carry_sequence_equals_plain_decoding(dtype):
    """Several steps of verify + accept over 2 layers (separately allocated), random K-row drafts,
    random acceptance a in 0..K, eager and lazy, a slot reset and reused, a mid-run flush; the
    outputs of accepted rows and the windows after the final flush equal plain conv_update of
    the accepted inputs, bitwise."""
    gen = generator(70)
    S, dim, SL, L, cap = 6, 320, 3, 2, 8
    kw = dict(qk_channels=QK, head_dim=HD)
    layers = []
    for layer in range(L):
        d = conv_inputs(71 + layer, S, dim, slots=S, state_len=SL, dtype=dtype)
        carry = ConvCarry.empty(S, dim, cap=cap, dtype=dtype)
        layers.append(dict(w=d["weight"], b=d["bias"], state=d["conv_state"].clone(),
                           plain=d["conv_state"].clone(), carry=carry))
    try:
        from pmll_lab.carry import carry_accept as shared_accept
    except ImportError:
        from pmll_lab.ops.carry.gdn_carry import carry_accept as shared_accept
    steps = 9
    for step in range(steps):
        B = int(torch.randint(1, S + 1, (1,), generator=gen))
        K = int(torch.randint(1, 5, (1,), generator=gen))
        lazy = bool(step % 2)
        slot_tab = torch.randperm(S, generator=gen)[:B].to(torch.int32).to(DEVICE)
        accepted = torch.randint(0, K + 1, (B,), generator=gen).to(DEVICE)
        if step == 3:
            accepted[0] = 0
        if step == 4:
            accepted[:] = K
        xs = torch.randn(B, K, dim, generator=gen).to(dtype).to(DEVICE)
        engaged = None
        for li, lay in enumerate(layers):
            x = xs if li == 0 else torch.roll(xs, 1, dims=-1)
            y, eng = conv_carry_verify(lay["state"], lay["carry"], x, lay["w"], lay["b"],
                                       slot_tab=slot_tab, lazy=lazy, validate=True, **kw)
            assert engaged is None or torch.equal(eng, engaged)
            engaged = eng
            for t in range(K):
                rows = (accepted > t).nonzero().flatten()
                if rows.numel() == 0:
                    break
                y_plain = conv_update(lay["plain"], x[rows, t], lay["w"], lay["b"],
                                      state_indices=slot_tab[rows], **kw)
                assert bitwise_equal(y[rows, t], y_plain), f"step {step} layer {li} row {t}"
        if step % 3 == 0:
            shared_accept([lay["carry"] for lay in layers], slot_tab, engaged, accepted, rows=K,
                          validate=True)
        else:
            for lay in layers:
                _accept(lay["carry"], slot_tab, engaged, accepted)
        assert int(layers[0]["carry"].pend.max()) <= cap
        if step == 5:   # mid-run flush of every slot, then clear pend
            all_slots = torch.arange(S, dtype=torch.int32, device=DEVICE)
            conv_carry_flush([lay["state"] for lay in layers], [lay["carry"] for lay in layers],
                             all_slots, validate=True)
            for lay in layers:
                lay["carry"].pend.zero_()
        if step == 6:   # a sequence ends: its slot is reset in both forms of the state
            slot = int(slot_tab[0])
            for lay in layers:
                lay["carry"].reset(slot)
                fresh = torch.randn(dim, SL, generator=gen).to(dtype).to(DEVICE)
                lay["state"][slot] = fresh
                lay["plain"][slot] = fresh
    all_slots = torch.arange(S, dtype=torch.int32, device=DEVICE)
    pends = [lay["carry"].pend.clone() for lay in layers]
    conv_carry_flush([lay["state"] for lay in layers], [lay["carry"] for lay in layers], all_slots)
    for li, lay in enumerate(layers):
        assert torch.equal(lay["carry"].pend, pends[li]), "flush must leave pend alone"
        assert bitwise_equal(lay["state"], lay["plain"]), f"layer {li}: windows after flush"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_flush_over_separately_allocated_layers(dtype):
    S, dim, SL, L, cap = 6, DIM_WIDE, 4, 3, 8
    gen = generator(90)
    slot_tab = torch.tensor([5, 1, 2, 0], dtype=torch.int32, device=DEVICE)
    states, carries, guards = [], [], []
    for layer in range(L):
        pend = torch.randint(0, cap + 1, (S,), generator=gen).tolist()
        pend[1] = 0 if layer == 0 else cap       # p = 0 leaves the window; p = CAP folds all
        _, state, carry, g = _carry_setup(91 + layer, 4, S, dim, 1, dtype, pend, cap=cap,
                                          state_len=SL)
        states.append(state)
        carries.append(carry)
        guards += g
    before = [s.clone() for s in states]
    pends = [c.pend.clone() for c in carries]
    expect = ref.conv_carry_flush(before, [c.stash for c in carries], pends, slot_tab)
    conv_carry_flush(states, carries, slot_tab, validate=True)
    for layer in range(L):
        _same(states[layer], expect[layer], f"layer {layer} windows")
        assert torch.equal(carries[layer].pend, pends[layer])
        assert bitwise_equal(states[layer][3], before[layer][3])   # slot not in slot_tab
        assert bitwise_equal(states[layer][4], before[layer][4])
    assert bitwise_equal(states[0][1], before[0][1])               # p = 0
    assert not bitwise_equal(states[1][1], before[1][1])
    _guards_intact(guards)


def test_conv_carry_container():
    c = ConvCarry.empty(4, 40, cap=6, dtype=torch.float32)
    assert c.stash.shape == (4, 6, 40) and c.pend.dtype == torch.int32 and c.cap == 6
    assert c.stash_bytes_per_slot == 6 * 40 * 4 and c.nbytes == 4 * 6 * 40 * 4 + 16
    c.pend.copy_(torch.tensor([1, 2, 3, 4], dtype=torch.int32))
    c.stash.fill_(1.5)
    c.reset([1, 3])
    assert c.pend.tolist() == [1, 0, 3, 0]
    assert float(c.stash[1].abs().sum()) == 0 and float(c.stash[0].min()) == 1.5
    c.reset(2)                                    # one int, as GdnCarry / RingMemory.reset
    c.reset(torch.tensor([0], device=c.pend.device))
    assert c.pend.tolist() == [0, 0, 0, 0] and float(c.stash[2].abs().sum()) == 0
    b = ConvCarry.empty(2, 16)
    assert b.dtype == torch.bfloat16 and b.stash_bytes_per_slot == 8 * 16 * 2


# ---- bad input --------------------------------------------------------------------------------

def _base(dtype=torch.float32, K=None):
    d = conv_inputs(100, 2, 64, rows=K, slots=4, dtype=dtype)
    return d


def _update_cases():
    d = _base()
    st, x, w, b, idx = d["conv_state"], d["x"], d["weight"], d["bias"], d["state_indices"]
    meta = torch.empty(2, 64, device="meta")
    return [
        ("conv_state", dict(conv_state=st[0])),
        ("conv_state", dict(conv_state=st.half(), x=x.half(), weight=w.half(), bias=b.half())),
        ("conv_state", dict(conv_state=st.to("meta"))),
        ("x", dict(x=x[:, :32])),
        ("x", dict(x=x.bfloat16())),
        ("x", dict(x=meta)),
        ("x", dict(x=torch.randn(64, 2).to(DEVICE).t())),
        ("weight", dict(weight=w[:32])),
        ("weight", dict(weight=w.bfloat16())),
        ("bias", dict(bias=b[:10])),
        ("conv_state", dict(weight=torch.randn(64, 6).to(DEVICE))),   # state_len 3 < 5
        ("activation", dict(activation="relu")),
        ("qk_channels", dict(qk_channels=48, head_dim=32)),
        ("head_dim", dict(qk_channels=32)),
        ("qk_channels", dict(qk_channels=128, head_dim=32)),
        ("l2_eps", dict(l2_eps=0.0)),
        ("l2_eps", dict(l2_eps=float("inf"))),
        ("l2_eps", dict(l2_eps=float("nan"))),
        ("l2_eps", dict(l2_eps="1e-6")),
        ("out_dtype", dict(out_dtype=torch.float16)),
        ("state_indices", dict(state_indices=idx.float())),
        ("state_indices", dict(state_indices=idx[:1])),
        ("state_indices", dict(state_indices=torch.tensor([1, 1], dtype=torch.int32).to(DEVICE),
                               validate=True)),
        ("state_indices", dict(state_indices=torch.tensor([0, 4], dtype=torch.int32).to(DEVICE),
                               validate=True)),
        ("state_indices", dict(state_indices=torch.tensor([-2, 2], dtype=torch.int32).to(DEVICE),
                               validate=True)),
        ("state_indices", dict(conv_state=st[:1])),                   # S < B, no indices
        ("state_indices", dict(conv_state=st[:1], state_indices=idx)),   # S < B with indices
        ("state_indices", dict(state_indices=[0, 1])),
        # read at offset b: a strided view [3, 1] of [3, 0, 1, 0] would address slots [3, 0]
        ("state_indices", dict(state_indices=torch.tensor([3, 0, 1, 0], dtype=torch.int32)
                               .to(DEVICE)[::2], validate=True)),
    ]


@pytest.mark.parametrize("name,override", _update_cases())
def test_update_bad_input(name, override):
    d = _base()
    args = dict(conv_state=d["conv_state"], x=d["x"], weight=d["weight"], bias=d["bias"])
    args.update(override)
    before = d["conv_state"].clone()
    with pytest.raises(ValueError, match=f"^{name}"):
        conv_update(args.pop("conv_state"), args.pop("x"), args.pop("weight"), args.pop("bias"),
                    **args)
    assert bitwise_equal(d["conv_state"], before)


def test_chain_bad_input():
    d = _base(K=3)
    st, x, w, b = d["conv_state"], d["x"], d["weight"], d["bias"]
    with pytest.raises(ValueError, match="^x"):
        conv_chain(st, torch.randn(2, 17, 64).to(DEVICE), w, b)
    with pytest.raises(ValueError, match="^x"):
        conv_chain(st, x[:, 0], w, b)
    with pytest.raises(ValueError, match="^intermediate"):
        conv_chain(st, x, w, b, intermediate=torch.empty(2, 3, 64, 3, device=DEVICE))
    with pytest.raises(ValueError, match="^intermediate"):
        conv_chain(st, x, w, b, intermediate=torch.empty(2, 2, 64, 3, dtype=torch.bfloat16,
                                                         device=DEVICE))
    with pytest.raises(ValueError, match="^state_indices"):
        conv_chain(st, x, w, b, state_indices=torch.tensor([3, 3], dtype=torch.int32).to(DEVICE),
                   validate=True)
    before = st.clone()
    with pytest.raises(ValueError, match="^state_indices"):
        conv_chain(st, x, w, b, state_indices=torch.tensor([1, 0, 2, 0]).to(DEVICE)[::2],
                   validate=True)
    assert bitwise_equal(st, before)


def test_carry_bad_input():
    d = _base(K=3)
    st, x, w, b = d["conv_state"], d["x"], d["weight"], d["bias"]
    slot_tab = torch.tensor([2, 0], dtype=torch.int32, device=DEVICE)
    carry = ConvCarry.empty(4, 64, cap=4, dtype=torch.float32)

    def verify(**kw):
        args = dict(conv_state=st, conv_carry=carry, x=x, weight=w, bias=b, slot_tab=slot_tab)
        args.update(kw)
        return conv_carry_verify(args.pop("conv_state"), args.pop("conv_carry"), args.pop("x"),
                                 args.pop("weight"), args.pop("bias"), **args)

    with pytest.raises(ValueError, match="^x"):           # K > CAP
        verify(conv_carry=ConvCarry.empty(4, 64, cap=2, dtype=torch.float32))
    with pytest.raises(ValueError, match="^conv_carry"):
        verify(conv_carry=ConvCarry.empty(4, 64, cap=4, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="^conv_carry"):
        verify(conv_carry=ConvCarry.empty(4, 32, cap=4, dtype=torch.float32))
    with pytest.raises(ValueError, match="^conv_carry"):
        verify(conv_carry=ConvCarry.empty(3, 64, cap=4, dtype=torch.float32))
    with pytest.raises(ValueError, match="^conv_carry"):
        verify(conv_carry=(carry.stash, carry.pend))
    with pytest.raises(ValueError, match="^slot_tab"):
        verify(slot_tab=slot_tab[:1])
    with pytest.raises(ValueError, match="^slot_tab"):
        verify(slot_tab=slot_tab.float())
    with pytest.raises(ValueError, match="^slot_tab"):    # strided view of [2, 0, 1, 0]
        verify(slot_tab=torch.tensor([2, 0, 1, 0], dtype=torch.int32, device=DEVICE)[::2],
               validate=True)
    with pytest.raises(ValueError, match="^slot_tab"):    # more sequences than slots
        verify(conv_state=st[:1], conv_carry=ConvCarry.empty(1, 64, cap=4, dtype=torch.float32))
    with pytest.raises(ValueError, match="^lazy"):
        verify(lazy="yes")
    with pytest.raises(ValueError, match="^x"):
        verify(x=x.bfloat16())
    with pytest.raises(ValueError, match="^slot_tab"):
        verify(slot_tab=torch.tensor([1, 1], dtype=torch.int32, device=DEVICE), validate=True)
    with pytest.raises(ValueError, match="^slot_tab"):
        verify(slot_tab=torch.tensor([1, 4], dtype=torch.int32, device=DEVICE), validate=True)
    carry.pend[2] = 5
    with pytest.raises(ValueError, match="^conv_carry.pend"):
        verify(validate=True)
    carry.pend[2] = -1
    with pytest.raises(ValueError, match="^conv_carry.pend"):
        verify(validate=True)
    carry.pend.zero_()
    carry.pend[3] = 9          # slot 3 is not in the batch: not read, not checked (as in GDN)
    verify(validate=True)
    assert int(carry.pend[3]) == 9
    with pytest.raises(ValueError, match="^stash"):
        ConvCarry(torch.zeros(4, 4, 64, dtype=torch.float16), torch.zeros(4, dtype=torch.int32))
    with pytest.raises(ValueError, match="^pend"):
        ConvCarry(torch.zeros(4, 4, 64), torch.zeros(4, dtype=torch.int64))
    with pytest.raises(ValueError, match="^pend"):     # carry_accept reads pend at stride 1
        ConvCarry(torch.zeros(4, 4, 64), torch.zeros(8, dtype=torch.int32)[::2])
    carry.pend.zero_()
    carry.stash.fill_(2.0)
    for slots in ([4], [-1], 9, [0.5], "ab", None, torch.tensor([0.0])):
        with pytest.raises(ValueError, match="^slots"):
            carry.reset(slots)
    assert int(carry.pend.abs().sum()) == 0 and bool((carry.stash == 2.0).all())
    with pytest.raises(ValueError, match="^device"):
        ConvCarry.empty(4, 64, device="bogus")
    with pytest.raises(ValueError, match="^dtype"):
        ConvCarry.empty(4, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match="^cap"):
        ConvCarry.empty(4, 64, cap=0)


def test_flush_bad_input():
    d = _base()
    st = d["conv_state"]
    slot_tab = torch.tensor([2, 0], dtype=torch.int32, device=DEVICE)
    c = ConvCarry.empty(4, 64, dtype=torch.float32)
    c2 = ConvCarry.empty(4, 64, dtype=torch.float32)
    with pytest.raises(ValueError, match="^conv_states"):
        conv_carry_flush([], [], slot_tab)
    with pytest.raises(ValueError, match="^conv_carries"):
        conv_carry_flush([st, st.clone()], [c], slot_tab)
    with pytest.raises(ValueError, match=r"^conv_states\[1\]"):
        conv_carry_flush([st, st[:, :32].clone()], [c, c2], slot_tab)
    with pytest.raises(ValueError, match=r"^conv_states\[1\]"):
        conv_carry_flush([st, st.transpose(1, 2).contiguous().transpose(1, 2)], [c, c2], slot_tab)
    with pytest.raises(ValueError, match=r"^conv_carries\[1\]"):
        conv_carry_flush([st, st.clone()], [c, ConvCarry.empty(4, 64, dtype=torch.bfloat16)],
                         slot_tab)
    with pytest.raises(ValueError, match="^slot_tab"):
        conv_carry_flush([st], [c], [2, 0])
    with pytest.raises(ValueError, match="^slot_tab"):    # strided view of [2, 0, 1, 0]
        conv_carry_flush([st], [c], torch.tensor([2, 0, 1, 0], device=DEVICE)[::2])
    with pytest.raises(ValueError, match="^slot_tab"):    # 6 sequences, 4 slots
        conv_carry_flush([st], [c], torch.arange(6, device=DEVICE))
    with pytest.raises(ValueError, match="^slot_tab"):
        conv_carry_flush([st], [c], torch.tensor([1, 1], dtype=torch.int32, device=DEVICE),
                         validate=True)
    c2.pend[0] = 9
    with pytest.raises(ValueError, match=r"^conv_carries\[1\].pend"):
        conv_carry_flush([st, st.clone()], [c, c2], slot_tab, validate=True)


def test_flush_offset_table_keyed_on_element_size():
    """The conv flush's cached offset table must not be reused for tensors of another dtype at
    the same addresses (a caching allocator does that): element offsets differ by the element
    size."""
    from pmll_lab.ops.conv.carry import _offset_table

    arena = torch.empty(4096, dtype=torch.uint8, device=DEVICE)
    f32 = [arena[0:1024].view(torch.float32), arena[2048:3072].view(torch.float32)]
    b16 = [arena[0:1024].view(torch.bfloat16), arena[2048:3072].view(torch.bfloat16)]
    t32 = _offset_table([f32, f32, f32], DEVICE)
    t16 = _offset_table([b16, b16, b16], DEVICE)
    assert t32.tolist() == [0, 512] * 3
    assert t16.tolist() == [0, 1024] * 3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_conv_carry_like_follows_the_state(dtype):
    """``ConvCarry.like(conv_state)``: slots, dim, dtype and device of the state, so an fp32
    conv state gets an fp32 stash (``empty`` defaults to bf16 and the verify refuses the mix,
    naming the way out). The carry then verifies as the plain chain (pend 0: bitwise)."""
    c = conv_inputs(91, 2, 64, rows=3, slots=3, dtype=dtype)
    carry = ConvCarry.like(c["conv_state"], cap=4)
    assert carry.stash.shape == (3, 4, 64) and carry.stash.dtype == dtype
    assert carry.stash.device == c["conv_state"].device and carry.pend.tolist() == [0, 0, 0]
    slot_tab = c["state_indices"]
    y, eng = conv_carry_verify(c["conv_state"].clone(), carry, c["x"], c["weight"], c["bias"],
                               slot_tab=slot_tab)
    y_plain = conv_chain(c["conv_state"].clone(), c["x"], c["weight"], c["bias"],
                         state_indices=slot_tab)
    assert bitwise_equal(y, y_plain) and eng.tolist() == [1, 1]
    if dtype == torch.float32:
        with pytest.raises(ValueError, match=r"^conv_carry: .*ConvCarry.like\(conv_state\)"):
            conv_carry_verify(c["conv_state"], ConvCarry.empty(3, 64), c["x"], c["weight"],
                              c["bias"], slot_tab=slot_tab)
    with pytest.raises(ValueError, match="^conv_state"):
        ConvCarry.like(c["conv_state"][0])
