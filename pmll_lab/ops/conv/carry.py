"""The conv carry twin: verify K draft rows without K window snapshots, and the L-layer flush.

SPEC §3b/§3c; the seed's ``gdn_carry_conv`` / ``gdn_carry_conv_f32`` and ``gdn_carry_conv_flush``
(the source document ``seeds/001_fecc3e4a321ba26f.txt`` of ``../shared``, beside the project).
Per slot the carry keeps the last verify's input rows in a stash ``[CAP, dim]`` and
``pend[slot]``, the number of accepted inputs in it not yet shifted into the stored window. A
verify first shifts those ``p`` inputs into the window (in registers), writes the window back
when the protocol says so, runs the K rows and stashes their inputs; the caller's
``carry_accept`` then updates ``pend`` on the device.

Race freedom (SPEC §3b "Shared rows"): the conv is depthwise, so a program owns its channels of
its slot's window *and* stash; a write-back that restarts the stash at row 0 only overwrites
entries its own program has already read (before ``tl.debug_barrier()``). The l2norm groups
need a whole group's outputs, which a program holds (``common.conv_block_config``), and outputs
are not stashed. So any number of channel-block programs per sequence is safe.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from pmll_lab import _checks
from pmll_lab.ops.conv.common import (
    check_values,
    INPUT_DTYPES,
    check_conv_args,
    check_device,
    check_indices,
    conv_block_config,
    conv_output_row,
    seq_load,
    tile_channels,
)
from pmll_lab.ops.host import cdiv, next_power_of_2

DEFAULT_CAP = 8
"""Stash rows per slot (the seed's ``GDN_CARRY_CAP``)."""


@dataclass
class ConvCarry:
    """One layer's conv carry for ``S`` slots.

    Attributes:
        stash: ``[S, CAP, dim]`` input rows (bf16 for bf16 inputs, fp32 in the FP32 form); last dim
            contiguous, any other strides (it may be a view into a larger buffer).
        pend: ``[S]`` int32, contiguous, pending (accepted, not yet folded) inputs per slot,
            ``0..CAP``.

    ``cap`` is ``stash.shape[1]``. ``pend`` and ``cap`` mean the same as in ``GdnCarry``, so
    ``pmll_lab.carry.carry_accept`` serves both.
    """

    stash: torch.Tensor
    pend: torch.Tensor

    def __post_init__(self):
        _checks.tensor("stash", self.stash, ndim=3, dtype=INPUT_DTYPES, last_contiguous=True)
        # contiguous: carry_accept indexes pend with stride 1 (as for GdnCarry)
        _checks.tensor("pend", self.pend, shape=(self.stash.shape[0],), dtype=torch.int32,
                       device=self.stash.device, contiguous=True)

    @classmethod
    def empty(cls, slots: int, dim: int, *, cap: int = DEFAULT_CAP,
              dtype: torch.dtype = torch.bfloat16, device=None) -> "ConvCarry":
        """A zeroed stash ``[slots, cap, dim]`` of ``dtype`` and ``pend = 0``, on ``device``
        (default ``pmll_lab.backend.DEVICE``). Raises ``ValueError`` naming a bad size,
        ``dtype`` or ``device``."""
        from pmll_lab.backend import DEVICE

        _checks.positive_int("slots", slots)
        _checks.positive_int("dim", dim)
        _checks.positive_int("cap", cap)
        if dtype not in INPUT_DTYPES:
            raise ValueError(f"dtype: must be torch.float32 or torch.bfloat16, got {dtype!r}")
        dev = _checks.device("device", device, DEVICE)
        _checks.fits("slots, dim, cap", slots * (cap * dim * dtype.itemsize + 4), dev,
                     f"a stash [{slots}, {cap}, {dim}] and pend [{slots}]")
        return cls(torch.zeros(slots, cap, dim, dtype=dtype, device=dev),
                   torch.zeros(slots, dtype=torch.int32, device=dev))

    @classmethod
    def like(cls, conv_state: torch.Tensor, *, cap: int = DEFAULT_CAP) -> "ConvCarry":
        """A zeroed carry for ``conv_state [S, dim, state_len]``: its ``S`` slots, ``dim``,
        dtype (the stash holds input rows in the state's dtype, as ``conv_carry_verify``
        requires) and device; ``cap`` stash rows. ``empty`` takes the same explicitly (its
        ``dtype`` defaults to bf16). Raises ``ValueError`` naming ``conv_state`` or ``cap``."""
        _checks.tensor("conv_state", conv_state, ndim=3, dtype=INPUT_DTYPES)
        S, dim, _ = conv_state.shape
        return cls.empty(S, dim, cap=cap, dtype=conv_state.dtype, device=conv_state.device)

    @property
    def cap(self) -> int:
        return self.stash.shape[1]

    @property
    def slots(self) -> int:
        return self.stash.shape[0]

    @property
    def dim(self) -> int:
        return self.stash.shape[2]

    @property
    def dtype(self) -> torch.dtype:
        return self.stash.dtype

    def reset(self, slots) -> None:
        """Forget the carry of ``slots``: ``pend = 0`` and their stash rows zeroed.

        ``slots``: one int, a sequence of ints or an integer index tensor, each in ``[0, S)``
        (repeats allowed). Raises ``ValueError`` naming ``slots`` otherwise (checking a device
        tensor's values syncs; reset is not on the decode path)."""
        idx = _checks.index_tensor("slots", slots, self.slots, device=self.pend.device)
        self.pend.index_fill_(0, idx, 0)
        self.stash.index_fill_(0, idx, 0)

    def copy_slots(self, src, dst) -> None:
        """Copy the carry of slots ``src`` to slots ``dst`` (stash rows and ``pend``; ``dst``
        distinct, none in ``src``), as ``GdnCarry.copy_slots``: a forked slot holds its source's
        pending inputs; copy the windows alongside. ``ValueError`` naming the argument."""
        s_idx, d_idx = _checks.copy_indices(src, dst, self.slots, self.pend.device)
        self.stash[d_idx] = self.stash[s_idx]
        self.pend[d_idx] = self.pend[s_idx]

    @property
    def stash_bytes_per_slot(self) -> int:
        """``CAP * dim * element size``: the stash one slot owns."""
        return self.cap * self.dim * self.stash.element_size()

    @property
    def nbytes(self) -> int:
        """Bytes of the stash and ``pend`` for all slots."""
        return self.slots * self.stash_bytes_per_slot + self.slots * 4


# ---- verify -----------------------------------------------------------------------------------

@triton.jit
def _conv_carry_verify_kernel(
    state_ptr, stash_ptr, pend_ptr, x_ptr, w_ptr, bias_ptr, y_ptr, slot_ptr, eng_ptr,
    dim, cap, qk_channels, l2_eps,
    s_s, s_c, s_j,
    t_s, t_r,
    p_s,
    x_b, x_k,
    w_c, w_d,
    b_c,
    y_b, y_k,
    K: tl.constexpr, D: tl.constexpr, SL: tl.constexpr, SLP: tl.constexpr,
    W: tl.constexpr, WP: tl.constexpr, ROWS: tl.constexpr,
    HAS_BIAS: tl.constexpr, SILU: tl.constexpr, HAS_QK: tl.constexpr, LAZY: tl.constexpr,
):
    """Grid ``(channel blocks, B)``: ``seq = [window | stash rows 0..p-1 | x rows 0..K-1]``.
    A slot of -1 is a padding lane: zero outputs, ``engaged`` 1, no window, stash or ``pend``
    access."""
    pid_c = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    slot = tl.load(slot_ptr + b).to(tl.int64)
    live = slot >= 0
    slot = tl.maximum(slot, 0)
    p = tl.load(pend_ptr + slot * p_s, mask=live, other=0)
    if LAZY:
        write_back = (p + K > cap) & live
    else:
        write_back = (p > 0) & live
    first = tl.where(write_back, 0, p)
    ch, cmask_out, rows = tile_channels(pid_c, dim, W, WP, ROWS)
    cmask = cmask_out & live
    win = state_ptr + slot * s_s + ch * s_c
    st = stash_ptr + slot * t_s + ch
    xs = x_ptr + b * x_b + ch
    ws = w_ptr + ch * w_c
    bs = bias_ptr + ch * b_c
    cols = tl.arange(0, SLP)[None, None, :]
    mask3 = cmask[:, :, None] & (cols < SL)
    # reads: outputs of the K rows, and the window with the p pending inputs shifted in
    for t in tl.static_range(K):
        y = conv_output_row(t, ws, w_d, bs, win, s_j, st, t_r, xs, x_k, p, cmask, rows,
                            qk_channels, l2_eps, D, SL, W, WP, ROWS, HAS_BIAS, SILU, HAS_QK,
                            True)
        tl.store(y_ptr + b * y_b + t * y_k + ch, tl.where(live, y, 0.0).to(y_ptr.dtype.element_ty),
                 mask=cmask_out)
    folded = seq_load(win[:, :, None], s_j, st[:, :, None], t_r, xs[:, :, None], x_k, p + cols,
                      p, mask3, SL, True)
    tl.debug_barrier()   # every read of the window and stash above, every write below
    tl.store(win[:, :, None] + cols * s_j, folded, mask=mask3 & write_back)
    for t in tl.static_range(K):
        xv = tl.load(xs + t * x_k, mask=cmask, other=0.0)
        tl.store(st + (first + t) * t_r, xv, mask=cmask)
    if pid_c == 0:
        tl.store(eng_ptr + b, tl.where(write_back, 2, 1).to(tl.int32))


def conv_carry_verify(conv_state, conv_carry: ConvCarry, x, weight, bias=None, *, slot_tab,
                      lazy=False, activation="silu", qk_channels=0, head_dim=None, l2_eps=1e-6,
                      out_dtype=None, validate=False, impl="triton"):
    """Verify ``K`` draft rows per sequence with the carried conv window (SPEC §3b/§3c).

    Args:
        conv_state: ``[S, dim, state_len]`` fp32 or bf16 stored windows (as in ``conv_update``).
        conv_carry: the layer's ``ConvCarry`` (``S`` slots, stash dtype = ``x``'s dtype).
        x: ``[B, K, dim]`` input rows, ``1 <= K <= conv_carry.cap``; any strides on ``B``/``K``,
            last dim contiguous. weight ``[dim, d_conv]``, bias ``[dim]`` or None.
        slot_tab: ``[B]`` int32/int64 slot of each sequence (distinct), contiguous, ``B <= S``;
            -1 marks a padding lane (zero outputs, ``engaged`` 1, no window, stash or ``pend``
            access; other out-of-range slots are undefined behaviour without ``validate``).
        lazy: False (eager): write the window back whenever ``p = pend[slot] > 0``, stash the new
            rows at ``0..K-1``. True (lazy): write back only when ``p + K > cap`` (then stash at
            ``0..K-1``), else leave the stored window and stash at ``p..p+K-1``.
        activation, qk_channels, head_dim, l2_eps, out_dtype: as in ``conv_update``.
        validate: also check (a sync; ``pmll_lab._checks``; docs/layouts.md, "validate=True") slot
            values (in range, distinct), ``0 <= pend <= cap``, and that the live lanes' ``x``,
            ``weight``, ``bias``, the windows read and the pending stash rows are finite.
        impl: ``"triton"`` only (no CUDA twin).

    Both forms fold any ``p <= cap`` pending inputs. Returns ``(y [B, K, dim], engaged [B]
    int32)``: ``engaged[b] = 2`` when the window was written back, else 1. ``pend`` is left for
    ``carry_accept`` (``pend = a`` after a write-back, else ``p + a``). The outputs are bitwise
    equal to ``conv_update`` on the same inputs.

    Raises ``ValueError`` naming the argument: shapes, dtypes, devices, strides, ``K > cap``,
    and with ``validate=True`` bad slots or ``pend`` outside ``0..cap``.
    """
    _checks.impl("conv_carry_verify", impl)
    B, K, dim, d_conv, state_len, out_dtype = check_verify_args(
        conv_state, conv_carry, x, weight, bias, slot_tab=slot_tab, lazy=lazy,
        activation=activation, qk_channels=qk_channels, head_dim=head_dim, l2_eps=l2_eps,
        out_dtype=out_dtype, validate=validate)
    y = torch.empty(B, K, dim, dtype=out_dtype, device=x.device)
    engaged = _checks.engaged_flags(B, K, x.device)
    if B == 0:
        return y, engaged
    W, WP, ROWS, num_warps = conv_block_config(dim, head_dim)
    grid = (cdiv(cdiv(dim, W), ROWS), B)
    stash, pend = conv_carry.stash, conv_carry.pend
    _conv_carry_verify_kernel[grid](
        conv_state, stash, pend, x, weight, bias if bias is not None else weight, y, slot_tab,
        engaged, dim, conv_carry.cap, qk_channels, float(l2_eps),
        *conv_state.stride(), stash.stride(0), stash.stride(1), pend.stride(0),
        x.stride(0), x.stride(1), *weight.stride(), bias.stride(0) if bias is not None else 0,
        y.stride(0), y.stride(1),
        K=K, D=d_conv, SL=state_len, SLP=next_power_of_2(state_len),
        W=W, WP=WP, ROWS=ROWS, HAS_BIAS=bias is not None, SILU=activation == "silu",
        HAS_QK=qk_channels > 0, LAZY=lazy, num_warps=num_warps,
    )
    return y, engaged


def check_verify_args(conv_state, conv_carry, x, weight, bias=None, *, slot_tab, lazy=False,
                      activation="silu", qk_channels=0, head_dim=None, l2_eps=1e-6,
                      out_dtype=None, validate=False):
    """``conv_carry_verify``'s argument checks, run on the host with nothing launched (a driver
    checks a whole stack with it before the first launch). Returns ``(B, K, dim, d_conv,
    state_len, out_dtype)``; raises ``ValueError`` naming the argument."""
    B, K, dim, d_conv, state_len, out_dtype = check_conv_args(
        conv_state, x, weight, bias, rows=True, activation=activation,
        qk_channels=qk_channels, head_dim=head_dim, l2_eps=l2_eps, out_dtype=out_dtype)
    S = conv_state.shape[0]
    _check_carry("conv_carry", conv_carry, S, dim, conv_state)
    if not 1 <= K <= conv_carry.cap:
        raise ValueError(f"x: rows K (shape[1]) must be in 1..conv_carry.cap = {conv_carry.cap}, got {K}")
    if not isinstance(lazy, bool):
        raise ValueError(f"lazy: must be a bool, got {lazy!r}")
    _checks.flag("validate", validate)
    check_indices("slot_tab", slot_tab, B, S, conv_state.device)
    _checks.no_overlap("conv_state", conv_state)
    # the window (on a write-back) and the stash are written while the rows, the weights,
    # the pending counts and the slot table are still read
    _checks.apart({"conv_state": conv_state, "conv_carry.stash": conv_carry.stash},
                  {"x": x, "weight": weight, "bias": bias, "slot_tab": slot_tab,
                   "conv_carry.pend": conv_carry.pend})
    _host_slots(slot_tab, S, [("conv_carry.pend", conv_carry)])
    if validate:
        _checks.indices_values("slot_tab", slot_tab, S, padding=True)
        # the batch's slots only, as the GDN verify checks: other slots are not read
        live = slot_tab[slot_tab >= 0].long()
        _checks.range_values("conv_carry.pend", conv_carry.pend[live], 0, conv_carry.cap)
        check_values(conv_state, x, weight, bias, slot_tab, B)
        _checks.finite_pending("conv_carry", {"stash": conv_carry.stash}, live,
                               conv_carry.pend[live])
    return B, K, dim, d_conv, state_len, out_dtype


def _host_slots(slot_tab, S: int, carries) -> None:
    """On the host (every CPU run; free there): ``slot_tab`` in ``[0, S)`` or -1 and each
    listed carry's ``pend`` of those slots in ``[0, cap]`` (a kernel would otherwise address
    memory outside the window or stash). ``validate=True`` runs the same on a GPU."""
    if not _checks.on_host(slot_tab):
        return
    _checks.host_indices("slot_tab", slot_tab, S)
    live = slot_tab[slot_tab >= 0].long()
    for label, c in carries:
        if _checks.on_host(c.pend):
            _checks.range_values(label, c.pend[live], 0, c.cap)


def _check_carry(name, carry, S, dim, conv_state):
    if not isinstance(carry, ConvCarry):
        raise ValueError(f"{name}: expected a ConvCarry, got {type(carry).__name__}")
    stash = carry.stash
    if stash.shape[0] != S or stash.shape[2] != dim:
        raise ValueError(f"{name}: stash shape {tuple(stash.shape)} does not fit S = {S} slots "
                         f"and dim = {dim} of conv_state")
    if stash.dtype != conv_state.dtype:
        raise ValueError(f"{name}: stash dtype {stash.dtype} differs from conv_state's "
                         f"{conv_state.dtype} (ConvCarry.like(conv_state) builds a matching carry)")
    if stash.device != conv_state.device or carry.pend.device != conv_state.device:
        raise ValueError(f"{name}: on {stash.device}, but conv_state is on {conv_state.device}")
    _checks.tensor(f"{name}.stash", stash, last_contiguous=True)
    _checks.no_overlap(f"{name}.stash", stash)
    _checks.tensor(f"{name}.pend", carry.pend, shape=(S,), dtype=torch.int32, contiguous=True)


# ---- flush over L layers ----------------------------------------------------------------------

@triton.jit
def _conv_carry_flush_kernel(
    state_ptr, stash_ptr, pend_ptr, off_ptr, slot_ptr,
    L, dim,
    s_s, s_c, s_j,
    t_s, t_r,
    p_s,
    SL: tl.constexpr, SLP: tl.constexpr, W: tl.constexpr, WP: tl.constexpr,
    ROWS: tl.constexpr,
):
    """Grid ``(channel blocks, B, L)``. Layer ``l``'s tensors lie at the first layer's pointers
    plus ``off[l]`` (window elements), ``off[L + l]`` (stash elements), ``off[2L + l]`` (pend)."""
    pid_c = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    layer = tl.program_id(2)
    state_l = state_ptr + tl.load(off_ptr + layer)
    stash_l = stash_ptr + tl.load(off_ptr + L + layer)
    pend_l = pend_ptr + tl.load(off_ptr + 2 * L + layer)
    slot = tl.load(slot_ptr + b).to(tl.int64)
    live = slot >= 0                     # slot -1: a padding lane, nothing to fold
    slot = tl.maximum(slot, 0)
    p = tl.load(pend_l + slot * p_s, mask=live, other=0)
    ch, cmask, rows = tile_channels(pid_c, dim, W, WP, ROWS)
    win = (state_l + slot * s_s + ch * s_c)[:, :, None]
    st = (stash_l + slot * t_s + ch)[:, :, None]
    cols = tl.arange(0, SLP)[None, None, :]
    mask3 = cmask[:, :, None] & (cols < SL) & (p > 0)
    # seq = [window | stash rows 0..p-1]; no new rows (reads past them are masked: n < SL + p)
    folded = seq_load(win, s_j, st, t_r, st, 0, p + cols, p, mask3, SL, True)
    tl.debug_barrier()
    tl.store(win + cols * s_j, folded, mask=mask3)


_OFFSET_TABLES: dict = {}
_OFFSET_TABLES_MAX = 64


def offset_table(groups, device):
    """int64 ``[3 * L]`` element offsets of each layer's tensors from the first layer's, cached
    by what they depend on: the tensors' addresses and element sizes (a caching allocator hands
    the same addresses to tensors of another dtype), so a steady-state flush does no
    host-to-device copy."""
    key = (str(device),) + tuple((t.data_ptr(), t.element_size()) for g in groups for t in g)
    table = _OFFSET_TABLES.get(key)
    if table is None:
        offs = []
        for name, g in zip(("conv_states", "conv_carries (stash)", "conv_carries (pend)"), groups):
            base, size = g[0].data_ptr(), g[0].element_size()
            for t in g:
                diff = t.data_ptr() - base
                if diff % size:
                    raise ValueError(f"{name}: layer tensors must be aligned to their element size")
                offs.append(diff // size)
        table = torch.tensor(offs, dtype=torch.int64, device=device)
        if len(_OFFSET_TABLES) >= _OFFSET_TABLES_MAX:
            _OFFSET_TABLES.pop(next(iter(_OFFSET_TABLES)))
        _OFFSET_TABLES[key] = table
    return table


def conv_carry_flush(conv_states, conv_carries, slot_tab, *, validate=False,
                     impl="triton") -> None:
    """Fold every slot's pending inputs into its window, for ``L`` layers in one launch.

    Args:
        conv_states: list of ``L`` windows ``[S, dim, state_len]`` (same shape, strides, dtype;
            separately allocated tensors are fine).
        conv_carries: list of ``L`` ``ConvCarry`` (same stash shape, strides, dtype as one another
            and the windows' dtype).
        slot_tab: ``[B]`` int32/int64 slots to flush (distinct), contiguous, ``B <= S``; -1
            marks a padding lane (nothing read or written).
        validate: also check (a sync; ``pmll_lab._checks``; docs/layouts.md, "validate=True") slot
            values, ``0 <= pend <= cap``, and that the windows and pending stash rows read are
            finite, in every layer.
        impl: ``"triton"`` only (no CUDA twin).

    For each layer and ``slot = slot_tab[b]`` with ``p = pend[slot] > 0``: the window becomes its
    last ``state_len`` columns after shifting in ``stash[slot, :p]``, written back; ``p = 0``
    leaves it untouched. ``pend`` is not changed (the caller clears it, e.g. with
    ``ConvCarry.reset`` or ``pend[slots] = 0``). The seed's ``gdn_carry_conv_flush``.

    One launch over all layers: the kernel reads each layer's tensors at an int64 element offset
    from the first layer's pointer (a small table cached per set of addresses).
    Raises ``ValueError`` naming the argument.
    """
    _checks.impl("conv_carry_flush", impl)
    _checks.flag("validate", validate)
    if not isinstance(conv_states, (list, tuple)) or not conv_states:
        raise ValueError("conv_states: expected a non-empty list of per-layer windows")
    if not isinstance(conv_carries, (list, tuple)) or len(conv_carries) != len(conv_states):
        raise ValueError(f"conv_carries: expected a list of {len(conv_states)} ConvCarry (one per layer)")
    first = conv_states[0]
    _checks.tensor("conv_states[0]", first, ndim=3, dtype=INPUT_DTYPES)
    check_device("conv_states[0]", first)
    S, dim, state_len = first.shape
    for i, (cs, carry) in enumerate(zip(conv_states, conv_carries)):
        _checks.tensor(f"conv_states[{i}]", cs, shape=tuple(first.shape), dtype=first.dtype,
                       device=first.device)
        if cs.stride() != first.stride():
            raise ValueError(f"conv_states[{i}]: strides {cs.stride()} differ from layer 0's {first.stride()}")
        _check_carry(f"conv_carries[{i}]", carry, S, dim, first)
        c0 = conv_carries[0]
        if carry.stash.shape != c0.stash.shape or carry.stash.stride() != c0.stash.stride():
            raise ValueError(f"conv_carries[{i}]: stash shape/strides differ from layer 0's")
        if carry.pend.stride() != c0.pend.stride():
            raise ValueError(f"conv_carries[{i}]: pend strides differ from layer 0's")
    B = slot_tab.shape[0] if isinstance(slot_tab, torch.Tensor) else -1
    check_indices("slot_tab", slot_tab, B, S, first.device)
    for i, cs in enumerate(conv_states):
        _checks.no_overlap(f"conv_states[{i}]", cs)
    # every layer's window is written while every stash, pend and the slot table are read
    _checks.apart({f"conv_states[{i}]": cs for i, cs in enumerate(conv_states)},
                  {"slot_tab": slot_tab,
                   **{f"conv_carries[{i}].stash": c.stash for i, c in enumerate(conv_carries)},
                   **{f"conv_carries[{i}].pend": c.pend for i, c in enumerate(conv_carries)}})
    _host_slots(slot_tab, S, [(f"conv_carries[{i}].pend", c) for i, c in enumerate(conv_carries)])
    if validate:
        _checks.indices_values("slot_tab", slot_tab, S, padding=True)
        live = slot_tab[slot_tab >= 0].long()
        for i, carry in enumerate(conv_carries):
            _checks.range_values(f"conv_carries[{i}].pend", carry.pend[live], 0, carry.cap)
        for i, (cs, carry) in enumerate(zip(conv_states, conv_carries)):
            _checks.finite_slots(f"conv_states[{i}]", cs, live)
            _checks.finite_pending(f"conv_carries[{i}]", {"stash": carry.stash}, live,
                                   carry.pend[live])
    if B == 0:
        return
    L = len(conv_states)
    stashes = [c.stash for c in conv_carries]
    pends = [c.pend for c in conv_carries]
    table = offset_table((list(conv_states), stashes, pends), first.device)
    W, WP, ROWS, num_warps = conv_block_config(dim, None)
    grid = (cdiv(cdiv(dim, W), ROWS), B, L)
    c0 = conv_carries[0]
    _conv_carry_flush_kernel[grid](
        first, c0.stash, c0.pend, table, slot_tab, L, dim,
        *first.stride(), c0.stash.stride(0), c0.stash.stride(1), c0.pend.stride(0),
        SL=state_len, SLP=next_power_of_2(state_len), W=W, WP=WP, ROWS=ROWS,
        num_warps=num_warps,
    )
