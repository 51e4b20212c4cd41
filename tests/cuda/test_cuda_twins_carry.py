"""The carried-state verify's and flush's CUDA C++ twins (``gdn_carry_verify(...,
impl="cuda")``, ``gdn_carry_flush(..., impl="cuda")``, ``kernels/gdn_carry.cu``) on a V-major
state: against the float64 protocol reference and, bitwise, against decode-twin launches of the
accepted rows (SPEC §2 "Exactness", §3b).

Tolerances (``pmll_lab.tolerances``), as for the other twins: outputs ``O_TOL`` of the input
dtype (with a bf16/fp16 state, at least that state's ``HALF_STATE_TOL``: a rounding of the
state that lands on the neighbouring value is carried into the outputs); written-back states
and stashed ``u`` rows ``STATE_TOL`` (fp32 state) or ``HALF_STATE_TOL`` against the reference
rounded where the kernel rounds; stashed keys ``STATE_TOL``; stashed log decays bitwise the
given ``g`` (within ``STATE_TOL`` of the float64 gating when computed in the kernel). Against
the Triton carry: the same tolerances (its sums over keys run in another order).

Bitwise, within the CUDA path: steps of verify + ``carry_accept`` (random acceptance, 0 to K
rows) + a final flush, eager and lazy, fp32 and bf16 states, kd 16/64/128, K 2/4/8, a padding
lane, vd = 40 (three row blocks per head, the last one partial, so write-backs that restart the
stash exercise the shared-row rule): every output against ``gdn_decode(impl="cuda")`` run row by
row, the written-back states against the decoded ones, and after every step the state with its
pending rows folded (a flush of a copy) against the decoded state.

As in ``tests/cuda/test_cuda_twins_chain.py``: where the kernels' device is the CPU the GPU tests check
that ``impl="cuda"`` refuses (nothing written); the error tests and the compile check run
everywhere, and the protocol test's own bookkeeping is run once on the Triton path.
"""

from __future__ import annotations

import importlib.util
import sys

import pmll_lab  # noqa: F401  (first: picks GPU or the Triton interpreter)

import pytest
import torch
import torch.nn.functional as F

from _cuda_refusal import _refused
from _twin_cases import vk as _vk, vk_case as _case
from pmll_lab import cuda_ext
from pmll_lab.backend import DEVICE
from pmll_lab.bench import bitwise_equal, errors
from pmll_lab.carry import GDN_CARRY_CAP, GdnCarry, carry_accept, gdn_carry_flush, gdn_carry_verify
from pmll_lab.gdn import gdn_decode
from pmll_lab.inputs import gdn_inputs
from pmll_lab.reference import carry as ref
from pmll_lab.tolerances import HALF_STATE_TOL, O_TOL, STATE_TOL
from _paths import ROOT

ON_GPU = DEVICE.type == "cuda"
CAP = GDN_CARRY_CAP


def _close(name, out, want, tol):
    e = errors(out, want)
    assert e["rel_l2"] <= tol, f"{name}: rel_l2 {e['rel_l2']:.3e} > {tol:.0e}"


def _tols(dtype, state_dtype):
    """``(outputs, states and u rows)`` tolerances for inputs of ``dtype`` on a ``state_dtype``
    state."""
    if state_dtype == torch.float32:
        return O_TOL[dtype], STATE_TOL
    return max(O_TOL[dtype], HALF_STATE_TOL[state_dtype]), HALF_STATE_TOL[state_dtype]


def _fill_stash(carry: GdnCarry, seed: int) -> None:
    """Random stash rows with realistic statistics (unit keys, log decays <= 0)."""
    gen = torch.Generator().manual_seed(seed)
    carry.u.copy_((torch.randn(carry.u.shape, generator=gen) * 0.3).to(carry.device))
    carry.g.copy_((-F.softplus(torch.randn(carry.g.shape, generator=gen))).to(carry.device))
    carry.k.copy_(ref.l2norm(torch.randn(carry.k.shape, generator=gen)).float().to(carry.device))


