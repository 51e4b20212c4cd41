"""The float64 GDN reference (``pmll_lab.reference.gdn``) against independent oracles (SPEC §2).

- an independent closed-form (triangular solve) re-derivation of the same K rows in float64:
  outputs, final state and a snapshot within relative L2 ``1e-12``;
- fla-core's ``naive_recurrent_gated_delta_rule`` (the peer, computing in fp32, heads matched,
  with and without the q/k l2norm): outputs and final state within ``1e-5``; the test fails if
  fla-core does not import;
- the reference leaves its inputs bitwise unchanged.
"""

from __future__ import annotations

import pytest
import torch

import pmll_lab  # noqa: F401  (first: picks GPU or the Triton interpreter)
from pmll_lab.bench import bitwise_equal
from pmll_lab.gdn import gdn_chain_ref, gdn_decode_ref
from pmll_lab.inputs import gdn_inputs

from _gdn_helpers import _check_close


def test_reference_does_not_mutate_inputs():
    x = gdn_inputs(3, 2, 1, 2, 16, 16, rows=3, slots=3, dtype=torch.bfloat16, state_layout="kv")
    copies = {n: t.clone() for n, t in x.items()}
    gdn_chain_ref(x["state"], x["q"], x["k"], x["v"], x["g"], x["beta"],
                  state_indices=x["state_indices"], state_layout="kv")
    gdn_decode_ref(x["state"], x["q"][:, 0], x["k"][:, 0], x["v"][:, 0], x["g"][:, 0],
                   x["beta"][:, 0], state_indices=x["state_indices"], state_layout="kv")
    for n, t in x.items():
        assert bitwise_equal(t, copies[n]), n


# ---- the float64 reference against peers -------------------------------------------------------

def _solve_chain(h0, q, k, v, g, beta):
    """Closed form of K rows at once by a triangular solve (the algebra SPEC §3d's ring form uses
    for its new rows), float64, heads already matched:
    ``h0 [N, kd, vd]``, ``q, k [N, K, kd]`` (normalised, scaled), ``v [N, K, vd]``,
    ``g, beta [N, K]``. With ``c_t = sum_{s<=t} g_s``: ``(I + A) U = beta*(V - exp(c) K h0)``,
    ``A[t,s] = beta_t exp(c_t - c_s) k_t.k_s`` (s < t); ``o_t = exp(c_t) h0^T q_t +
    sum_{s<=t} exp(c_t - c_s) (q_t.k_s) u_s``; ``h_K = exp(c_K) h0 + sum_s exp(c_K-c_s) k_s u_s^T``.
    """
    N, K, _ = k.shape
    c = torch.cumsum(g, dim=1)                                    # [N, K]
    decay = torch.exp(c[:, :, None] - c[:, None, :])              # [N, t, s]
    lower = torch.tril(torch.ones(K, K, dtype=torch.bool, device=k.device), -1)
    A = beta[:, :, None] * decay * (k @ k.transpose(1, 2)) * lower
    rhs = beta[:, :, None] * (v - torch.exp(c)[:, :, None] * (k @ h0))
    eye = torch.eye(K, dtype=k.dtype, device=k.device)
    U = torch.linalg.solve_triangular(eye + A, rhs, upper=False, unitriangular=True)
    incl = torch.tril(torch.ones(K, K, dtype=torch.bool, device=k.device))
    o = torch.exp(c)[:, :, None] * (q @ h0) + (decay * (q @ k.transpose(1, 2)) * incl) @ U
    w = torch.exp(c[:, -1:] - c)                                  # [N, K]
    hK = torch.exp(c[:, -1])[:, None, None] * h0 + (k * w[:, :, None]).transpose(1, 2) @ U
    return o, hK


