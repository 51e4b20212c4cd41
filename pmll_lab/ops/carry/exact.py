"""Carried-state GDN verify, exact form: the launchers, their launch-time settings and their
argument checks (SPEC §3b), and the overview of ``pmll_lab.ops.carry``, arranged by form:

- exact form (this module: ``gdn_carry_verify``, ``gdn_carry_verify_plan``): its kernels for
  both state layouts in ``pmll_lab.ops.carry.exact_kernels``, on the pieces both layouts share
  (behind the ``tl.constexpr`` flag ``VK``) in ``pmll_lab.ops.carry.exact_rows``;
- the stash and its bookkeeping: ``GdnCarry``, ``carry_accept`` (the pending rows counted) and
  ``gdn_carry_flush`` (folded): ``pmll_lab.ops.carry.stash``;
- ring form, the tolerance form of the carried state (SPEC §3d): launchers and ``GdnRing`` in
  ``pmll_lab.ops.carry.ring``, its verify kernel in ``ring_verify``, flush and commit kernels in
  ``ring_kernels``;
- the checks and helpers every launcher shares: ``pmll_lab.ops.carry.common``; the CUDA C++
  twins' launch (``impl="cuda"``): ``pmll_lab.ops.carry.cuda``.

Each name is imported from the module that defines it (the facade ``pmll_lab.carry`` gathers
the public API). The
launch settings are the ``carry`` table of ``pmll_lab.ops.settings``. Every kernel of the
family launches with ``recurrence.EXACT_LAUNCH`` (no multiply-add contracted by the compiler),
so that the verify and the flush round as decode does.

Buffers (all fp32 unless said):

- ``state [S, HV, vd, kd]``: the stored recurrent states (V-major, ``state_layout="vk"``, the
  default of every GDN launcher), inner three dims contiguous, any slot stride;
  ``[S, HV, kd, vd]`` with ``state_layout="kv"`` (FLA's layout). The launchers pick the
  kernels (``exact_kernels``) by ``state_layout``.
- ``GdnCarry.buf [S, W]`` with ``W = CAP*(HV*vd + HV + HV*kd)`` floats per slot (the seed's
  ``gdn_carry_seq_floats``), laid out as the seed's ``vn[CAP][HV][vd] | g[CAP][HV] |
  sk[CAP][HV][kd]``: row ``r`` of the stash holds ``u_r`` (the delta-rule correction, ``vn``),
  ``g_r`` (the log decay) and ``k_r`` (the l2-normalised key, ``sk``) of every value head.
- ``GdnCarry.pend [S]`` int32: accepted stash rows not yet folded into ``state``.

Verify (``gdn_carry_verify``), exact form, one program per (sequence, value head, column block
of ``BV`` value columns), grid ``(B * HV * NV,)`` with ``block_config(kd, vd)``, decode's own split:
the program loads the slot's ``pend`` ``p`` and its state block, folds the ``p`` pending rows
(``fold_row``), writes the block back when the protocol says so (eager: ``p > 0``; lazy:
``p + K > CAP``), runs the ``K`` rows and stashes each row's ``u`` columns at stash row
``first + t`` (``first = 0`` after a write-back, else ``p``). The ``g`` and ``k`` stash rows are
shared by all column blocks of the head, so they are written once, after every block has folded
the old ones: each program counts itself in an arrival counter (``acq_rel`` atomic) after its
fold, and the last to arrive restashes them and resets the counter, so a write-back that restarts
the stash at row 0 can never overwrite a row that is still to be folded (SPEC §3b "Shared rows").
With ``exact_split_columns`` off, one program per (sequence, head) loops over the column
blocks instead (unrolled, constant block offsets) and restashes after the loop behind
``tl.debug_barrier()``. With ``carry_prefetch_rows`` (``pmll_lab.ops.settings``) the exact form and the folds load the
next row before running the current one. No two heads or slots of a launch share state or
stash bytes (slots distinct within a launch, heads disjoint).
``engaged[b]`` is written by the program of value head 0 (and column block 0 where split): 2
after a write-back, else 1.

Each row runs through ``qk_prepare`` + ``gdn_row`` of ``pmll_lab.ops.gdn.recurrence`` on
``block_config``'s block shapes and warps, the same code as plain decode, so outputs and folded
states are bitwise equal to decoding the rows one by one.

Flush (``gdn_carry_flush``) and accept (``carry_accept``): ``pmll_lab.ops.carry.stash``.
"""

from __future__ import annotations

import torch

