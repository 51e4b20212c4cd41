"""The GDN decode's CUDA C++ twin (``gdn_decode(..., impl="cuda")``, ``kernels/gdn_decode.cu``) on a
V-major state against the float64 reference (SPEC §2).

Tolerances (``pmll_lab.tolerances``): outputs ``O_TOL`` of the input dtype; an fp32 state
``STATE_TOL``; a bf16/fp16 state ``HALF_STATE_TOL`` against the reference rounded where the
kernel stores it. Slots not addressed (and a padding lane's, and with ``out_state_indices`` the
read slots) must keep their bits. Not bitwise against the Triton kernel: the twin sums over keys
in another order (``pmll_lab.ops.gdn.decode_cuda``); the two are compared to ``O_TOL``.

As in ``tests/cuda/test_cuda_twins.py``: where the kernels' device is the CPU the GPU tests check
that ``impl="cuda"`` refuses instead; the error tests run everywhere.
"""

from __future__ import annotations

import pmll_lab  # noqa: F401  (first: picks GPU or the Triton interpreter)

import pytest
import torch

from _cuda_refusal import _refused
from pmll_lab import cuda_ext
from pmll_lab.backend import DEVICE
from pmll_lab.bench import errors
from pmll_lab.gdn import gdn_decode, gdn_decode_ref, gdn_gating_ref
from pmll_lab.inputs import gdn_inputs
from pmll_lab.tolerances import HALF_STATE_TOL, O_TOL, STATE_TOL

ON_GPU = DEVICE.type == "cuda"


def _close(name, out, want, tol):
    e = errors(out, want)
    assert e["rel_l2"] <= tol, f"{name}: rel_l2 {e['rel_l2']:.3e} > {tol:.0e}"


def _case(seed, dtype, state_dtype, B, S, HK, HV, kd, vd, pad):
    x = gdn_inputs(seed, B, HK, HV, kd, vd, slots=S, dtype=dtype, state_layout="kv")
    state = x["state"].transpose(-1, -2).contiguous().to(state_dtype)     # [S, HV, vd, kd]
    idx = x["state_indices"].clone()
    if pad:
        idx[1] = -1
    return x, state, idx


# (dtype, state dtype, B, S, HK, HV, kd, vd): GVA 1 and 2, kd != vd, kd not a multiple of 32,
# kd = 256 (8 keys a lane), Qwen3-Next's 128.
CASES = [
    (torch.float32, torch.float32, 3, 5, 2, 4, 32, 24),
    (torch.bfloat16, torch.float32, 2, 4, 1, 2, 24, 40),
    (torch.float16, torch.float16, 2, 3, 1, 1, 16, 16),
    (torch.bfloat16, torch.bfloat16, 4, 6, 2, 4, 128, 128),
    (torch.float32, torch.bfloat16, 2, 2, 1, 2, 256, 64),
    (torch.bfloat16, torch.bfloat16, 2, 3, 1, 2, 18, 24),   # kd % 4 != 0: element loads
    # B * HV * vd / 64 >= 256 blocks: wide blocks (4 value rows per lane group) where kd = 32, 64 or 128
    # and vd % 64 == 0; vd = 72 keeps one row per group (rows past vd)
    (torch.bfloat16, torch.bfloat16, 32, 33, 16, 32, 128, 128),
    (torch.float16, torch.float32, 16, 17, 4, 64, 32, 72),
    (torch.float16, torch.float32, 16, 17, 4, 64, 32, 64),
]


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("pad", [False, True])
@pytest.mark.parametrize("dtype,state_dtype,B,S,HK,HV,kd,vd", CASES)
def test_decode_vk_against_reference(dtype, state_dtype, B, S, HK, HV, kd, vd, pad, gated):
    x, state, idx = _case(3 + kd, dtype, state_dtype, B, S, HK, HV, kd, vd, pad)
    gen = torch.Generator().manual_seed(kd)
    if gated:
        gates = dict(A_log=(torch.rand(HV, generator=gen) * 2 - 1).to(DEVICE),
                     dt_bias=torch.randn(HV, generator=gen).to(DEVICE),
                     a=(torch.randn(B, HV, generator=gen) * 3).to(dtype).to(DEVICE),
                     b=(torch.randn(B, HV, generator=gen) * 3).to(dtype).to(DEVICE))
        g, beta = gdn_gating_ref(gates["A_log"], gates["a"], gates["dt_bias"], gates["b"])
    else:
        gates = dict(g=x["g"], beta=x["beta"])
        g, beta = x["g"], x["beta"]
    before = state.clone()

    def run(impl):
        return gdn_decode(state, x["q"], x["k"], x["v"], state_indices=idx, validate=True,
                          state_layout="vk", impl=impl, **gates)
    if not ON_GPU:
        _refused(lambda: run("cuda"))
        assert torch.equal(state, before)
        return
    o_ref, s_ref = gdn_decode_ref(before, x["q"], x["k"], x["v"], g, beta, state_indices=idx,
                                  state_layout="vk", state_dtype=state_dtype)
    o = run("cuda")
    assert o.shape == (B, HV, vd) and o.dtype == dtype
    _close("o", o, o_ref, O_TOL[dtype])
    tol = STATE_TOL if state_dtype == torch.float32 else HALF_STATE_TOL[state_dtype]
    _close("state", state, s_ref, tol)
    if pad:
        assert torch.equal(o[1], torch.zeros_like(o[1]))
    live = idx[idx >= 0].long()
    keep = torch.ones(S, dtype=torch.bool, device=DEVICE)
    keep[live] = False
    assert torch.equal(state[keep], before[keep]), "a slot not decoded changed"
    tri_state = before.clone()
    state = tri_state
    o_tri = run("triton")
    _close("o against Triton", o, o_tri, O_TOL[dtype])