def _row(gates, t):
    """Row ``t`` of the verify's gate arguments, as one decode takes them."""
    return {n: (v if n in ("A_log", "dt_bias") else v[:, t].contiguous())
            for n, v in gates.items()}


def _copy(carry: GdnCarry) -> GdnCarry:
    return GdnCarry(carry.buf.clone(), carry.pend.clone(), carry.num_v_heads, carry.k_dim,
                    carry.v_dim, carry.cap, carry.state_layout)


def _written_rows(S, slots, pend, engaged, K):
    """``[S, CAP]`` bool: the stash rows a verify may write (first..first+K-1 of each live
    lane's slot; first = 0 after a write-back, else the pending count)."""
    m = torch.zeros(S, CAP, dtype=torch.bool)
    for s, p, e in zip(slots.tolist(), pend.tolist(), engaged.tolist()):
        if s >= 0:
            first = 0 if e == 2 else p
            m[s, first:first + K] = True
    return m


# ---- GPU: against the float64 protocol reference ------------------------------------------------

# (dtype, state dtype, B, S, HK, HV, kd, vd, K): GVA 1 and 2, kd != vd, kd not a multiple of 32,
# kd = 256 (32 keys a lane), Qwen3-Next's 128, K = 2 to K = CAP.
CASES = [
    (torch.float32, torch.float32, 4, 6, 2, 4, 32, 24, 3),
    (torch.bfloat16, torch.float32, 4, 6, 1, 2, 24, 40, 4),
    (torch.float16, torch.float16, 4, 5, 1, 1, 16, 16, 2),
    (torch.bfloat16, torch.bfloat16, 4, 6, 2, 4, 128, 128, 4),
    (torch.float32, torch.bfloat16, 4, 4, 1, 2, 256, 64, 2),
    (torch.bfloat16, torch.float32, 4, 6, 1, 2, 64, 48, 8),
    (torch.float32, torch.bfloat16, 4, 6, 1, 2, 18, 24, 3),   # kd % 4 != 0: element loads
    (torch.bfloat16, torch.bfloat16, 32, 33, 16, 32, 128, 128, 4),  # wide blocks (4 rows a group)
]


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("pad", [False, True])
@pytest.mark.parametrize("lazy", [False, True], ids=["eager", "lazy"])
@pytest.mark.parametrize("dtype,state_dtype,B,S,HK,HV,kd,vd,K", CASES)
def test_verify_vk_against_reference(dtype, state_dtype, B, S, HK, HV, kd, vd, K, lazy, pad,
                                     gated):
    """Pending rows 0, 2, CAP-K (fits) and CAP-K+1 (does not fit) on the lanes in turn: both
    ``engaged`` values in both forms; outputs, written-back states and stash rows against the
    reference; every other stash row, ``pend``, the slots not written back and the arrival
    counts unchanged; a padding lane's outputs zero, its ``engaged`` 1."""
    seed = 7 + kd + K + 2 * lazy
    x, state, slots, gates, (g, beta) = _case(seed, dtype, state_dtype, B, K, S, HK, HV, kd,
                                              vd, pad, gated)
    carry = GdnCarry.empty(S, HV, kd, vd, device=DEVICE, state_layout="vk")
    _fill_stash(carry, seed + 1)
    gen = torch.Generator().manual_seed(seed + 2)
    pend = torch.randint(0, CAP + 1, (S,), generator=gen, dtype=torch.int32)
    batch_pend = torch.tensor([0, 2, CAP - K, CAP - K + 1], dtype=torch.int32).repeat(B)[:B]
    live = slots >= 0
    pend[slots[live].long().cpu()] = batch_pend[live.cpu()]
    carry.pend.copy_(pend.to(DEVICE))
    state0, carry0 = state.clone(), _copy(carry)
    call = lambda: gdn_carry_verify(state, carry, x["q"], x["k"], x["v"],  # noqa: E731
                                    slot_tab=slots, lazy=lazy, validate=True,
                                    state_layout="vk", impl="cuda", **gates)
    if not ON_GPU:
        _refused(call)
        assert torch.equal(state, state0) and torch.equal(carry.buf, carry0.buf)
        assert torch.equal(carry.pend, carry0.pend)
        return
    o, eng = call()
    assert o.shape == (B, K, HV, vd) and o.dtype == dtype and eng.dtype == torch.int32

    rs = state0.transpose(-1, -2).double().cpu()            # K-major float64 copy
    rc = ref.RefCarry.from_carry(carry0)
    ro, reng = ref.verify(rs, rc, x["q"].cpu(), x["k"].cpu(), x["v"].cpu(), g.cpu(), beta.cpu(),
                          slots.cpu(), lazy=lazy, state_dtype=state_dtype)
    p = batch_pend.clone()
    want = torch.where((p + K > CAP) if lazy else (p > 0), 2, 1)
    want[~live.cpu()] = 1
    assert eng.cpu().tolist() == want.tolist() == reng.tolist()
    o_tol, s_tol = _tols(dtype, state_dtype)
    _close("o", o, ro, o_tol)
    _close("state", state.transpose(-1, -2), rs, s_tol)
    if pad:
        assert torch.equal(o[1], torch.zeros_like(o[1])), "padding lane: outputs not zero"
    wb = slots[eng == 2].long()
    keep = torch.ones(S, dtype=torch.bool, device=DEVICE)
    keep[wb] = False
    assert bitwise_equal(state[keep], state0[keep]), "a state without write-back changed"

    _close("stash u", carry.u, rc.u, s_tol)
    _close("stash k", carry.k, rc.k, STATE_TOL)
    if gated:
        _close("stash g", carry.g, rc.g, STATE_TOL)
    else:
        assert bitwise_equal(carry.g.cpu(), rc.g.float()), "stash g rows"
    rows = _written_rows(S, slots.cpu(), p, eng.cpu(), K).to(DEVICE)
    for name in ("u", "g", "k"):
        assert bitwise_equal(getattr(carry, name)[~rows], getattr(carry0, name)[~rows]), \
            f"stash {name}: a row outside first..first+K-1 changed"
    assert bitwise_equal(carry.pend, carry0.pend), "verify must not change pend"
    assert int(carry._arrivals.abs().sum()) == 0, "arrival counts must be left at zero"

    tri_state, tri_carry = state0.clone(), _copy(carry0)
    o_tri, eng_tri = gdn_carry_verify(tri_state, tri_carry, x["q"], x["k"], x["v"],
                                      slot_tab=slots, lazy=lazy, validate=True,
                                      state_layout="vk", impl="triton", **gates)
    assert bitwise_equal(eng, eng_tri)
    _close("o against the Triton carry", o, o_tri, o_tol)
    _close("state against the Triton carry", state, tri_state, s_tol)


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_flush_layers_against_reference(state_dtype):
    """Three separately allocated layers in one launch: pending rows folded as the reference
    folds them; slots with nothing pending, slots not listed and padding lanes bitwise
    unchanged; stash and ``pend`` untouched."""
    S, HV, kd, vd, L = 6, 2, 64, 40, 3
    states, carries = [], []
    for layer in range(L):
        torch.empty(1000 + 333 * layer, device=DEVICE)          # scatter the allocations
        st = gdn_inputs(50 + layer, 1, 1, HV, kd, vd, slots=S, dtype=torch.float32,
                        state_layout="kv")["state"]
        c = GdnCarry.empty(S, HV, kd, vd, device=DEVICE, state_layout="vk")
        _fill_stash(c, 60 + layer)
        c.pend.copy_(torch.tensor([(layer + 3 * s) % (CAP + 1) for s in range(S)],
                                  dtype=torch.int32))
        states.append(_vk(st).to(state_dtype))
        carries.append(c)
    slot_tab = torch.tensor([3, -1, 0, 4, 1], dtype=torch.int32, device=DEVICE)
    before = [s.clone() for s in states]
    stash0 = [c.buf.clone() for c in carries]
    pend0 = [c.pend.clone() for c in carries]
    call = lambda: gdn_carry_flush(states, carries, slot_tab, validate=True,  # noqa: E731
                                   state_layout="vk", impl="cuda")
    if not ON_GPU:
        _refused(call)
        assert all(torch.equal(a, b) for a, b in zip(states, before))
        return
    call()
    rstates = [s.transpose(-1, -2).double().cpu() for s in before]
    ref.flush(rstates, [ref.RefCarry.from_carry(c) for c in carries], slot_tab.cpu(),
              state_dtype=state_dtype)
    tol = _tols(torch.float32, state_dtype)[1]
    listed = slot_tab[slot_tab >= 0].long().cpu()
    for layer in range(L):
        _close(f"state[{layer}]", states[layer].transpose(-1, -2), rstates[layer], tol)
        untouched = torch.ones(S, dtype=torch.bool)
        untouched[listed] = False
        untouched |= carries[layer].pend.cpu() == 0
        assert untouched.any() and (~untouched).any()
        untouched = untouched.to(DEVICE)
        assert bitwise_equal(states[layer][untouched], before[layer][untouched])
        assert bitwise_equal(carries[layer].buf, stash0[layer]), "flush must not write the stash"
        assert bitwise_equal(carries[layer].pend, pend0[layer]), "flush must not change pend"


