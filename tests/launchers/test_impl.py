"""``impl`` on every public launcher (``pmll_lab.gdn``, ``.carry``, ``.conv``, ``.pmll``).

``impl="triton"`` is taken everywhere and gives the default call's bits; ``impl="cuda"`` on a
launcher without a CUDA C++ twin (the launch plans, the gating, the ring form, the accept
kernels, the conv) is a ``ValueError`` naming ``impl`` and the launchers that have one, raised
before anything is written; any other value is a ``ValueError`` naming ``impl``. Each case
draws fresh seeded inputs (a decode, a chain or verify of ``K = 3`` rows, a protocol step
before the flushes so that they fold real pending rows).
"""

from __future__ import annotations

import pmll_lab  # first: picks GPU or the Triton interpreter

import inspect
import re

import pytest
import torch

from pmll_lab import carry as carry_api, conv as conv_api, cuda_ext, gdn as gdn_api
from pmll_lab import pmll as pmll_api
from pmll_lab.carry import (ConvCarry, GdnCarry, GdnRing, carry_accept, carry_accept_spec,
                            conv_carry_flush, conv_carry_verify, gdn_carry_verify_plan,
                            gdn_ring_flush, gdn_ring_verify, ring_accept)
from pmll_lab.conv import conv_chain, conv_update
from pmll_lab.gdn import gdn_chain_plan, gdn_decode_plan, gdn_gating
from pmll_lab.inputs import conv_inputs, gdn_inputs, generator, pmll_inputs
from pmll_lab.pmll import RingMemory, memory_attention, pmll_step

pytestmark = pytest.mark.filterwarnings(
    "ignore:Conversion of an array with ndim > 0 to a scalar:DeprecationWarning")

S, B, HK, HV, D, K = 4, 3, 1, 2, 16, 3


def _gdn(seed, rows=None, vk=False):
    x = gdn_inputs(seed, B, HK, HV, D, D, rows=rows, slots=S, dtype=torch.float32,
                   state_layout="kv")
    if vk:
        x["state"] = x["state"].transpose(-1, -2).contiguous()
    return x


def _ints(seed, lo, hi, dtype=torch.int32):
    return torch.randint(lo, hi + 1, (B,), generator=generator(seed)).to(pmll_lab.DEVICE, dtype)


def _decode_plan(seed):
    x = _gdn(seed)
    return (lambda **kw: gdn_decode_plan(x["state"], x["q"], x["k"], x["v"], x["g"], x["beta"],
                                         state_indices=x["state_indices"], **kw)(),
            [x["state"]])


def _chain_plan(seed):
    x = _gdn(seed, rows=K)
    return (lambda **kw: gdn_chain_plan(x["state"], x["q"], x["k"], x["v"], x["g"], x["beta"],
                                        state_indices=x["state_indices"], **kw)(),
            [x["state"]])


def _gating(seed):
    gen = generator(seed)
    A_log, dt_bias = torch.rand(HV, generator=gen) * 2 - 1, torch.randn(HV, generator=gen)
    a, b = torch.randn(B, K, HV, generator=gen), torch.randn(B, K, HV, generator=gen)
    A_log, dt_bias, a, b = (t.to(pmll_lab.DEVICE) for t in (A_log, dt_bias, a, b))
    return lambda **kw: gdn_gating(A_log, a, dt_bias, b, **kw), []


def _carry_plan(seed):
    x = _gdn(seed, rows=K)
    carry = GdnCarry.empty(S, HV, D, D)
    carry.pend[x["state_indices"].long()] = _ints(seed, 0, 2)     # pending rows to fold
    carry.buf.copy_(torch.randn(carry.buf.shape, generator=generator(seed + 1)) * 0.1)
    return (lambda **kw: gdn_carry_verify_plan(x["state"], carry, x["q"], x["k"], x["v"], x["g"],
                                               x["beta"], slot_tab=x["state_indices"], **kw)(),
            [x["state"], carry.buf])


def _carry_accept_spec(seed):
    carry = GdnCarry.empty(2 * S, HV, D, D)
    slots = _gdn(seed)["state_indices"]
    spare = slots + S
    carry.pend[slots.long()] = _ints(seed, 0, 3)
    engaged = _ints(seed + 1, 1, 2).to(torch.int32)
    engaged.verify_rows, engaged.spec_store = K, True      # as a verify with the store tags them
    accepted = torch.tensor([K, 1, K], dtype=torch.int32)  # two full acceptances: two swaps

    def call(**kw):
        carry_accept_spec(carry, slots, spare, engaged, accepted, rows=K, **kw)
        return carry.pend, slots, spare
    return call, [carry.pend, slots, spare]


