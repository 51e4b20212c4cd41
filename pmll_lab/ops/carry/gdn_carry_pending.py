"""Carried-state GDN flush and accept: the pending rows folded into the states, and counted
after a verify (SPEC §3b). The flush kernels are in ``pmll_lab.ops.carry.exact_kernels``
(K-major) and ``pmll_lab.ops.carry.gdn_carry_vk`` (V-major); the accept kernel is here.

Flush (``gdn_carry_flush``), grid ``(B * HV * NV, L)`` (a head's blocks on consecutive
programs, ``recurrence.head_tile_program``): folds each slot's pending rows into its
state for ``L`` separately allocated layers in one launch. The launcher passes layer 0's state,
stash and ``pend`` tensors as base pointers and three int64 tables holding each layer's element
offset from those bases (``(ptr_l - ptr_0) / itemsize``); the kernel adds ``table[l]``. That
works in the interpreter (which hands kernels the tensors' real CPU addresses) and on the GPU
(one flat address space). Flush reads the stash only, so it may split a head's columns across
programs. ``pend`` is not changed.

Accept (``carry_accept``), grid ``(cdiv(B, accept_block), L)`` (``pmll_lab.ops.settings``):
``pend[slot] = a if engaged == 2 else pend[slot] + a`` for one or several carries (any object
with ``.pend`` int32 ``[S]``), on the device, with no host sync.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pmll_lab import _checks
from pmll_lab.ops.carry.common import (INDEX_DTYPES, check_carry, check_host_slots,
                                                 check_state, offsets_table)
from pmll_lab.ops.carry import cuda
from pmll_lab.ops.carry.exact_kernels import gdn_carry_flush_kernel
from pmll_lab.ops.carry.stash import GdnCarry
from pmll_lab.ops import settings
from pmll_lab.ops.gdn import recurrence
from pmll_lab.ops.gdn.recurrence import (DEFAULT_STATE_LAYOUT, block_config, check_layout,
                                         head_dims, vk_chunk_meta, vk_config)
from pmll_lab.ops.host import cdiv
from pmll_lab.ops.launch import device_guard


@triton.jit
def carry_accept_kernel(pend_ptr, pend_off_ptr, slot_ptr, engaged_ptr, acc_ptr, B,
                        BLOCK: tl.constexpr):
    """Accept, grid ``(cdiv(B, BLOCK), L)``: for carry ``l = program_id(1)`` (its ``pend`` int32
    ``[S]`` at ``pend_ptr + pend_off[l]``, ``pend_off`` int64 ``[L]`` element offsets) and each
    lane ``i < B`` of ``slot [B]`` (int32/int64; -1, a padding lane, is skipped),
    ``pend[slot] = acc[i]`` if ``engaged[i] == 2`` (int32; a write-back restarted the stash),
    else ``pend[slot] + acc[i]`` (``acc [B]`` int32/int64, the accepted rows). Launched by
    ``carry_accept``, which checks the arguments (a kernel raises nothing); public for the
    sm_90 compile check (tests/cuda/test_lowering_compile.py)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < B
    pend = pend_ptr + tl.load(pend_off_ptr + tl.program_id(1))
    slot = tl.load(slot_ptr + offs, mask=m, other=-1).to(tl.int64)
    m = m & (slot >= 0)                  # slot -1: a padding lane, its pend is not touched
    e = tl.load(engaged_ptr + offs, mask=m, other=1)
    a = tl.load(acc_ptr + offs, mask=m, other=0).to(tl.int32)
    p = tl.load(pend + slot, mask=m, other=0)
    tl.store(pend + slot, tl.where(e == 2, a, p + a), mask=m)