from pmll_lab import _checks
from pmll_lab.ops import settings
from pmll_lab.ops.carry import cuda
from pmll_lab.ops.carry.common import (INDEX_DTYPES, check_form, check_host_slots,
                                       check_spare_slots, check_state)
from pmll_lab.ops.carry.exact_kernels import (gdn_carry_exact_kernel, gdn_carry_exact_split_kernel,
                                              gdn_carry_exact_vk_kernel)
from pmll_lab.ops.carry.stash import check_carry
from pmll_lab.ops.gdn import recurrence
from pmll_lab.ops.gdn.gating import check_gating, gate_groups, gate_inputs, split_gating
from pmll_lab.ops.gdn.recurrence import (DEFAULT_STATE_LAYOUT, block_config, check_layout,
                                         head_dims, vk_chunk_meta, vk_config)
from pmll_lab.ops.host import cdiv
from pmll_lab.ops.launch import LaunchPlan, device_guard


def gdn_carry_verify(state, carry, q, k, v, g=None, beta=None, *, slot_tab, form="exact",
                     lazy=False, scale=None, use_qk_l2norm=True, validate=False,
                     eager_max_pending=None, state_layout=DEFAULT_STATE_LAYOUT, A_log=None,
                     a=None, dt_bias=None, b=None, impl="triton", spec_slot_tab=None):
    """Carried-state verify of ``K`` draft rows per sequence, exact form (SPEC §3b; seed
    ``gdn_exact_carry`` and its ``_lazy`` form).

    Args:
        state: ``[S, HV, vd, kd]`` (``state_layout="vk"``, the default) or ``[S, HV, kd, vd]``
            (``"kv"``), fp32, bf16 or fp16, inner dims contiguous. Read; written only on a
            write-back (``engaged == 2``), with the slot's pending rows folded in. A bf16/fp16 state
            is computed on in fp32 and rounded to its dtype after every folded and verified row,
            where decoding stores it (bitwise equal to decoding); the stash stays fp32.
        carry: the layer's ``GdnCarry`` (``S`` slots, ``HV``, ``kd``, ``vd``, ``CAP``, made for
            this ``state_layout``: another is refused, naming ``carry``). Its stash
            rows ``first..first+K-1`` of each slot are written (``first = 0`` after a
            write-back, else ``pend``); ``pend`` is read, never written (``carry_accept`` does).
        q, k: ``[B, K, HK, kd]``; v: ``[B, K, HV, vd]`` — fp32, bf16 or fp16, one dtype, last dim
            contiguous, any other strides (views of a fused projection: no copies).
        g, beta: ``[B, K, HV]`` fp32 (log decay ``<= 0``; ``beta`` in ``[0, 1]``), last dim
            contiguous. Or, with ``g=None, beta=None``, the gating computed in the kernel:
            ``A_log, dt_bias [HV]``, ``a, b [B, K, HV]`` (q's dtype or fp32), bitwise as
            ``pmll_lab.gdn.gdn_gating`` then this call; the stash records the computed ``g``.
        slot_tab: ``[B]`` int32/int64 slot of each sequence (distinct, in ``[0, S)``), or -1
            for a padding lane (zero outputs, ``engaged`` 1; no state, stash or ``pend``
            access), contiguous.
        form: ``"exact"`` (bitwise equal to decoding the rows one at a time), the only form;
            the tolerance form is the ring form (``pmll_lab.ops.carry.ring``), and
            ``"wy"`` raises a ``ValueError`` that says so.
        lazy: ``False`` = eager (write back whenever ``pend > 0``); ``True`` = write back only
            when ``pend + K > CAP``.
        scale: query scale, default ``kd ** -0.5``. use_qk_l2norm: l2-normalise q and k.
        validate: also run the checks that sync with the device (``pmll_lab._checks``;
            docs/layouts.md, "validate=True"): slots distinct and in range, ``0 <= pend <= CAP``,
            ``g <= 0``, ``beta`` in ``[0, 1]``, the live lanes' inputs, the states read and the
            pending stash rows finite, and for an eager verify ``pend <= eager_max_pending`` (when
            that is not ``None``; the kernel itself folds any ``pend <= CAP``). On the host the
            slots and counts are checked always.
        state_layout: ``"vk"`` (default: V-major kernels, ``pmll_lab.ops.carry.exact_kernels``:
            a tile of value rows per program, bitwise equal to V-major ``gdn_decode`` on q/k
            rows aligned alike, ``recurrence.vk_qk_aligned``) or ``"kv"`` (K-major kernels,
            this module). The same default as every GDN launcher (``gdn_decode``:
            why); the stash is the same for both.
        impl: ``"triton"`` or ``"cuda"``: the CUDA C++ twin (``kernels/gdn_carry.cu``,
            ``pmll_lab.ops.carry.cuda``) after the same checks; V-major,
            ``kd <= 256``; bitwise ``gdn_decode(impl="cuda")`` launches of the rows (within
            the float64 reference's tolerance of the Triton carry, not bitwise it).
            ``RuntimeError`` without a CUDA device, ``ValueError`` naming ``impl`` for a
            K-major state or ``kd > 256``.
        spec_slot_tab: ``None``, or ``[B]`` int32/int64 (contiguous, -1 for padding lanes): the
            speculative store. Each live sequence's state after all ``K`` rows (its
            full-acceptance state, rounded as decoding stores it) is also written to slot
            ``spec_slot_tab[b]`` of ``state`` (a spare slot, distinct from every slot of
            ``slot_tab``), so that a commit accepting all ``K`` rows swaps the two slots and
            leaves nothing pending (``carry_accept_spec``) instead of replaying the ``K`` rows
            at the next verify. A spare of -1 stores nothing: that lane commits as the lazy
            form. The spares are distinct and none is a live slot of ``slot_tab`` (checked
            always on the host, with ``validate=True`` on a GPU). One layer's carry: a stack
            of layers that share ``slot_tab`` would swap it once per layer (not supported;
            nor is the conv twin). V-major, ``impl="triton"`` only, not in
            ``gdn_carry_verify_plan`` (else ``ValueError`` naming ``spec_slot_tab``).

    Returns:
        ``(o, engaged)``: ``o [B, K, HV, vd]`` in ``v``'s dtype; ``engaged [B]`` int32, 2 if the
        verify wrote the state back, else 1.

    Raises:
        ValueError naming the argument: shapes, dtypes, devices, strides, ``HV % HK``,
        ``1 <= K <= CAP``, unknown ``form``; value errors with ``validate=True``.
    """
    _checks.impl("gdn_carry_verify", impl)
    g, beta, gating = split_gating(g, beta, A_log, a, dt_bias, b)
    scale, o, engaged = checked_verify_outputs(state, carry, q, k, v, g, beta, slot_tab, form,
                                               lazy, scale, validate, eager_max_pending,
                                               state_layout, gating, use_qk_l2norm)
    if spec_slot_tab is not None:
        check_spec_slots(spec_slot_tab, slot_tab, state, state_layout, impl, validate)
        engaged.spec_store = True          # carry_accept_spec takes only these flags
    if impl == "cuda":
        cuda.check_cuda(state, head_dims(state.shape, state_layout)[0], state_layout,
                                  "carried-state verify")
        cuda.launch_verify(state, carry, _arrivals(carry, state.shape[1]), q, k, v,
                                     g, beta, o, engaged, slot_tab, lazy, scale, use_qk_l2norm,
                                     gating)
        return o, engaged
    if o.shape[0] == 0:
        return o, engaged
    with device_guard(state):
        _launch_verify(state, carry, q, k, v, g, beta, o, engaged, slot_tab, form, lazy, scale,
                       use_qk_l2norm, state_layout, gating, spec_slot_tab)
    return o, engaged