# ---- GPU: the protocol, bitwise against decode-twin launches ------------------------------------

def _protocol(impl, state_dtype, kd, K, lazy, gated, seed, *, dtype=torch.bfloat16, B=4, S=6,
              HK=1, HV=2, vd=40, steps=None, cap=CAP):
    """``steps`` verifies of ``impl`` (default enough for the pending rows of a lazy carry to
    overflow ``CAP``) on a V-major ``state_dtype`` state, each followed by a random acceptance
    (0 to ``K`` rows per lane; lane 1 a padding lane) and ``carry_accept``; then a flush.
    Asserted bitwise against ``gdn_decode(impl=impl)`` of the same rows: every output (accepted
    or not), each written-back state, after every step the state with its pending rows folded
    (a flush of a copy), and the flushed state. Returns ``(write-backs, lazy folds without a
    write-back)`` counted over live lanes."""
    steps = 3 * cap // K + 2 if steps is None else steps
    gen = torch.Generator().manual_seed(seed)
    x0, state, slots, gates0, _ = _case(seed, dtype, state_dtype, B, 1, S, HK, HV, kd, vd, True,
                                        gated)
    live = (slots >= 0).cpu()
    dec = state.clone()
    carry = GdnCarry.empty(S, HV, kd, vd, cap=cap, device=DEVICE, state_layout="vk")
    wrote_back = folded_only = 0
    for step in range(steps):
        x, _, _, gates, _ = _case(seed + 1 + step, dtype, state_dtype, B, K, S, HK, HV, kd, vd,
                                  True, gated)
        if gated:   # a layer's A_log, dt_bias stay; a, b are per row
            gates = dict(gates, A_log=gates0["A_log"], dt_bias=gates0["dt_bias"])
        p = carry.pend.cpu()[slots.long().cpu().clamp(min=0)]
        before = state.clone()
        o, eng = gdn_carry_verify(state, carry, x["q"], x["k"], x["v"], slot_tab=slots,
                                  lazy=lazy, validate=True, state_layout="vk", impl=impl,
                                  **gates)
        want = torch.where((p + K > cap) if lazy else (p > 0), 2, 1)
        want[~live] = 1
        assert eng.cpu().tolist() == want.tolist(), f"step {step}: engaged"
        wrote_back += int((want[live] == 2).sum())
        folded_only += int(((want[live] == 1) & (p[live] > 0)).sum())
        for b in range(B):
            s = int(slots[b])
            if s >= 0:
                # written back: the state with the pending rows folded, what decoding left
                what = dec[s] if int(eng[b]) == 2 else before[s]
                assert bitwise_equal(state[s], what), f"step {step} lane {b}: stored state"
        assert bitwise_equal(o[1], torch.zeros_like(o[1])), "padding lane: outputs not zero"

        trial, after = dec.clone(), []
        for t in range(K):
            o_t = gdn_decode(trial, x["q"][:, t].contiguous(), x["k"][:, t].contiguous(),
                             x["v"][:, t].contiguous(), state_indices=slots, validate=True,
                             state_layout="vk", impl=impl, **_row(gates, t))
            assert bitwise_equal(o[:, t], o_t), f"step {step} row {t}: output != decode"
            after.append(trial.clone())
        acc = torch.randint(0, K + 1, (B,), generator=gen, dtype=torch.int32)
        acc[~live] = 0
        for b in range(B):
            if live[b] and int(acc[b]) > 0:
                s = int(slots[b])
                dec[s] = after[int(acc[b]) - 1][s]
        carry_accept(carry, slots, eng, acc.to(DEVICE), rows=K, validate=True)

        folded = state.clone()
        gdn_carry_flush([folded], [carry], slots, validate=True, state_layout="vk", impl=impl)
        assert bitwise_equal(folded, dec), f"step {step}: state with pending rows folded"
    gdn_carry_flush([state], [carry], slots, validate=True, state_layout="vk", impl=impl)
    assert bitwise_equal(state, dec), "flushed state != decode launches"
    if impl == "cuda":
        assert int(carry._arrivals.abs().sum()) == 0, "arrival counts must be left at zero"
    return wrote_back, folded_only