def gdn_carry_flush(states, carries, slot_tab, *, validate=False,
                    state_layout=DEFAULT_STATE_LAYOUT, impl="triton") -> None:
    """Fold every listed slot's pending rows into its state, over ``L`` layers in one launch
    (SPEC §3b "Flush"; the seed's ``gdn_carry_flush``).

    ``states``: list of ``L`` states in ``state_layout`` (``[S, HV, vd, kd]`` for ``"vk"``, the
    default of every GDN launcher, ``[S, HV, kd, vd]`` for ``"kv"``; separately allocated is fine;
    same shape, strides and dtype: fp32, or bf16/fp16 rounded after every folded row); ``carries``:
    list of ``L`` ``GdnCarry`` (same layout and slot stride); ``slot_tab [B]`` int32/int64,
    contiguous. A slot with ``pend = 0`` is left alone; ``pend`` is not changed (the caller clears
    it). Folding uses ``fold_row`` on ``block_config`` blocks, so the state is bitwise the one plain
    decoding would hold. ``validate=True`` (``pmll_lab._checks``; docs/layouts.md, "validate=True"):
    slots distinct and in range, ``0 <= pend <= CAP``, the states and pending stash rows read
    finite, in every layer. ``state_layout``: ``"vk"`` (V-major tiles; the same bits as V-major
    decoding) or ``"kv"``; every carry must be made for it. ``impl``: ``"triton"`` or ``"cuda"``:
    the CUDA C++ twin (``kernels/gdn_carry.cu``, ``pmll_lab.ops.carry.cuda``) after the
    same checks; V-major, ``kd <= 256``; the bits of ``gdn_decode(impl="cuda")`` launches of the
    folded rows when the stash was written by ``gdn_carry_verify(impl="cuda")``; ``RuntimeError``
    without a CUDA device. Raises ``ValueError`` naming the argument.
    """
    _checks.impl("gdn_carry_flush", impl)
    check_layout("state_layout", state_layout)
    if isinstance(states, torch.Tensor) or isinstance(carries, GdnCarry):
        raise ValueError("states, carries: pass lists (one entry per layer)")
    states, carries = list(states), list(carries)
    if not states or len(states) != len(carries):
        raise ValueError(f"carries: need one per state, got {len(carries)} carries for {len(states)} states")
    for i, (st, ca) in enumerate(zip(states, carries)):
        check_state(f"states[{i}]", st)
        check_carry(f"carries[{i}]", ca, st, state_layout)
        if (st.shape != states[0].shape or st.stride() != states[0].stride()
                or st.dtype != states[0].dtype):
            raise ValueError(f"states[{i}]: shape/strides/dtype differ from states[0]")
        if ca.cap != carries[0].cap or ca.buf.stride() != carries[0].buf.stride():
            raise ValueError(f"carries[{i}]: CAP or stash strides differ from carries[0]")
        _checks.same_device("states[0]", states[0], **{f"states[{i}]": st})
    S, HV = states[0].shape[:2]
    kd, vd = head_dims(states[0].shape, state_layout)
    _checks.tensor("slot_tab", slot_tab, ndim=1, dtype=INDEX_DTYPES, device=states[0].device,
                   contiguous=True)
    B = slot_tab.shape[0]
    if B > S:
        raise ValueError(f"slot_tab: {B} sequences but only {S} slots")
    # every layer's state is written while every stash, pend and the slot table are read
    _checks.apart({f"states[{i}]": st for i, st in enumerate(states)},
                  {"slot_tab": slot_tab,
                   **{f"carries[{i}].buf": ca.buf for i, ca in enumerate(carries)},
                   **{f"carries[{i}].pend": ca.pend for i, ca in enumerate(carries)}})
    check_host_slots("slot_tab", slot_tab,
                     [(f"carries[{i}].pend", ca) for i, ca in enumerate(carries)])
    if validate:
        _checks.indices_values("slot_tab", slot_tab, S, padding=True)
        live = slot_tab[slot_tab >= 0].long()
        for i, ca in enumerate(carries):
            _checks.range_values(f"carries[{i}].pend", ca.pend[live], 0, ca.cap)
        for i, (st, ca) in enumerate(zip(states, carries)):
            _checks.finite_slots(f"states[{i}]", st, live)
            _checks.finite_pending(f"carries[{i}]", {"u": ca.u, "g": ca.g, "k": ca.k}, live,
                                   ca.pend[live])
    if impl == "cuda":
        cuda.check_cuda(states[0], kd, state_layout, "carried-state flush")
        cuda.launch_flush(states, carries, slot_tab)
        return
    if B == 0:
        return
    L = len(states)
    if state_layout == "vk":
        from pmll_lab.ops.carry.gdn_carry_vk import gdn_carry_flush_vk_kernel as kernel

        BK, BV, num_warps = vk_config(kd, vd, B * HV, "carry", state_dtype=states[0].dtype)
        extra = dict(vk_chunk_meta(BK), STASH_AHEAD=settings.vk_ahead_row(B * HV).stash_rows_ahead)
    else:
        extra = {}
        kernel = gdn_carry_flush_kernel
        BK, BV, num_warps = block_config(kd, vd)
    NV = cdiv(vd, BV)
    pends = [c.pend for c in carries]
    with device_guard(states[0]):
        # a head's tiles on consecutive programs (recurrence.head_tile_program)
        grid = (B * HV * NV, L)
        kernel[grid](
            states[0], carries[0].buf, pends[0], slot_tab,
            offsets_table(states), offsets_table([c.buf for c in carries]), offsets_table(pends),
            states[0].stride(0), carries[0].buf.stride(0),
            CAP=carries[0].cap, HV=HV, KD=kd, VD=vd, BK=BK, BV=BV, NV=NV,
            PREFETCH=settings.carry().carry_prefetch_rows, num_warps=num_warps, **extra,
            **recurrence.EXACT_LAUNCH)