def _carry_accept(seed):
    carry = GdnCarry.empty(S, HV, D, D)
    slots = _gdn(seed)["state_indices"]
    carry.pend[slots.long()] = _ints(seed, 0, 3)
    engaged, accepted = _ints(seed + 1, 1, 2), _ints(seed + 2, 0, K)

    def call(**kw):
        carry_accept(carry, slots, engaged, accepted, rows=K, **kw)
        return carry.pend
    return call, [carry.pend]


def _ring(seed, steps=1):
    """A V-major state and its ring after ``steps`` verify + accept steps."""
    x = _gdn(seed, vk=True)
    ring = GdnRing.empty(S, HK, HV, D, D, length=8)
    for step in range(steps):
        r = _gdn(seed * 7 + step, rows=K)
        _, e = gdn_ring_verify(x["state"], ring, r["q"], r["k"], r["v"], r["g"], r["beta"],
                               slot_tab=x["state_indices"])
        ring_accept(ring, x["state_indices"], e, _ints(seed + step, 1, K), rows=K)
    return x["state"], ring, x["state_indices"]


def _ring_verify(seed):
    state, ring, slots = _ring(seed)
    r = _gdn(seed + 5, rows=K)
    return (lambda **kw: gdn_ring_verify(state, ring, r["q"], r["k"], r["v"], r["g"], r["beta"],
                                         slot_tab=slots, **kw),
            [state, ring.u, ring.k, ring.G])


def _ring_accept(seed):
    state, ring, slots = _ring(seed)
    engaged, accepted = _ints(seed + 1, 1, 2), _ints(seed + 2, 0, K)

    def call(**kw):
        ring_accept(ring, slots, engaged, accepted, rows=K, **kw)
        return ring.len, ring.base
    return call, [ring.len, ring.base]


def _ring_flush(seed):
    state, ring, slots = _ring(seed, steps=2)

    def call(**kw):
        gdn_ring_flush([state], [ring], slots, **kw)
        return state
    return call, [state]


def _conv(seed, rows=None):
    return conv_inputs(seed, B, 32, rows=rows, slots=S, dtype=torch.float32)


def _conv_update(seed):
    x = _conv(seed)
    return (lambda **kw: conv_update(x["conv_state"], x["x"], x["weight"], x["bias"],
                                     state_indices=x["state_indices"], **kw),
            [x["conv_state"]])


def _conv_chain(seed):
    x = _conv(seed, rows=K)
    return (lambda **kw: conv_chain(x["conv_state"], x["x"], x["weight"], x["bias"],
                                    state_indices=x["state_indices"], **kw),
            [x["conv_state"]])


def _conv_verify(seed, lazy=False):
    x = _conv(seed, rows=K)
    carry = ConvCarry.like(x["conv_state"])
    carry.pend[x["state_indices"].long()] = _ints(seed, 1, 2)
    carry.stash.copy_(torch.randn(carry.stash.shape, generator=generator(seed + 1)))
    return (lambda **kw: conv_carry_verify(x["conv_state"], carry, x["x"], x["weight"],
                                           x["bias"], slot_tab=x["state_indices"], lazy=lazy,
                                           **kw),
            [x["conv_state"], carry.stash], x, carry)


def _conv_carry_verify(seed):
    return _conv_verify(seed)[:2]


def _conv_carry_flush(seed):
    verify, _, x, carry = _conv_verify(seed, lazy=True)
    _, e = verify()
    carry_accept(carry, x["state_indices"], e, _ints(seed + 3, 1, K), rows=K)

    def call(**kw):
        conv_carry_flush([x["conv_state"]], [carry], x["state_indices"], **kw)
        return x["conv_state"]
    return call, [x["conv_state"]]


NO_TWIN = {
    "gdn_decode_plan": _decode_plan, "gdn_chain_plan": _chain_plan, "gdn_gating": _gating,
    "gdn_carry_verify_plan": _carry_plan, "carry_accept": _carry_accept,
    "carry_accept_spec": _carry_accept_spec,
    "gdn_ring_verify": _ring_verify, "ring_accept": _ring_accept, "gdn_ring_flush": _ring_flush,
    "conv_update": _conv_update, "conv_chain": _conv_chain,
    "conv_carry_verify": _conv_carry_verify, "conv_carry_flush": _conv_carry_flush,
}
"""Every public launcher without a CUDA twin (but ``memory_attention`` / ``pmll_step``, whose
``impl`` also picks the reference path): a case building fresh inputs, then ``(call, written)``."""