def _refuses(state_dtype, kd, K, lazy, gated, dtype=torch.bfloat16, HK=1, HV=2, vd=40):
    """Where the kernels' device is the CPU: the protocol's first verify and a flush refuse
    ``impl="cuda"``, nothing written."""
    x, state, slots, gates, _ = _case(3, dtype, state_dtype, 4, K, 6, HK, HV, kd, vd, True,
                                      gated)
    carry, state0 = GdnCarry.empty(6, HV, kd, vd, device=DEVICE, state_layout="vk"), state.clone()
    carry.pend.fill_(1)
    stash0 = carry.buf.clone()
    _refused(lambda: gdn_carry_verify(state, carry, x["q"], x["k"], x["v"], slot_tab=slots,
                                      lazy=lazy, state_layout="vk", impl="cuda", **gates))
    _refused(lambda: gdn_carry_flush([state], [carry], slots, state_layout="vk", impl="cuda"))
    assert torch.equal(state, state0) and torch.equal(carry.buf, stash0)
    assert int(carry.pend.sum()) == 6


@pytest.mark.parametrize("lazy", [False, True], ids=["eager", "lazy"])
@pytest.mark.parametrize("K", [2, 4, 8])
@pytest.mark.parametrize("kd", [16, 64, 128])
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_protocol_bitwise_against_decode_twin(state_dtype, kd, K, lazy):
    if not ON_GPU:
        _refuses(state_dtype, kd, K, lazy, False)
        return
    wrote_back, folded_only = _protocol("cuda", state_dtype, kd, K, lazy, False,
                                        seed=100 + kd + 10 * K + lazy)
    assert wrote_back > 0, "the case must exercise write-backs"
    if lazy and K < CAP:
        assert folded_only > 0, "the lazy case must fold pending rows without a write-back"


