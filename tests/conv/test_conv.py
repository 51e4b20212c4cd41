"""Causal depthwise conv: ``conv_update`` and the K-row ``conv_chain`` (SPEC §3c).

Kernels run through the Triton interpreter on CPU (small shapes) or on the GPU, against the
float64 reference (``pmll_lab.reference.conv``), which is checked in turn against HF
transformers' Qwen3-Next torch ``causal_conv1d_update`` (+ its ``l2norm``) in float64 (1e-12).
Tolerances (relative L2 against the float64 reference, ``pmll_lab.bench.errors``):

- outputs in fp32 (fp32 inputs, or bf16 inputs with ``out_dtype=float32``): 1e-5. The arithmetic
  is fp32 over d_conv <= 4 taps, then SiLU and the l2norm: a few ulp.
- outputs in bf16: 8e-3 (one bf16 rounding, 2**-9 relative, dominates).
- windows: bitwise (they hold exact copies of the inputs).

Bitwise (SPEC §2 "Exactness"): conv_chain == successive conv_update (outputs, final and
intermediate windows), whatever the alignment of the views. The carry twin is in
test_conv_carry.py, bad input in test_conv_inputs.py.
"""

from __future__ import annotations

import pytest
import torch

import pmll_lab  # noqa: F401  (first: picks GPU or interpreter)
from pmll_lab.backend import DEVICE
from pmll_lab.bench import bitwise_equal
from pmll_lab.conv import (
    ConvCarry,
    conv_block_config,
    conv_carry_verify,
    conv_chain,
    conv_update,
)
from pmll_lab.inputs import conv_inputs, generator
from pmll_lab.reference import conv as ref

from _conv_helpers import DIM, HD, QK, TOL_F32, _check_close, _guarded, _outside, _same, _tol


def _randn(gen, *shape, dtype):
    return torch.randn(*shape, generator=gen).to(dtype).to(DEVICE)


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


def test_conv_budget_table_names_its_unit():
    """The bytes table's columns carry their unit (KiB), as gdn_verify's carry MiB."""
    from pmll_lab.experiments import conv as E

    t = E.budget_table(("qwen3-next",), Ks=(1, 4))
    assert list(t.columns) == ["shape", "dim", "window, KiB", "carry stash (CAP=8), KiB",
                               "snapshots K=1, KiB", "snapshots K=4, KiB"]
    assert t.loc[0, "window, KiB"] == 48.0 and t.loc[0, "snapshots K=4, KiB"] == 144.0


def test_conv_error_plot_names_kernels_as_its_tables_do():
    """The error plot's legend uses the notebook's labels for the rows' own kernel names (the
    conv's ``chain`` shares a colour with the GDN chain, not its name), its x axis says what it
    lists, and each tolerance dash names the input dtype it holds for."""
    import matplotlib

    matplotlib.use("Agg")
    import pandas as pd

    from pmll_lab.experiments import conv as E

    rows = [dict(kernel=k, metric="rel_l2", what="y", value=v, tolerance=tol, dtype=dt,
                 passed=True, point_id=i)
            for i, (k, v, tol, dt) in enumerate([("chain", 1e-3, 8e-3, "bfloat16"),
                                                  ("updates", 2e-3, 8e-3, "bfloat16"),
                                                  ("carry_lazy", 1e-6, 1e-5, "float32")])]
    fig = E.plot_errors(pd.DataFrame(rows))
    labels = {t.get_text() for t in fig.legends[0].get_texts()} if fig.legends else {
        t for ax in fig.axes for t in ax.get_legend_handles_labels()[1]}
    assert {"chain + window snapshots", "K successive conv_update",
            "carry verify, lazy"} <= labels, labels
    assert not labels & {"chain_snapshots", "decodes", "carry_exact_lazy"}
    texts = {t.get_text() for ax in fig.axes for t in ax.texts}
    assert {"bf16", "fp32"} <= texts, texts
    assert all(ax.get_xlabel() == "compared quantity" for ax in fig.axes)