def check_spec_slots(spec_slot_tab, slot_tab, state, layout, impl, validate) -> None:
    """``gdn_carry_verify``'s checks of ``spec_slot_tab`` (its docstring;
    ``common.check_spare_slots``); ``ValueError`` naming it."""
    if layout != "vk" or impl != "triton":
        raise ValueError("spec_slot_tab: the speculative store is V-major (state_layout='vk') "
                         f"with impl='triton', got state_layout={layout!r}, impl={impl!r}")
    check_spare_slots("spec_slot_tab", spec_slot_tab, slot_tab, state.shape[0], validate)


def _arrivals(carry, num_v_heads: int) -> torch.Tensor:
    """The split forms' arrival counts ``[S, HV]`` int32 for ``carry``: zeros, allocated
    on first use and kept on the carry (every launch leaves them at zero)."""
    arrive = getattr(carry, "_arrivals", None)
    if arrive is None or arrive.shape != (carry.slots, num_v_heads) or arrive.device != carry.device:
        arrive = torch.zeros(carry.slots, num_v_heads, dtype=torch.int32, device=carry.device)
        carry._arrivals = arrive
    return arrive


def _verify_launch_args(state, carry, q, k, v, g, beta, o, engaged, slot_tab, form, lazy, scale,
                        use_qk_l2norm, layout, gating=None, spec_slot_tab=None):
    """``(kernel, grid, args, kwargs)`` of the (exact) verify launch for ``layout`` and the
    launch settings (``pmll_lab.ops.settings``); ``form`` is checked by the caller."""
    B, K, HK = q.shape[:3]
    HV = state.shape[1]
    kd, vd = head_dims(state.shape, layout)
    if layout == "vk":
        return _verify_launch_args_vk(state, carry, q, k, v, g, beta, o, engaged, slot_tab, form,
                                      lazy, scale, use_qk_l2norm, B, K, HK, HV, kd, vd, gating,
                                      spec_slot_tab)
    gate_ptrs = _gate_ptrs(state, gating)
    BK, BV, num_warps = block_config(kd, vd)
    args = (state, carry.buf, carry.pend, slot_tab, q, k, v, g, beta, o, engaged, *gate_ptrs,
            scale, state.stride(0), carry.buf.stride(0),
            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2), g.stride(0), g.stride(1),
            beta.stride(0), beta.stride(1), o.stride(0), o.stride(1), o.stride(2))
    cs = settings.carry()
    meta = dict(K=K, CAP=carry.cap, HV=HV, GROUP=HV // HK, KD=kd, VD=vd, LAZY=lazy,
                USE_QK_L2NORM=bool(use_qk_l2norm), PREFETCH=cs.carry_prefetch_rows,
                GATE=gating is not None)
    unroll = K <= cs.exact_unroll_max_rows
    # the state block in registers as decode holds it
    meta["STATE_VEC"] = recurrence.kv_state_vector(kd, vd, state.element_size())
    if cs.exact_split_columns:
        NV = cdiv(vd, BV)
        return (gdn_carry_exact_split_kernel, (B * HV * NV,),
                (*args[:4], _arrivals(carry, HV), *args[4:]),
                dict(BK=BK, BV=BV, NV=NV, num_warps=num_warps, UNROLL=unroll, **meta,
                     **recurrence.EXACT_LAUNCH))
    return (gdn_carry_exact_kernel, (B, HV), args,
            dict(BK=BK, BV=BV, NV=cdiv(vd, BV), num_warps=num_warps, UNROLL=unroll, **meta,
                 **recurrence.EXACT_LAUNCH))