def test_out_state_indices_keeps_read_slots():
    """New states go to out_state_indices; the read slots keep their bits."""
    x, state, idx = _case(9, torch.bfloat16, torch.float32, 2, 5, 1, 2, 64, 32, False)
    free = [s for s in range(5) if s not in idx.tolist()]
    out = torch.tensor(free[:2], dtype=torch.int64, device=DEVICE)
    before = state.clone()
    call = lambda: gdn_decode(state, x["q"], x["k"], x["v"], x["g"], x["beta"],  # noqa: E731
                              state_indices=idx, out_state_indices=out, validate=True,
                              state_layout="vk", impl="cuda")
    if not ON_GPU:
        _refused(call)
        return
    o = call()
    o_ref, s_ref = gdn_decode_ref(before, x["q"], x["k"], x["v"], x["g"], x["beta"],
                                  state_indices=idx, state_layout="vk")
    _close("o", o, o_ref, O_TOL[torch.bfloat16])
    assert torch.equal(state[idx.long()], before[idx.long()])
    _close("written", state[out], s_ref[idx.long()], STATE_TOL)


def test_errors_before_the_cuda_path(monkeypatch):
    """Bad impl, a K-major state, kd > 256 and the decode's own argument errors: ValueError
    naming the argument, the CUDA path never reached; without a GPU the RuntimeError."""
    def reached(*a, **k):
        raise AssertionError("the CUDA path was reached before the checks")
    x, state, idx = _case(11, torch.float32, torch.float32, 2, 2, 1, 1, 16, 16, False)
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"])
    with monkeypatch.context() as m:
        m.setattr(cuda_ext, "require_gpu", reached)
        with pytest.raises(ValueError, match=r"^impl: must be one of \['triton', 'cuda'\]"):
            gdn_decode(state, *args, state_layout="vk", impl="cuda ")
        with pytest.raises(ValueError, match="^impl: the CUDA twin of the decode takes V-major"):
            gdn_decode(x["state"], *args, state_layout="kv", impl="cuda")
        with pytest.raises(ValueError, match="^q:"):
            gdn_decode(state, x["q"][:, :, :8], *args[1:], state_layout="vk", impl="cuda")
        y = gdn_inputs(12, 1, 1, 1, 288, 8, dtype=torch.float32, state_layout="kv")
        big = y["state"].transpose(-1, -2).contiguous()
        with pytest.raises(ValueError, match="^impl: the CUDA twin of the decode takes kd <= 256"):
            gdn_decode(big, y["q"], y["k"], y["v"], y["g"], y["beta"], state_layout="vk",
                       impl="cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(cuda_ext, "build_extension", reached)
    before = state.clone()
    with pytest.raises(RuntimeError, match="needs an NVIDIA GPU"):
        gdn_decode(state, *args, state_layout="vk", impl="cuda")
    assert torch.equal(state, before)


def _off_boundary(t):
    """``t``'s values in a buffer two elements in: its rows off the 4-element boundary."""
    buf = torch.zeros(t.numel() + 2, dtype=t.dtype, device=t.device)
    view = buf[2:].view(t.shape)
    view.copy_(t)
    return view


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_decode_views_off_the_vector_boundary_store_the_same_bits(state_dtype):
    """A state pool and q, k two elements into larger buffers (element loads) give the bits of
    the same decode on aligned tensors (vector loads): both paths hold each lane's keys in the
    same order, so every sum runs alike."""
    x, state, idx = _case(11, torch.bfloat16, state_dtype, 2, 3, 1, 2, 64, 32, False)
    st_off, q_off, k_off = _off_boundary(state), _off_boundary(x["q"]), _off_boundary(x["k"])

    def run(st, q, k):
        return gdn_decode(st, q, k, x["v"], x["g"], x["beta"], state_indices=idx,
                          state_layout="vk", impl="cuda")
    if not ON_GPU:
        _refused(lambda: run(st_off, q_off, k_off))
        return
    o_vec = run(state, x["q"], x["k"])
    o_elem = run(st_off, q_off, k_off)
    assert torch.equal(o_vec, o_elem) and torch.equal(state, st_off)