@pytest.mark.parametrize("lazy", [False, True], ids=["eager", "lazy"])
@pytest.mark.parametrize("state_dtype,dtype", [(torch.float16, torch.float16),
                                               (torch.float32, torch.float32)])
def test_protocol_bitwise_gated(state_dtype, dtype, lazy):
    """The gating in the kernel: the stashed log decay is the one the verify computed, so its
    folds give the decode twin's bits (which computes the same gate); fp16 and fp32 inputs."""
    if not ON_GPU:
        _refuses(state_dtype, 64, 3, lazy, True, dtype=dtype, HK=2, HV=4)
        return
    wrote_back, _ = _protocol("cuda", state_dtype, 64, 3, lazy, True, seed=300 + lazy,
                              dtype=dtype, HK=2, HV=4)
    assert wrote_back > 0


@pytest.mark.parametrize("lazy", [False, True], ids=["eager", "lazy"])
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_protocol_bitwise_wide_blocks_long_stash(state_dtype, lazy):
    """Wide blocks, 4 value rows per lane group (B * HV = 1024 heads of kd = vd = 64: full
    rows, one 64-row block a head), and a stash of 16 rows (a lazy slot folds up to 15 pending
    rows, more than one 8-row staging pass): bitwise the decode twin, as above."""
    if not ON_GPU:
        _refuses(state_dtype, 64, 4, lazy, False, HK=4, HV=64, vd=64)
        return
    wrote_back, folded_only = _protocol("cuda", state_dtype, 64, 4, lazy, False,
                                        seed=400 + lazy, B=16, S=18, HK=4, HV=64, vd=64, cap=16)
    assert wrote_back > 0
    if lazy:
        assert folded_only > 0