def _gate_ptrs(state, gating) -> tuple:
    """The kernels' ``alog_ptr, dtb_ptr``: the fused gating's ``A_log, dt_bias``, else
    ``state`` twice (never read: ``GATE`` is False)."""
    return (gating.A_log, gating.dt_bias) if gating is not None else (state, state)


def _row_args(state, carry, q, k, v, g, beta, o, engaged, slot_tab, scale, gating=None):
    """The verify kernels' runtime arguments after the arrival counts (every form, layout)."""
    gate_ptrs = _gate_ptrs(state, gating)
    return (q, k, v, g, beta, o, engaged, *gate_ptrs, scale, state.stride(0), carry.buf.stride(0),
            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2), g.stride(0), g.stride(1),
            beta.stride(0), beta.stride(1), o.stride(0), o.stride(1), o.stride(2))


def _verify_launch_args_vk(state, carry, q, k, v, g, beta, o, engaged, slot_tab, form, lazy,
                           scale, use_qk_l2norm, B, K, HK, HV, kd, vd, gating=None,
                           spec_slot_tab=None):
    """The V-major verify launch (``gdn_carry_exact_vk_kernel``): tiles of value rows
    from ``vk_config`` for ``B * HV``; ``spec_slot_tab`` given: the speculative store."""
    spec = slot_tab if spec_slot_tab is None else spec_slot_tab   # unread without SPEC_STORE
    args = (state, carry.buf, carry.pend, slot_tab, _arrivals(carry, HV), spec,
            *_row_args(state, carry, q, k, v, g, beta, o, engaged, slot_tab, scale, gating))
    cs = settings.carry()
    meta = dict(K=K, CAP=carry.cap, HV=HV, GROUP=HV // HK, KD=kd, VD=vd, LAZY=lazy,
                USE_QK_L2NORM=bool(use_qk_l2norm), PREFETCH=cs.carry_prefetch_rows,
                GATE=gating is not None)
    BK, BR, num_warps = vk_config(kd, vd, B * HV, "carry", state_dtype=state.dtype)
    ahead = settings.vk_ahead_row(B * HV)
    NT = cdiv(vd, BR)
    return (gdn_carry_exact_vk_kernel, (B * HV * NT,), args,
            dict(BK=BK, BV=BR, NV=NT, num_warps=num_warps,
                 UNROLL=K <= cs.exact_unroll_max_rows, **vk_chunk_meta(BK), **meta,
                 QK_ALIGNED=recurrence.vk_qk_aligned(kd, q, k),
                 STATE_VEC=recurrence.vk_state_vector(kd, vd, B * HV, state.dtype),
                 AHEAD=ahead.verify_rows_ahead(state.dtype), STASH_AHEAD=ahead.stash_rows_ahead,
                 SPEC_STORE=spec_slot_tab is not None, **recurrence.EXACT_LAUNCH))