def carry_accept(carry, slot_tab, engaged, accepted, *, rows=None, validate=False,
                 impl="triton") -> None:
    """The pending update after a verify, on the device with no host sync (SPEC §3b):
    ``pend[slot] = a if engaged == 2 else pend[slot] + a`` for each sequence.

    ``carry``: one carry or a list of carries (one launch for all; e.g. every layer's GDN and conv
    carry of a step, which share ``slot_tab`` and ``engaged``), each with ``.pend`` int32 ``[S]``
    and ``.cap`` (``GdnCarry``, ``ConvCarry``; ``pend`` contiguous); ``slot_tab [B]``
    int32/int64; ``engaged [B]`` int32 as the verify returned it; ``accepted [B]`` int32/int64
    on the same device, or a list of ints (copied to the device; floats are rejected). The three
    index tensors must be contiguous (read at offset ``b``). Raises ``ValueError`` naming the
    argument. ``rows``: the verify's ``K``; default: the ``K`` of the verify that returned
    ``engaged`` (the launchers' flags carry it; ``CAP`` for flags made otherwise). Host ints
    are always checked to lie in ``[0, K]``: no sync needed, and an ``a > K`` would count
    stale stash rows of an earlier step as pending. That check does not bound the sum: ``pend + a`` past
    ``CAP`` (a lazy verify accepted on a carry that was not flushed when it should have been)
    goes unseen without ``validate``, and the next verify would fold more rows than the stash
    holds; ``SpecDecodeStep`` keeps every slot within ``CAP`` by its flushes.
    ``validate=True`` checks slots distinct and in range, ``engaged`` in {1, 2}, ``0 <= a <= K``
    (``rows``) and ``<= CAP``, and that no ``pend`` exceeds ``CAP`` afterwards (a sync); with
    every tensor on the host these checks run whatever ``validate`` says, as ``ring_accept``'s.
    ``impl``: ``"triton"`` only (no CUDA twin).
    """
    _checks.impl("carry_accept", impl)
    carries = list(carry) if isinstance(carry, (list, tuple)) else [carry]
    if not carries:
        raise ValueError("carry: empty list")
    for i, c in enumerate(carries):
        pend = getattr(c, "pend", None)
        if not hasattr(c, "cap") or pend is None:
            raise ValueError(f"carry: entry {i} has no .pend/.cap ({type(c).__name__})")
        _checks.tensor(f"carry.pend[{i}]", pend, ndim=1, dtype=torch.int32, contiguous=True)
        _checks.same_device("carry.pend[0]", carries[0].pend, **{f"carry.pend[{i}]": pend})
    dev = carries[0].pend.device
    # every index tensor is read at offset b for sequence b: contiguous
    _checks.tensor("slot_tab", slot_tab, ndim=1, dtype=INDEX_DTYPES, device=dev, contiguous=True)
    B = slot_tab.shape[0]
    if rows is not None:
        _checks.positive_int("rows", rows)
    rows = _checks.accepted_bound(rows, engaged)
    if not isinstance(accepted, torch.Tensor):
        # host ints: their range costs no sync, so it is checked whatever ``validate`` says
        acc = _checks.int_list("accepted", accepted)
        hi, what = (rows, "rows = K") if rows is not None else (min(c.cap for c in carries), "CAP")
        bad = [a for a in acc if not 0 <= a <= hi]
        if bad:
            raise ValueError(f"accepted: entries must lie in [0, {hi}] ({what}), got {bad[0]}")
        accepted = torch.tensor(acc, dtype=torch.int32).to(dev)
    _checks.tensor("engaged", engaged, shape=(B,), dtype=torch.int32, device=dev, contiguous=True)
    _checks.tensor("accepted", accepted, shape=(B,), dtype=INDEX_DTYPES, device=dev,
                   contiguous=True)
    # every carry's pend is written while the slot table, engaged and accepted are read
    _checks.apart({f"carry.pend[{i}]": c.pend for i, c in enumerate(carries)},
                  {"slot_tab": slot_tab, "engaged": engaged, "accepted": accepted})
    if _checks.on_host(slot_tab):    # free on the host: a slot out of range is never written
        _checks.host_indices("slot_tab", slot_tab, min(c.pend.shape[0] for c in carries))
    # everything on the host (the CPU): the value checks cost no sync, so they always run
    if _checks.flag("validate", validate) or all(
            _checks.on_host(t) for t in [slot_tab, engaged, accepted] + [c.pend for c in carries]):
        S = min(c.pend.shape[0] for c in carries)
        _checks.indices_values("slot_tab", slot_tab, S, padding=True)
        _checks.range_values("engaged", engaged, 1, 2)
        hi = min(c.cap for c in carries) if rows is None else rows
        _checks.range_values("accepted", accepted, 0, hi)
        live = slot_tab >= 0
        for i, c in enumerate(carries):
            p = c.pend[slot_tab[live].long()]
            acc = accepted[live].to(torch.int32)
            after = torch.where(engaged[live] == 2, acc, p + acc)
            _checks.range_values(f"carry.pend[{i}] after accept", after, 0, c.cap)
    if B == 0:
        return
    pends = [c.pend for c in carries]
    with device_guard(pends[0]):
        block = settings.carry().accept_block
        carry_accept_kernel[(cdiv(B, block), len(pends))](
            pends[0], offsets_table(pends), slot_tab, engaged, accepted, B, BLOCK=block)
