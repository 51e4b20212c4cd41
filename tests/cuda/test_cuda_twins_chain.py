"""The chain-with-snapshots' CUDA C++ twin (``gdn_chain(..., impl="cuda")``,
``kernels/gdn_chain.cu``) on a V-major state: against the float64 reference and, bitwise,
against ``K`` successive decode-twin launches (SPEC §2 "Exactness", §3a).

Tolerances (``pmll_lab.tolerances``), as for the decode twin: outputs ``O_TOL`` of the input
dtype; final state and every snapshot ``STATE_TOL`` (fp32 state) or ``HALF_STATE_TOL`` (bf16 /
fp16 state) against the reference rounded after every row, where the kernel rounds. Bitwise:
outputs, snapshots ``t < K-1`` and final state against ``gdn_decode(impl="cuda")`` applied row
by row. Against the Triton chain: the same tolerances (its sums over keys run in another
order). A padding lane (slot -1) has zero outputs and leaves its snapshot rows and every slot
as they were; slots not addressed keep their bits.

As in ``tests/cuda/test_cuda_twins_gdn.py``: where the kernels' device is the CPU the GPU tests
check that ``impl="cuda"`` refuses (nothing written); the error tests run everywhere.
"""

from __future__ import annotations

import pmll_lab  # noqa: F401  (first: picks GPU or the Triton interpreter)

import pytest
import torch

from _cuda_refusal import _refused
from _twin_cases import vk_case as _case
from pmll_lab import cuda_ext
from pmll_lab.backend import DEVICE
from pmll_lab.bench import bitwise_equal, errors
from pmll_lab.gdn import gdn_chain, gdn_chain_ref, gdn_decode
from pmll_lab.inputs import gdn_inputs
from pmll_lab.tolerances import HALF_STATE_TOL, O_TOL, STATE_TOL

ON_GPU = DEVICE.type == "cuda"


def _close(name, out, want, tol):
    e = errors(out, want)
    assert e["rel_l2"] <= tol, f"{name}: rel_l2 {e['rel_l2']:.3e} > {tol:.0e}"


def _row(gates, t):
    """Row ``t`` of the chain's gate arguments, as one decode takes them."""
    return {n: (v if n in ("A_log", "dt_bias") else v[:, t]) for n, v in gates.items()}