def test_protocol_bookkeeping_on_the_triton_path():
    """The protocol test's own bookkeeping (expected ``engaged``, written-back states, accepted
    rows, folded states) run on the Triton path, which is bitwise Triton decoding: a mistake in
    the helper shows here, on every machine, not only on a GPU."""
    wrote_back, folded_only = _protocol("triton", torch.float32, 16, 3, True, False, seed=4,
                                        vd=24, steps=4)
    assert wrote_back > 0 and folded_only > 0


# ---- everywhere: errors and the compile check ---------------------------------------------------

def test_errors_before_the_cuda_path(monkeypatch):
    """Bad impl, a K-major state, kd > 256 and the launchers' own argument errors: ValueError
    naming the argument, the CUDA path never reached; without a GPU the RuntimeError, nothing
    written (state, stash, pend)."""
    def reached(*a, **k):
        raise AssertionError("the CUDA path was reached before the checks")
    x, state, slots, gates, _ = _case(31, torch.float32, torch.float32, 2, 3, 3, 1, 2, 16, 24,
                                      False, False)
    carry = GdnCarry.empty(3, 2, 16, 24, device=DEVICE)
    kv_carry = GdnCarry.empty(3, 2, 16, 24, device=DEVICE, state_layout="kv")
    rows = (x["q"], x["k"], x["v"], x["g"], x["beta"])
    verify = lambda st, c, *r, **kw: gdn_carry_verify(st, c, *r, slot_tab=slots, **kw)  # noqa: E731
    with monkeypatch.context() as m:
        m.setattr(cuda_ext, "require_gpu", reached)
        for bad in ("cuda ", "CUDA", None):
            with pytest.raises(ValueError, match=r"^impl: must be one of \['triton', 'cuda'\]"):
                verify(state, carry, *rows, state_layout="vk", impl=bad)
            with pytest.raises(ValueError, match=r"^impl: must be one of \['triton', 'cuda'\]"):
                gdn_carry_flush([state], [carry], slots, state_layout="vk", impl=bad)
        with pytest.raises(ValueError,
                           match="^impl: the CUDA twin of the carried-state verify takes V-major"):
            verify(x["state"], kv_carry, *rows, state_layout="kv", impl="cuda")
        with pytest.raises(ValueError,
                           match="^impl: the CUDA twin of the carried-state flush takes V-major"):
            gdn_carry_flush([x["state"]], [kv_carry], slots, state_layout="kv", impl="cuda")
        with pytest.raises(ValueError, match="^q:"):
            verify(state, carry, x["q"][..., :8], *rows[1:], state_layout="vk", impl="cuda")
        z = gdn_inputs(34, 2, 1, 2, 16, 24, rows=CAP + 1, slots=3, dtype=torch.float32,
                       state_layout="kv")
        with pytest.raises(ValueError, match=r"^q: K = 9 draft rows must lie in \[1, CAP = 8\]"):
            verify(state, carry, z["q"], z["k"], z["v"], z["g"], z["beta"], state_layout="vk",
                   impl="cuda")
        with pytest.raises(ValueError, match="^states, carries: pass lists"):
            gdn_carry_flush(state, carry, slots, state_layout="vk", impl="cuda")
        y = gdn_inputs(33, 1, 1, 1, 288, 8, rows=2, dtype=torch.float32, state_layout="kv")
        big, big_carry = _vk(y["state"]), GdnCarry.empty(1, 1, 288, 8, device=DEVICE)
        with pytest.raises(ValueError,
                           match="^impl: the CUDA twin of the carried-state verify takes kd <= 256"):
            gdn_carry_verify(big, big_carry, y["q"], y["k"], y["v"], y["g"], y["beta"],
                             slot_tab=y["state_indices"], state_layout="vk", impl="cuda")
        with pytest.raises(ValueError,
                           match="^impl: the CUDA twin of the carried-state flush takes kd <= 256"):
            gdn_carry_flush([big], [big_carry], y["state_indices"], state_layout="vk",
                            impl="cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(cuda_ext, "build_extension", reached)
    carry.pend.fill_(2)
    before, stash0, pend0 = state.clone(), carry.buf.clone(), carry.pend.clone()
    for lazy in (False, True):
        with pytest.raises(RuntimeError, match="needs an NVIDIA GPU.*impl='triton'"):
            verify(state, carry, *rows, lazy=lazy, state_layout="vk", impl="cuda")
    with pytest.raises(RuntimeError, match="needs an NVIDIA GPU.*impl='triton'"):
        gdn_carry_flush([state], [carry], slots, state_layout="vk", impl="cuda")
    empty = slots[:0]
    with pytest.raises(RuntimeError, match="needs an NVIDIA GPU.*impl='triton'"):
        gdn_carry_flush([state], [carry], empty, state_layout="vk", impl="cuda")
    assert torch.equal(state, before) and torch.equal(carry.buf, stash0)
    assert torch.equal(carry.pend, pend0)


def _build_check():
    spec = importlib.util.spec_from_file_location("build_check",
                                                  ROOT / "kernels" / "build_check.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("build_check", mod)     # its dataclass looks itself up there
    spec.loader.exec_module(mod)
    return sys.modules["build_check"]


def test_carry_twin_compiles_for_sm90a_without_spills():
    """``kernels/gdn_carry.cu`` compiles for sm_90a (nvcc only, no GPU): a verify per (keys per
    lane, value rows per lane group) pair -- (4, 8, 16) x (1, 4) and (32, 1) -- x state dtype x
    input dtype (63) and a flush (one row per group) per keys-per-lane value x state dtype (12),
    each a hot kernel without spills. Fails, does not skip, without nvcc (CI
    has CUDA 13.0's)."""
    bc = _build_check()
    try:
        bc.find_nvcc()
    except FileNotFoundError as exc:
        pytest.fail(str(exc))
    rc, text, kernels = bc.compile_cu(ROOT / "kernels" / "gdn_carry.cu")
    assert rc == 0, text
    names = [k.kernel for k in kernels]
    for P, R in ((4, 1), (4, 4), (8, 1), (8, 4), (16, 1), (16, 4), (32, 1)):
        assert sum("gdn_carry_verify_vk_kernel" in n and f"ILi{P}ELi{R}E" in n
                   for n in names) == 9, (P, R)
    for P in (4, 8, 16, 32):
        assert sum("gdn_carry_flush_vk_kernel" in n and f"ILi{P}ELN" in n for n in names) == 3, P
    assert len(kernels) == 75 and all(k.hot and not k.spills for k in kernels), kernels