def _heads_matched(x, K, HK, HV, scale=None, l2=True):
    """float64 normalised, scaled q, k repeated to value heads: [B, K, HV, kd]."""
    q, k = x["q"].double(), x["k"].double()
    if l2:
        q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    q = q * (q.shape[-1] ** -0.5 if scale is None else scale)
    return q.repeat_interleave(HV // HK, 2), k.repeat_interleave(HV // HK, 2)


def test_reference_matches_triangular_solve_closed_form():
    B, K, HK, HV, kd, vd = 3, 8, 2, 4, 16, 24
    x = gdn_inputs(51, B, HK, HV, kd, vd, rows=K, slots=4, dtype=torch.float32, state_layout="kv")
    idx = x["state_indices"].long()
    o_ref, s_ref, i_ref = gdn_chain_ref(x["state"], x["q"], x["k"], x["v"], x["g"], x["beta"],
                                        state_indices=x["state_indices"], state_layout="kv")
    q, k = _heads_matched(x, K, HK, HV)
    flat = lambda t: t.transpose(1, 2).reshape(B * HV, K, *t.shape[3:])  # noqa: E731
    o_cf, h_cf = _solve_chain(x["state"][idx].double().reshape(B * HV, kd, vd), flat(q), flat(k),
                           flat(x["v"].double()), flat(x["g"].double()), flat(x["beta"].double()))
    o_cf = o_cf.reshape(B, HV, K, vd).transpose(1, 2)
    _check_close("o (closed form)", o_ref, o_cf, 1e-12)
    _check_close("state (closed form)", s_ref[idx], h_cf.reshape(B, HV, kd, vd), 1e-12)
    # the snapshots are the closed form's final states of the first t+1 rows
    o_cf3, h_cf3 = _solve_chain(x["state"][idx].double().reshape(B * HV, kd, vd), *(
        flat(t)[:, :3] for t in (q, k, x["v"].double(), x["g"].double(), x["beta"].double())))
    _check_close("intermediate[2] (closed form)", i_ref[:, 2], h_cf3.reshape(B, HV, kd, vd), 1e-12)


def _fla_naive():
    try:
        from fla.ops.gated_delta_rule.naive import naive_recurrent_gated_delta_rule
    except Exception as exc:  # noqa: BLE001 - report exactly why the peer is missing
        pytest.fail(f"peer oracle unavailable: fla.ops.gated_delta_rule.naive does not import "
                    f"({type(exc).__name__}: {exc}); install fla-core (extra 'dev' or 'peers')")
    return naive_recurrent_gated_delta_rule


@pytest.mark.parametrize("l2", [True, False])
def test_reference_matches_fla_naive(l2):
    """fla-core's ``naive_recurrent_gated_delta_rule`` (fp32, no l2norm, heads matched) is the
    peer oracle; the test fails if fla-core is missing (the triangular-solve closed form is checked on its own
    in ``test_reference_matches_triangular_solve_closed_form``)."""
    B, K, HK, HV, kd, vd = 2, 6, 1, 2, 16, 32
    x = gdn_inputs(61 + l2, B, HK, HV, kd, vd, rows=K, slots=3, dtype=torch.float32,
                   state_layout="kv")
    idx = x["state_indices"].long()
    o_ref, s_ref, _ = gdn_chain_ref(x["state"], x["q"], x["k"], x["v"], x["g"], x["beta"],
                                    state_indices=x["state_indices"], use_qk_l2norm=l2,
                                    state_layout="kv")
    q, k = _heads_matched(x, K, HK, HV, l2=l2)
    h0 = x["state"][idx].double()
    naive = _fla_naive()
    # fla's naive scales q itself: hand it unscaled q and the scale, in fp32 as it computes.
    o_p, h_p = naive(q=(q * kd ** 0.5).float().cpu(), k=k.float().cpu(),
                     v=x["v"].float().cpu(), beta=x["beta"].float().cpu(),
                     g=x["g"].float().cpu(), scale=kd ** -0.5, initial_state=h0.float().cpu(),
                     output_final_state=True)
    tol = 1e-5                                       # the peer computes in fp32
    _check_close("o vs peer", o_ref.cpu(), o_p, tol)
    _check_close("state vs peer", s_ref[idx].cpu(), h_p, tol)


def test_reference_names_a_misshapen_argument():
    """The float64 references check shapes first: chain-shaped q to the decode reference (or
    decode-shaped q to the chain's), a v without the state's heads, a g with a rows axis."""
    from pmll_lab.reference.gdn import gdn_chain_ref, gdn_decode_ref

    one = gdn_inputs(5, 2, 1, 2, 8, 8, state_layout="kv")
    rows = gdn_inputs(5, 2, 1, 2, 8, 8, rows=3, state_layout="kv")
    args = lambda x: (x["state"], x["q"], x["k"], x["v"], x["g"], x["beta"])  # noqa: E731
    with pytest.raises(ValueError, match=r"^q: expected \[B, HK, kd\] .* got \(2, 3, 1, 8\)"):
        gdn_decode_ref(*args(rows), state_layout="kv")
    with pytest.raises(ValueError, match=r"^q: expected \[B, K, HK, kd\]"):
        gdn_chain_ref(*args(one), state_layout="kv")
    st, q, k, v, g, beta = args(one)
    with pytest.raises(ValueError, match=r"^v: expected \[B, HV, vd\]"):
        gdn_decode_ref(st, q, k, v[:, :1], g, beta, state_layout="kv")
    with pytest.raises(ValueError, match=r"^g: expected \[B, HV\]"):
        gdn_decode_ref(st, q, k, v, g[:, None], beta, state_layout="kv")


def test_reference_takes_a_named_state_dtype_and_blames_q_for_its_key_size():
    """``state_dtype`` may be a name ("bfloat16" rounds as torch.bfloat16 does); a nonsense one
    and a q whose key size is not the state's are ValueErrors naming the argument at fault."""
    from pmll_lab.reference.gdn import gdn_decode_ref

    x = gdn_inputs(6, 2, 1, 2, 16, 16, state_layout="kv")
    args = [x[n] for n in ("state", "q", "k", "v", "g", "beta")]
    by_name = gdn_decode_ref(*args, state_dtype="bfloat16", state_layout="kv")[1]
    assert torch.equal(by_name, gdn_decode_ref(*args, state_dtype=torch.bfloat16,
                                               state_layout="kv")[1])
    assert not torch.equal(by_name, gdn_decode_ref(*args, state_layout="kv")[1])
    with pytest.raises(ValueError, match="^state_dtype: expected None, float32, bfloat16"):
        gdn_decode_ref(*args, state_dtype="bf16", state_layout="kv")
    st, q, k, v, g, beta = args
    with pytest.raises(ValueError, match=r"^q: expected kd=16"):
        gdn_decode_ref(st, q[..., :8], k, v, g, beta, state_layout="kv")