def _snapshots(seed, B, K, HV, vd, kd, dtype):
    """A seeded snapshot buffer ``[B, K-1, HV, vd, kd]``: rows never written keep these bits."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(B, K - 1, HV, vd, kd, generator=gen).to(dtype).to(DEVICE)


# (dtype, state dtype, B, K, S, HK, HV, kd, vd): GVA 1 and 2, kd != vd, kd not a multiple of 32,
# kd = 256 (8 keys a lane), Qwen3-Next's 128, K = 1 (no snapshots) to K = 8 (MAX_ROWS).
CASES = [
    (torch.float32, torch.float32, 3, 4, 5, 2, 4, 32, 24),
    (torch.bfloat16, torch.float32, 2, 8, 4, 1, 2, 24, 40),
    (torch.float16, torch.float16, 2, 3, 3, 1, 1, 16, 16),
    (torch.bfloat16, torch.bfloat16, 4, 4, 6, 2, 4, 128, 128),
    (torch.float32, torch.bfloat16, 2, 2, 2, 1, 2, 256, 64),
    (torch.bfloat16, torch.float16, 2, 1, 3, 1, 2, 64, 32),
    (torch.float32, torch.float32, 2, 3, 3, 1, 2, 18, 24),   # kd % 4 != 0: element loads
    # B * HV * vd / 64 >= 256 blocks: wide blocks (4 value rows per lane group) where kd = 32, 64 or 128
    # and vd % 64 == 0; vd = 72 keeps one row per group (rows past vd)
    (torch.bfloat16, torch.bfloat16, 32, 4, 33, 16, 32, 128, 128),
    (torch.float32, torch.float16, 16, 8, 17, 4, 64, 32, 72),
    (torch.float32, torch.float16, 16, 8, 17, 4, 64, 32, 64),
]


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("pad", [False, True])
@pytest.mark.parametrize("dtype,state_dtype,B,K,S,HK,HV,kd,vd", CASES)
def test_chain_vk_against_reference_and_decodes(dtype, state_dtype, B, K, S, HK, HV, kd, vd,
                                                pad, gated):
    x, state, idx, gates, (g, beta) = _case(5 + kd + K, dtype, state_dtype, B, K, S, HK, HV,
                                            kd, vd, pad, gated)
    before = state.clone()
    inter = _snapshots(kd + K, B, K, HV, vd, kd, state_dtype)
    inter0 = inter.clone()
    call = lambda: gdn_chain(state, x["q"], x["k"], x["v"], state_indices=idx,  # noqa: E731
                             intermediate=inter, validate=True, state_layout="vk", impl="cuda",
                             **gates)
    if not ON_GPU:
        _refused(call)
        assert torch.equal(state, before) and torch.equal(inter, inter0)
        return
    o = call()
    assert o.shape == (B, K, HV, vd) and o.dtype == dtype

    o_ref, s_ref, i_ref = gdn_chain_ref(before, x["q"], x["k"], x["v"], g, beta,
                                        state_indices=idx, state_layout="vk",
                                        state_dtype=state_dtype)
    tol = STATE_TOL if state_dtype == torch.float32 else HALF_STATE_TOL[state_dtype]
    live = idx >= 0
    _close("o", o, o_ref, O_TOL[dtype])
    _close("state", state, s_ref, tol)
    if K > 1:
        _close("snapshots", inter[live], i_ref[live], tol)
    if pad:
        assert torch.equal(o[1], torch.zeros_like(o[1])), "padding lane: outputs not zero"
        assert torch.equal(inter[1], inter0[1]), "padding lane: snapshot rows written"
    keep = torch.ones(S, dtype=torch.bool, device=DEVICE)
    keep[idx[live].long()] = False
    assert torch.equal(state[keep], before[keep]), "a slot not addressed changed"

    dec = before.clone()
    for t in range(K):
        o_t = gdn_decode(dec, x["q"][:, t], x["k"][:, t], x["v"][:, t], state_indices=idx,
                         validate=True, state_layout="vk", impl="cuda", **_row(gates, t))
        assert bitwise_equal(o[:, t], o_t), f"row {t}: chain output != decode twin"
        if t < K - 1:
            assert bitwise_equal(inter[live, t], dec[idx[live].long()]), \
                f"snapshot {t} != the decode twin's state after row {t}"
    assert bitwise_equal(state, dec), "final state != K decode-twin launches"

    tri = before.clone()
    o_tri = gdn_chain(tri, x["q"], x["k"], x["v"], state_indices=idx, validate=True,
                      state_layout="vk", impl="triton", **gates)
    _close("o against the Triton chain", o, o_tri, O_TOL[dtype])
    _close("state against the Triton chain", state, tri, tol)


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_out_state_indices_keeps_read_slots(state_dtype):
    """The state after the last row goes to out_state_indices, the read slots keep their bits;
    bitwise a first decode into the write slots, then decodes there in place."""
    K = 3
    x, state, idx, gates, _ = _case(21, torch.bfloat16, state_dtype, 2, K, 5, 1, 2, 64, 32,
                                    False, False)
    free = [s for s in range(5) if s not in idx.tolist()]
    out = torch.tensor(free[:2], dtype=torch.int64, device=DEVICE)
    before = state.clone()
    inter = _snapshots(22, 2, K, 2, 32, 64, state_dtype)
    call = lambda: gdn_chain(state, x["q"], x["k"], x["v"], state_indices=idx,  # noqa: E731
                             out_state_indices=out, intermediate=inter, validate=True,
                             state_layout="vk", impl="cuda", **gates)
    if not ON_GPU:
        _refused(call)
        assert torch.equal(state, before)
        return
    o = call()
    assert torch.equal(state[idx.long()], before[idx.long()]), "a read slot changed"
    dec = before.clone()
    for t in range(K):
        read = idx if t == 0 else out
        o_t = gdn_decode(dec, x["q"][:, t], x["k"][:, t], x["v"][:, t], state_indices=read,
                         out_state_indices=out, validate=True, state_layout="vk", impl="cuda",
                         **_row(gates, t))
        assert bitwise_equal(o[:, t], o_t), f"row {t}: chain output != decode twin"
        if t < K - 1:
            assert bitwise_equal(inter[:, t], dec[out]), f"snapshot {t} != decode twin"
    assert bitwise_equal(state, dec), "states != decode-twin launches"


# ---- everywhere: errors -------------------------------------------------------------------------

def test_errors_before_the_cuda_path(monkeypatch):
    """Bad impl, a K-major state, kd > 256 and the chain's own argument errors: ValueError
    naming the argument, the CUDA path never reached; without a GPU the RuntimeError, nothing
    written."""
    def reached(*a, **k):
        raise AssertionError("the CUDA path was reached before the checks")
    x, state, idx, gates, _ = _case(31, torch.float32, torch.float32, 2, 3, 2, 1, 1, 16, 16,
                                    False, False)
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"])
    inter = _snapshots(32, 2, 3, 1, 16, 16, torch.float32)
    with monkeypatch.context() as m:
        m.setattr(cuda_ext, "require_gpu", reached)
        for bad in ("cuda ", "CUDA", None):
            with pytest.raises(ValueError, match=r"^impl: must be one of \['triton', 'cuda'\]"):
                gdn_chain(state, *args, state_layout="vk", impl=bad)
        with pytest.raises(ValueError, match="^impl: the CUDA twin of the chain takes V-major"):
            gdn_chain(x["state"], *args, state_layout="kv", impl="cuda")
        with pytest.raises(ValueError, match="^q:"):
            gdn_chain(state, x["q"][:, :, :, :8], *args[1:], state_layout="vk", impl="cuda")
        with pytest.raises(ValueError, match="^intermediate:"):
            gdn_chain(state, *args, intermediate=inter[:, :1], state_layout="vk", impl="cuda")
        z = gdn_inputs(34, 2, 1, 1, 16, 16, rows=9, dtype=torch.float32, state_layout="kv")
        with pytest.raises(ValueError, match=r"^q: rows per sequence K \(dim 1\) must lie in"):
            gdn_chain(state, z["q"], z["k"], z["v"], z["g"], z["beta"], state_layout="vk",
                      impl="cuda")
        y = gdn_inputs(33, 1, 1, 1, 288, 8, rows=2, dtype=torch.float32, state_layout="kv")
        big = y["state"].transpose(-1, -2).contiguous()
        with pytest.raises(ValueError, match="^impl: the CUDA twin of the chain takes kd <= 256"):
            gdn_chain(big, y["q"], y["k"], y["v"], y["g"], y["beta"], state_layout="vk",
                      impl="cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(cuda_ext, "build_extension", reached)
    before, inter0 = state.clone(), inter.clone()
    with pytest.raises(RuntimeError, match="needs an NVIDIA GPU.*impl='triton'"):
        gdn_chain(state, *args, intermediate=inter, state_layout="vk", impl="cuda")
    assert torch.equal(state, before) and torch.equal(inter, inter0)