def _launch_verify(*args):
    kernel, grid, a, kw = _verify_launch_args(*args)
    kernel[grid](*a, **kw)


def gdn_carry_verify_plan(state, carry, q, k, v, g=None, beta=None, *, slot_tab, form="exact",
                          lazy=False, scale=None, use_qk_l2norm=True, validate=False,
                          eager_max_pending=None, state_layout=DEFAULT_STATE_LAYOUT,
                          A_log=None, a=None, dt_bias=None, b=None, impl="triton") -> LaunchPlan:
    """``gdn_carry_verify`` bound to these buffers, for host-bound small batches (B=1).

    Checks the arguments once, as ``gdn_carry_verify`` does (``validate`` checks the values at
    plan time only), allocates ``o`` and ``engaged`` once, and returns a
    ``pmll_lab.ops.launch.LaunchPlan``: ``plan()`` runs the verify on whatever ``state``, the
    stash, ``pend``, ``slot_tab`` and the row tensors hold at that moment and returns
    ``(o, engaged)`` (the same two tensors every call: read them before the next call). After
    the first call on a GPU, calls go straight to the compiled kernel: no checks, allocations or
    argument binding. Write each step's rows into the same tensors: a plan keeps reading the
    tensors it was made with, so rebinding a name (``q = new``) is silently ignored; make a new
    plan instead. ``pend`` is read on every call: apply ``carry_accept`` between calls, as with
    ``gdn_carry_verify``. The launch settings (``pmll_lab.ops.settings``) are read when the plan
    is made. Same results, bit for bit, as ``gdn_carry_verify``. ``impl``: ``"triton"`` only
    (a plan has no CUDA twin). Raises ``ValueError`` naming the argument.
    """
    _checks.impl("gdn_carry_verify_plan", impl)
    g, beta, gating = split_gating(g, beta, A_log, a, dt_bias, b)
    scale, o, engaged = checked_verify_outputs(state, carry, q, k, v, g, beta, slot_tab, form,
                                               lazy, scale, validate, eager_max_pending,
                                               state_layout, gating, use_qk_l2norm)
    if o.shape[0] == 0:
        return LaunchPlan(None, (1,), (), {}, outputs=(o, engaged))
    kernel, grid, args, kw = _verify_launch_args(state, carry, q, k, v, g, beta, o, engaged,
                                                 slot_tab, form, lazy, scale, use_qk_l2norm,
                                                 state_layout, gating)
    return LaunchPlan(kernel, grid, args, kw, outputs=(o, engaged), device=state.device)


# -- the verify's argument checks ------------------------------------------------------------