def _flat(out):
    return list(out) if isinstance(out, tuple) else [out]


@pytest.mark.parametrize("name", sorted(NO_TWIN))
def test_triton_is_the_default_and_cuda_is_refused_before_any_write(name):
    call, _ = NO_TWIN[name](11)
    want = [t.clone() for t in _flat(call())]
    assert any(bool(t.ne(0).any()) for t in want), f"{name}: the case computes nothing"
    call, _ = NO_TWIN[name](11)
    got = _flat(call(impl="triton"))
    assert all(torch.equal(a, b) for a, b in zip(got, want)), f"{name}: impl='triton' differs"
    twins = ", ".join(cuda_ext.TWIN_LAUNCHERS)
    for bad, msg in (("cuda", rf"impl: {name} has no CUDA C\+\+ twin \(impl='cuda' is taken by "
                              rf"{re.escape(twins)}\); use impl='triton'"),
                     ("Triton", r"impl: must be one of \['triton', 'cuda'\], got 'Triton'"),
                     (None, r"impl: must be one of \['triton', 'cuda'\], got None")):
        call, written = NO_TWIN[name](11)
        before = [t.clone() for t in written]
        with pytest.raises(ValueError, match=f"^{msg}$"):
            call(impl=bad)
        assert all(torch.equal(a, b) for a, b in zip(written, before)), f"{name}: written"


def test_every_public_launcher_takes_impl():
    """Every function of the public modules that launches a kernel has ``impl="triton"`` (or
    ``None``, the attention's own default); the twins are the launchers named as such."""
    launchers = set(NO_TWIN) | set(cuda_ext.TWIN_LAUNCHERS) | {"memory_attention", "pmll_step"}
    seen = set()
    for mod in (gdn_api, carry_api, conv_api, pmll_api):
        for name in mod.__all__:
            f = getattr(mod, name)
            if not inspect.isfunction(f) or name.endswith(("_ref", "_bytes", "_per_slot")) \
                    or name in ("conv_block_config", "qwen3_next_conv_dim"):
                continue
            seen.add(name)
            default = inspect.signature(f).parameters["impl"].default
            assert default == (None if name in ("memory_attention", "pmll_step") else "triton")
    assert seen == launchers


def test_memory_attention_takes_triton_as_the_fused_kernel():
    """``impl="triton"`` on the ring attention is its fused Triton kernel, bit for bit;
    ``"cuda"`` names the launchers that have a twin."""
    x = pmll_inputs(5, 2, 2, 3, 16)
    mem = RingMemory.empty(2, 2, 8, 16)
    pmll_step(mem, x["q"], x["k_new"], x["v_new"], impl="reference")     # a ring with rows
    y = pmll_inputs(6, 2, 2, 3, 16)
    fused = memory_attention(y["q"], y["k_new"], y["v_new"], mem, impl="fused")
    assert fused.abs().sum() > 0
    assert torch.equal(memory_attention(y["q"], y["k_new"], y["v_new"], mem, impl="triton"), fused)
    m_fused, m_triton = mem.clone(), mem.clone()
    assert torch.equal(pmll_step(m_fused, y["q"], y["k_new"], y["v_new"], impl="fused"), fused)
    assert torch.equal(pmll_step(m_triton, y["q"], y["k_new"], y["v_new"], impl="triton"), fused)
    assert torch.equal(m_triton.k, m_fused.k) and torch.equal(m_triton.count, m_fused.count)
    for call in (memory_attention, pmll_step):
        args = (y["q"], y["k_new"], y["v_new"], mem) if call is memory_attention else \
            (mem, y["q"], y["k_new"], y["v_new"])
        with pytest.raises(ValueError, match=r"^impl: the ring attention has no CUDA twin "
                                             r"\(impl='cuda' is taken by pmll_write, pmll_read, "):
            call(*args, impl="cuda")
        with pytest.raises(ValueError, match=r"^impl: must be one of 'fused', 'reference', 'triton' "
                                             r"or None, got 'cuda '"):
            call(*args, impl="cuda ")
