"""The carried-state GDN stash and its bookkeeping (SPEC §3b): one layer's stash and pending
counts (``GdnCarry``), its check (``check_carry``), and the two launchers that settle the
pending rows after a verify (``pmll_lab.ops.carry.exact``): ``carry_accept`` counts the accepted
rows, ``gdn_carry_flush`` folds them into the states. The bytes per slot of the stash and of the
snapshot chain it replaces (SPEC §3a) are ``pmll_lab.sizes``'s, re-exported here.

The stash layout (the seed's ``vn | g | sk`` rows, ``CAP`` of them per slot) is given on
``GdnCarry``; how the verify kernels read and write it is in the module docstring of
``pmll_lab.ops.carry.exact``.

Accept (``carry_accept``), grid ``(cdiv(B, accept_block), L)`` (``pmll_lab.ops.settings``):
``pend[slot] = a if engaged == 2 else pend[slot] + a`` for one or several carries (any object
with ``.pend`` int32 ``[S]``), on the device, with no host sync. Its kernel,
``carry_accept_kernel``, is here.

Flush (``gdn_carry_flush``), grid ``(B * HV * NV, L)`` (a head's blocks on consecutive
programs, ``recurrence.head_tile_program``): folds each slot's pending rows into its
state for ``L`` separately allocated layers in one launch. The launcher passes layer 0's state,
stash and ``pend`` tensors as base pointers and three int64 tables holding each layer's element
offset from those bases (``(ptr_l - ptr_0) / itemsize``); the kernel adds ``table[l]``. That
works in the interpreter (which hands kernels the tensors' real CPU addresses) and on the GPU
(one flat address space). Flush reads the stash only, so it may split a head's columns across
programs. ``pend`` is not changed. Its kernels (``gdn_carry_flush_kernel`` K-major,
``gdn_carry_flush_vk_kernel`` V-major) are with the exact verify's, in
``pmll_lab.ops.carry.exact_kernels``: both fold rows with the verify's own fold loop.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from pmll_lab import _checks
from pmll_lab.backend import DEVICE
from pmll_lab.ops import settings
from pmll_lab.ops.carry import cuda
from pmll_lab.ops.carry.common import (INDEX_DTYPES, check_host_slots, check_spare_slots,
                                       check_state, offsets_table)
from pmll_lab.ops.carry.exact_kernels import gdn_carry_flush_kernel, gdn_carry_flush_vk_kernel
from pmll_lab.ops.gdn import recurrence
from pmll_lab.ops.gdn.recurrence import (DEFAULT_STATE_LAYOUT, block_config, check_layout,
                                         head_dims, vk_chunk_meta, vk_config)
from pmll_lab.ops.host import cdiv
from pmll_lab.ops.launch import device_guard
from pmll_lab.sizes import CARRY_CAP, snapshot_bytes_per_slot, stash_bytes_per_slot  # noqa: F401

GDN_CARRY_CAP = CARRY_CAP
"""Stash rows per (layer, slot): the seed's ``GDN_CARRY_CAP`` (``CARRY_CAP`` in its CUDA file).
``K <= CAP`` is required; a verify whose rows do not fit behind the pending ones writes back."""


@dataclass(eq=False)
class GdnCarry:
    """One layer's carried-state stash and pending counts for ``S`` slots (SPEC §3b).

    ``buf [S, CAP*(HV*vd + HV + HV*kd)]`` fp32, per slot the seed's layout
    ``vn[CAP][HV][vd] | g[CAP][HV] | sk[CAP][HV][kd]`` (last dim contiguous; any slot stride,
    so a view into a larger buffer works); ``pend [S]`` int32 on the same device, contiguous.
    Build with ``GdnCarry.empty(...)`` or pass existing tensors (validated here).
    Views for tests and references: ``.u [S, CAP, HV, vd]``, ``.g [S, CAP, HV]``,
    ``.k [S, CAP, HV, kd]``. ``state_layout``: the layout of the state pool this stash serves
    (default ``"vk"``, every GDN launcher's default). The stash rows are the same in both layouts,
    but pending rows fold into that pool, so every launcher given this carry refuses another
    ``state_layout`` (``ValueError`` naming the carry): a layout omitted in one call and named in
    another cannot read the pool transposed unnoticed, even when ``kd == vd``. A slot with
    ``pend > 0`` holds accepted rows not in its stored state: a plain ``gdn_decode`` there gives a
    wrong state (flush first; ``gdn_decode(..., carry=this, validate=True)`` refuses it). ``buf``
    and ``pend`` must share no memory with each other or with the state (the launchers refuse it,
    naming them).
    """

    buf: torch.Tensor
    pend: torch.Tensor
    num_v_heads: int
    k_dim: int
    v_dim: int
    cap: int = GDN_CARRY_CAP
    state_layout: str = DEFAULT_STATE_LAYOUT

    def __post_init__(self):
        for name in ("num_v_heads", "k_dim", "v_dim", "cap"):
            _checks.positive_int(name, getattr(self, name))
        check_layout("state_layout", self.state_layout)
        width = self.floats_per_slot
        _checks.tensor("buf", self.buf, ndim=2, shape=(None, width), dtype=torch.float32,
                       last_contiguous=True)
        _checks.tensor("pend", self.pend, shape=(self.buf.shape[0],), dtype=torch.int32,
                       device=self.buf.device, contiguous=True)

    @classmethod
    def empty(cls, slots: int, num_v_heads: int, k_dim: int, v_dim: int, *,
              cap: int = GDN_CARRY_CAP, device=None,
              state_layout: str = DEFAULT_STATE_LAYOUT) -> "GdnCarry":
        """A zeroed stash with ``pend = 0`` for ``slots`` slots on ``device`` (default
        ``pmll_lab.DEVICE``), serving a state pool in ``state_layout`` (``"vk"`` or ``"kv"``).
        Raises ``ValueError`` naming a bad size, ``device`` or ``state_layout``."""
        _checks.positive_int("slots", slots)
        check_layout("state_layout", state_layout)
        for name, val in (("num_v_heads", num_v_heads), ("k_dim", k_dim), ("v_dim", v_dim),
                          ("cap", cap)):
            _checks.positive_int(name, val)
        dev = _checks.device("device", device, DEVICE)
        width = cap * (num_v_heads * v_dim + num_v_heads + num_v_heads * k_dim)
        _checks.fits("slots, num_v_heads, k_dim, v_dim, cap", slots * (4 * width + 4), dev,
                     f"a stash [{slots}, {width}] fp32 and pend [{slots}]")
        return cls(buf=torch.zeros(slots, width, dtype=torch.float32, device=dev),
                   pend=torch.zeros(slots, dtype=torch.int32, device=dev),
                   num_v_heads=num_v_heads, k_dim=k_dim, v_dim=v_dim, cap=cap,
                   state_layout=state_layout)

    def __repr__(self) -> str:
        return (f"GdnCarry(slots={self.slots}, num_v_heads={self.num_v_heads}, "
                f"k_dim={self.k_dim}, v_dim={self.v_dim}, cap={self.cap}, "
                f"state_layout={self.state_layout!r}, device={self.device})")

    # -- sizes ------------------------------------------------------------------------------
    @property
    def slots(self) -> int:
        return self.buf.shape[0]

    @property
    def device(self) -> torch.device:
        return self.buf.device

    @property
    def floats_per_slot(self) -> int:
        """``CAP*(HV*vd + HV + HV*kd)``: the seed's ``gdn_carry_seq_floats``."""
        return self.cap * (self.num_v_heads * self.v_dim + self.num_v_heads
                           + self.num_v_heads * self.k_dim)

    @property
    def stash_bytes_per_slot(self) -> int:
        """Bytes of stash per slot (fp32; ``pmll_lab.sizes.stash_bytes_per_slot``)."""
        return stash_bytes_per_slot(self.num_v_heads, self.k_dim, self.v_dim, self.cap)

    @property
    def bytes(self) -> int:
        """Bytes held by this layer's stash and ``pend``."""
        return self.slots * (self.stash_bytes_per_slot + 4)

    # -- views ------------------------------------------------------------------------------
    @property
    def u(self) -> torch.Tensor:
        """``[S, CAP, HV, vd]`` view of the stashed ``u`` rows (the seed's ``vn``)."""
        n = self.cap * self.num_v_heads * self.v_dim
        return self.buf[:, :n].unflatten(1, (self.cap, self.num_v_heads, self.v_dim))

    @property
    def g(self) -> torch.Tensor:
        """``[S, CAP, HV]`` view of the stashed log decays."""
        a = self.cap * self.num_v_heads * self.v_dim
        return self.buf[:, a:a + self.cap * self.num_v_heads].unflatten(1, (self.cap, self.num_v_heads))

    @property
    def k(self) -> torch.Tensor:
        """``[S, CAP, HV, kd]`` view of the stashed normalised keys (the seed's ``sk``)."""
        a = self.cap * self.num_v_heads * (self.v_dim + 1)
        return self.buf[:, a:].unflatten(1, (self.cap, self.num_v_heads, self.k_dim))

    def reset(self, slots) -> None:
        """Forget the carry of ``slots``: ``pend = 0`` and their stash rows zeroed (as
        ``ConvCarry.reset`` does, so a reset slot holds the same thing in both carries).

        ``slots``: one int, a sequence of ints or an integer index tensor, each in ``[0, S)``
        (repeats allowed). Raises ``ValueError`` naming ``slots`` otherwise (checking a device
        tensor's values syncs; reset is not on the decode path). Use when a slot is freed or
        handed to a new sequence (its state is the caller's). The verify's arrival counts of
        those slots (``arrivals``) are zeroed too, so a slot whose verify was stopped part-way
        (Ctrl-C in the interpreter, a killed kernel) is new again."""
        idx = _checks.index_tensor("slots", slots, self.slots, device=self.pend.device)
        self.pend.index_fill_(0, idx, 0)
        self.buf.index_fill_(0, idx, 0.0)
        self.clear_arrivals(idx)

    def clear_arrivals(self, idx: torch.Tensor) -> None:
        """Zero the arrival counts of slots ``idx`` (an int64 index tensor on the carry's
        device). The split verify kernels count, per (slot, value head), the programs that have
        folded the pending rows (``[S, HV]`` int32, kept on the carry by
        ``pmll_lab.ops.carry.exact._arrivals``); the last to arrive restashes the shared
        ``g``/``k`` rows and sets the count back to 0. A launch stopped part-way leaves counts
        above 0, and the next write-back verify of the slot would then take the wrong program
        for the last (a wrong stash): zeroing them makes the counts right again."""
        arrive = getattr(self, "_arrivals", None)
        if arrive is not None:
            arrive.index_fill_(0, idx.to(arrive.device), 0)

    def copy_slots(self, src, dst) -> None:
        """Copy the carry of slots ``src`` to slots ``dst`` (``[n]`` ints or index tensors in
        ``[0, S)``; ``dst`` distinct and none of them in ``src``): their stash rows and
        ``pend``, so a slot forked from another (prefix caching, a forked request) holds the
        same pending rows as its source; copy the states alongside
        (``SpecDecodeStep.copy_slots`` does both). ``ValueError`` naming the argument."""
        s_idx, d_idx = _checks.copy_indices(src, dst, self.slots, self.pend.device)
        self.buf[d_idx] = self.buf[s_idx]
        self.pend[d_idx] = self.pend[s_idx]
        self.clear_arrivals(d_idx)


def check_carry(name: str, carry, state: torch.Tensor | None, layout: str) -> None:
    """``carry`` is a ``GdnCarry`` made for ``layout`` (its ``state_layout``) and matching
    ``state`` (slots, heads, dims) read in ``layout``."""
    if not isinstance(carry, GdnCarry):
        raise ValueError(f"{name}: expected a GdnCarry, got {type(carry).__name__}")
    if carry.state_layout != layout:
        raise ValueError(
            f"{name}: made for a state_layout={carry.state_layout!r} pool, but this call reads "
            f"the state as state_layout={layout!r} (the default when omitted is "
            f"{DEFAULT_STATE_LAYOUT!r}): pass one state_layout to GdnCarry.empty and to every "
            "launcher of the pool")
    if state is not None:
        S, HV = state.shape[:2]
        kd, vd = head_dims(state.shape, layout)
        if (carry.slots, carry.num_v_heads, carry.k_dim, carry.v_dim) != (S, HV, kd, vd):
            raise ValueError(
                f"{name}: stash for (slots, HV, kd, vd) = {(carry.slots, carry.num_v_heads, carry.k_dim, carry.v_dim)}"
                f" does not match state {tuple(state.shape)} read as state_layout={layout!r} "
                f"(slots, HV, kd, vd) = {(S, HV, kd, vd)}: is state_layout right?")
        _checks.same_device("state", state, **{f"{name}.buf": carry.buf, f"{name}.pend": carry.pend})
    _checks.no_overlap(f"{name}.buf", carry.buf)


# -- accept: the pending rows counted -------------------------------------------------------

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


def carry_accept(carry, slot_tab, engaged, accepted, *, rows=None, validate=False,
                 impl="triton") -> torch.Tensor:
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
    ``impl``: ``"triton"`` only (no CUDA twin). Returns ``accepted`` as the device tensor the
    launch read (a host list copied once, so a caller launching after it reuses the copy).
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
        return accepted
    pends = [c.pend for c in carries]
    with device_guard(pends[0]):
        block = settings.carry().accept_block
        carry_accept_kernel[(cdiv(B, block), len(pends))](
            pends[0], offsets_table(pends), slot_tab, engaged, accepted, B, BLOCK=block)
    return accepted


@triton.jit
def carry_swap_kernel(pend_ptr, slot_ptr, spare_ptr, acc_ptr, B, K, BLOCK: tl.constexpr):
    """For each live lane ``i < B`` with a spare (``>= 0``) whose ``acc[i] == K``: swap
    ``slot[i]`` and ``spare[i]`` (int32/int64 ``[B]``) and set ``pend`` (int32) of the new
    slot to 0. Each lane reads and writes only its own entries and its new slot. Launched by
    ``carry_accept_spec``."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < B
    slot = tl.load(slot_ptr + offs, mask=m, other=-1)
    spare = tl.load(spare_ptr + offs, mask=m, other=-1)
    a = tl.load(acc_ptr + offs, mask=m, other=0).to(tl.int32)
    full = m & (slot >= 0) & (spare >= 0) & (a == K)
    tl.store(slot_ptr + offs, spare, mask=full)
    tl.store(spare_ptr + offs, slot, mask=full)
    tl.store(pend_ptr + spare.to(tl.int64), tl.zeros_like(a), mask=full)


def carry_accept_spec(carry, slot_tab, spec_slot_tab, engaged, accepted, *, rows: int,
                      validate=False, impl="triton") -> None:
    """The commit after a verify with the speculative store (``gdn_carry_verify(...,
    spec_slot_tab=...)``), on the device with no host sync: ``carry_accept``, then for each
    sequence that accepted all ``rows`` (= ``K``) rows, ``slot_tab[b]`` and
    ``spec_slot_tab[b]`` swap (the spare slot holds the full-acceptance state) and the new
    slot's ``pend`` is 0. Both tables are updated in place, so a captured graph and a later
    verify read the new slots. ``carry``: one ``GdnCarry`` (one layer: a stack sharing the
    tables would swap them once per layer); ``engaged``: the flags that verify returned (flags
    of a verify without ``spec_slot_tab`` are refused: its spares hold no new state); ``rows``:
    that verify's ``K``. Raises ``ValueError`` naming the argument, before anything is written:
    ``carry_accept``'s checks, and ``spec_slot_tab``'s (``common.check_spare_slots``: values
    always on the host, with ``validate=True`` on a GPU). ``impl``: ``"triton"`` only (no CUDA
    twin)."""
    _checks.impl("carry_accept_spec", impl)
    if not isinstance(carry, GdnCarry):
        raise ValueError(f"carry: expected one GdnCarry, got {type(carry).__name__}")
    _checks.tensor("slot_tab", slot_tab, ndim=1, dtype=INDEX_DTYPES, device=carry.pend.device,
                   contiguous=True)
    _checks.positive_int("rows", rows)
    if not getattr(engaged, "spec_store", False):
        raise ValueError("engaged: not the flags of a verify with spec_slot_tab (its spare "
                         "slots hold no full-acceptance state)")
    if getattr(engaged, "verify_rows", rows) != rows:
        raise ValueError(f"rows: {rows}, but the verify that returned engaged ran "
                         f"K = {engaged.verify_rows} rows")
    check_spare_slots("spec_slot_tab", spec_slot_tab, slot_tab, carry.pend.shape[0], validate)
    accepted = carry_accept(carry, slot_tab, engaged, accepted, rows=rows, validate=validate)
    B = slot_tab.shape[0]
    if B == 0:
        return
    with device_guard(carry.pend):
        block = settings.carry().accept_block
        carry_swap_kernel[(cdiv(B, block),)](carry.pend, slot_tab, spec_slot_tab, accepted, B,
                                             rows, BLOCK=block)


# -- flush: the pending rows folded into the states ------------------------------------------

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
    _checks.flag("validate", validate)
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
        kernel = gdn_carry_flush_vk_kernel
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