def check_verify(state, carry, q, k, v, g, beta, slot_tab, form, lazy, scale, validate,
                 eager_max_pending, layout, gating=None,
                 use_qk_l2norm=True):
    """``gdn_carry_verify``'s argument checks; returns ``(B, K, HK, scale)`` (``scale`` the
    given float or ``kd ** -0.5``).

    Arguments as ``gdn_carry_verify`` takes them (``layout`` its ``state_layout``, ``gating``
    the fused gating of ``split_gating`` or ``None``), checked in the same order. Raises
    ``ValueError`` naming the argument (shapes, dtypes, devices, strides, ``HV % HK``,
    ``1 <= K <= CAP``, the form; the value checks with ``validate=True``). Shared with
    ``pmll_lab.serving.carry_layer``, which checks a layer's verify before launching any layer
    of a stack, so a bad argument fails with the same message there."""
    check_layout("state_layout", layout)
    check_state("state", state)
    check_carry("carry", carry, state, layout)
    check_form("form", form)
    _checks.flag("lazy", lazy)
    _checks.flag("validate", validate)
    _checks.flag("use_qk_l2norm", use_qk_l2norm)
    if eager_max_pending is not None:
        _checks.positive_int("eager_max_pending", eager_max_pending, minimum=0)
    S, HV = state.shape[:2]
    kd, vd = head_dims(state.shape, layout)
    _checks.tensor("q", q, ndim=4, dtype=_checks.FLOAT_DTYPES, device=state.device, last_contiguous=True)
    B, K, HK = q.shape[:3]
    _checks.tensor("q", q, shape=(B, K, HK, kd))
    _checks.tensor("k", k, shape=(B, K, HK, kd), dtype=q.dtype, like="q", device=state.device, last_contiguous=True)
    _checks.tensor("v", v, shape=(B, K, HV, vd), dtype=q.dtype, like="q", device=state.device, last_contiguous=True)
    if gating is None:
        _checks.tensor("g", g, shape=(B, K, HV), dtype=torch.float32, device=state.device,
                       last_contiguous=True)
        _checks.tensor("beta", beta, shape=(B, K, HV), dtype=torch.float32, device=state.device,
                       last_contiguous=True)
    else:
        check_gating(gating, (B, K), HV, q.dtype, state.device)
    # contiguous: the kernels read entry b at offset b (a strided view would address other slots)
    _checks.tensor("slot_tab", slot_tab, shape=(B,), dtype=INDEX_DTYPES, device=state.device,
                   contiguous=True)
    if HK < 1 or HV % HK:
        raise ValueError(f"q: HV ({HV}) must be a multiple of HK ({HK})")
    if K < 1 or K > carry.cap:
        raise ValueError(f"q: K = {K} draft rows must lie in [1, CAP = {carry.cap}]")
    if B > S:
        raise ValueError(f"slot_tab: {B} sequences but only {S} slots")
    scale = _checks.optional_float("scale", scale)
    scale = kd ** -0.5 if scale is None else scale
    # the state (on a write-back) and the stash are written while the rows, the pending
    # counts and the slot table are still read
    _checks.apart({"state": state, "carry.buf": carry.buf},
                  {"carry.pend": carry.pend, "slot_tab": slot_tab, "q": q, "k": k, "v": v,
                   **gate_inputs(g, beta, gating)})
    check_host_slots("slot_tab", slot_tab, [("carry.pend", carry)])
    if validate:
        _checks.indices_values("slot_tab", slot_tab, S, padding=True)
        live = slot_tab >= 0
        pend = carry.pend[slot_tab[live].long()]
        _checks.range_values("carry.pend", pend, 0, carry.cap)
        if not lazy and eager_max_pending is not None and pend.numel() \
                and int(pend.max()) > eager_max_pending:
            raise ValueError(
                f"carry.pend: an eager verify folds at most eager_max_pending = {eager_max_pending}"
                f" rows, a slot holds {int(pend.max())}: flush first (gdn_carry_flush)")
        if gating is None:        # padding lanes' gates are never used: not checked
            _checks.range_values("g", g[live], float("-inf"), 0.0)
            _checks.range_values("beta", beta[live], 0.0, 1.0)
        lanes, heads = gate_groups(g, beta, gating)
        _checks.finite_inputs({"q": q, "k": k, "v": v, **lanes}, live, heads)
        slots = slot_tab[live].long()
        _checks.finite_slots("state", state, slots)
        _checks.finite_pending("carry", {"u": carry.u, "g": carry.g, "k": carry.k}, slots, pend)

    return B, K, HK, scale


def checked_verify_outputs(state, carry, q, k, v, g, beta, slot_tab, form, lazy, scale,
                           validate, eager_max_pending, layout, gating=None,
                           use_qk_l2norm=True):
    """Checks (``check_verify``; its ``ValueError``), then the verify's outputs: ``(scale,
    o [B, K, HV, vd] in v's dtype on v's device, engaged [B] int32)``, uninitialised. One
    place for ``gdn_carry_verify`` and ``gdn_carry_verify_plan``, so a plan allocates and
    checks exactly as a call does."""
    B, K, _, scale = check_verify(state, carry, q, k, v, g, beta, slot_tab, form, lazy, scale,
                                  validate, eager_max_pending, layout, gating, use_qk_l2norm)
    HV, vd = state.shape[1], head_dims(state.shape, layout)[1]
    o = torch.empty(B, K, HV, vd, dtype=v.dtype, device=v.device)
    return scale, o, _checks.engaged_flags(B, K, v.device)
