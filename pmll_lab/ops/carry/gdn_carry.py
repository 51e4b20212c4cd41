"""Carried-state GDN verify, flush and accept: the launchers and the stash (SPEC §3b). The
kernels are split by algorithm: the exact form and the flush in
``pmll_lab.ops.carry.gdn_carry_exact``, the WY form in ``pmll_lab.ops.carry.gdn_carry_wy``, the
V-major state's in ``pmll_lab.ops.carry.gdn_carry_vk``; the accept kernel is here.

Buffers (all fp32 unless said):

- ``state [S, HV, kd, vd]``: the stored recurrent states (FLA layout, ``state_layout="kv"``),
  inner three dims contiguous, any slot stride; ``[S, HV, vd, kd]`` with ``state_layout="vk"``,
  whose kernels live in ``pmll_lab.ops.carry.gdn_carry_vk`` (this module's launchers pick them).
- ``GdnCarry.buf [S, W]`` with ``W = CAP*(HV*vd + HV + HV*kd)`` floats per slot (the seed's
  ``gdn_carry_seq_floats``), laid out as the seed's ``vn[CAP][HV][vd] | g[CAP][HV] |
  sk[CAP][HV][kd]``: row ``r`` of the stash holds ``u_r`` (the delta-rule correction, ``vn``),
  ``g_r`` (the log decay) and ``k_r`` (the l2-normalised key, ``sk``) of every value head.
- ``GdnCarry.pend [S]`` int32: accepted stash rows not yet folded into ``state``.

Verify (``gdn_carry_verify``), exact form, one program per (sequence, value head, column block
of ``BV`` value columns), grid ``(B, HV, NV)`` with ``block_config(kd, vd)``, decode's own split:
the program loads the slot's ``pend`` ``p`` and its state block, folds the ``p`` pending rows
(``fold_row``), writes the block back when the protocol says so (eager: ``p > 0``; lazy:
``p + K > CAP``), runs the ``K`` rows and stashes each row's ``u`` columns at stash row
``first + t`` (``first = 0`` after a write-back, else ``p``). The ``g`` and ``k`` stash rows are
shared by all column blocks of the head, so they are written once, after every block has folded
the old ones: each program counts itself in an arrival counter (``acq_rel`` atomic) after its
fold, and the last to arrive restashes them and resets the counter, so a write-back that restarts
the stash at row 0 can never overwrite a row that is still to be folded (SPEC §3b "Shared rows").
With ``EXACT_SPLIT_COLUMNS = False``, one program per (sequence, head) loops over the column
blocks instead (unrolled, constant block offsets) and restashes after the loop behind
``tl.debug_barrier()``. The WY form splits its column blocks the same way (``WY_SPLIT_COLUMNS``,
the default for key heads up to 128), or runs one program per (sequence, head) (``wy_config``). With ``CARRY_PREFETCH_ROWS``
(``pmll_lab.ops.gdn.recurrence``) the exact form and the folds load the next row before
running the current one. No two heads or slots
of a launch share state or stash bytes (slots distinct within a launch, heads disjoint).
``engaged[b]`` is written by the program of value head 0 (and column block 0 where split): 2
after a write-back, else 1.

- exact form: each row through ``qk_prepare`` + ``gdn_row`` of ``pmll_lab.ops.gdn.recurrence`` on
  ``block_config``'s block shapes and warps, the same code as plain decode, so outputs and folded
  states are bitwise equal to decoding the rows one by one.
- WY form: the ``K`` rows at once (SPEC §3b). Per program, before the column loop: the rows'
  normalised keys and scaled queries as ``[KP, BK]`` tiles (``KP = 16``, the smallest ``tl.dot``
  side), ``c = cumsum(g)``, ``A[t,s] = beta_t exp(c_t - c_s) k_t.k_s`` (``s < t``), the inverse
  ``T = (I + A)^-1`` by forward substitution over the ``K`` rows, and
  ``P[t,s] = exp(c_t - c_s) q_t.k_s`` (``s <= t``). Per column block: ``KH = K_rows H``,
  ``QH = Q_rows H`` (``tl.dot``, ``input_precision="ieee"`` so the fp32 state is not rounded to
  tf32), ``U = T (beta * (V - exp(c) KH))``, ``O = exp(c) QH + P U``; ``U``'s rows are the
  stashed ``u`` rows. Equal to the exact form up to fp32 rounding (tests: rel L2 <= 1e-4).

Flush (``gdn_carry_flush``), grid ``(B, HV * NV, L)``: folds each slot's pending rows into its
state for ``L`` separately allocated layers in one launch. The launcher passes layer 0's state,
stash and ``pend`` tensors as base pointers and three int64 tables holding each layer's element
offset from those bases (``(ptr_l - ptr_0) / itemsize``); the kernel adds ``table[l]``. That
works in the interpreter (which hands kernels the tensors' real CPU addresses) and on the GPU
(one flat address space). Flush reads the stash only, so it may split a head's columns across
programs. ``pend`` is not changed.

Accept (``carry_accept``), grid ``(cdiv(B, 128), L)``: ``pend[slot] = a if engaged == 2 else
pend[slot] + a`` for one or several carries (any object with ``.pend`` int32 ``[S]``), on the
device, with no host sync.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from pmll_lab import _checks
from pmll_lab.backend import DEVICE
from pmll_lab.ops.gdn import recurrence
from pmll_lab.ops.gdn.recurrence import (DEFAULT_STATE_LAYOUT, block_config, check_layout,
                                         head_dims, vk_chunks, vk_config)
# the kernels, re-exported here where the launchers and tools find them
from pmll_lab.ops.carry.gdn_carry_exact import (  # noqa: F401
    _ROW_PTRS, _ROW_STRIDES, _ROW_UNSPECIALIZED, _gdn_carry_exact_kernel,
    _gdn_carry_exact_split_kernel, _gdn_carry_flush_kernel, _verify_prologue)
from pmll_lab.ops.carry.gdn_carry_wy import (  # noqa: F401
    _gdn_carry_wy_kernel, _gdn_carry_wy_split_kernel, _wy_rows)
from pmll_lab.ops.gdn.gating import check_gating, split_gating
from pmll_lab.ops.host import cdiv
from pmll_lab.ops.launch import LaunchPlan

GDN_CARRY_CAP = 8
"""Stash rows per (layer, slot): the seed's ``GDN_CARRY_CAP`` (``CARRY_CAP`` in its CUDA file).
``K <= CAP`` is required; a verify whose rows do not fit behind the pending ones writes back."""

WY_ROWS_PAD = 16
"""The WY form pads the K axis to 16 rows: ``tl.dot`` needs every side >= 16."""

EXACT_SPLIT_COLUMNS = True
"""Exact form: split a head's column blocks across programs (grid ``(B, HV, NV)``, as decode
does, with an arrival count so that the last block restashes the shared g/k rows) instead of
looping over them inside one program per head (grid ``(B, HV)``). Measured on an NVIDIA H200,
2026-11-29 (reports/h200-2026-11-29b/logs/tune-carry.log; HK=16, HV=32, kd=vd=128, K=4, bf16 inputs):
split 114 / 154 us against the loop's 230 / 273 us at B=64 without / with write-back, 212 / 290
against 470 / 563 us at B=128, bitwise equal to the loop. Read at launch time;
``scripts/tune_carry.py`` times both, and the tests run both."""

EXACT_UNROLL_MAX_ROWS = GDN_CARRY_CAP
"""Exact form: verifies of up to this many rows unroll their row loop; longer ones run a
runtime loop (one compiled body for every row, no prefetch), as the chain does above
``pmll_lab.ops.gdn.decode.CHAIN_UNROLL_MAX_ROWS`` (perf-notes v10). Today every K unrolls
(``CAP``): on the H200 (2026-11-29, reports/h200-2026-11-29s3/logs/bitwise-probe-final.log) the
unrolled K = 8 verify at kd = 64 with **fp32** inputs gave rows 2-5 of its outputs 1 ulp off
decode's in ~2.5 % of their elements (bf16 inputs, kd = 128 / 256, and K = 4 were exact). The
runtime loop is the candidate fix, as it was for the chain, but it has not run on a GPU yet
(``scripts/bitwise_probe.py --carry-only`` checks and times both); set 4 to use it for K > 4.
Read at launch time."""

WY_DOT_PRECISION = "ieee"
"""``input_precision`` of the WY form's two products with the state (``K_rows H``, ``Q_rows H``;
the small ``[16, 16]`` products stay ``"ieee"``). ``"ieee"`` keeps the fp32 state exact but runs
on the FP32 pipes with the K axis padded to 16 (4x the work at K = 4); ``"tf32x3"`` uses the
tensor cores in three passes at close to fp32 accuracy. Read at launch time, so
``scripts/tune_carry.py`` can compare them; the choice stays ``"ieee"`` until the H200 says
otherwise (reports/perf-notes.md). The interpreter computes every ``tl.dot`` in fp32 whatever
this says."""

WY_SPLIT_COLUMNS = True
"""WY form, key heads up to 128 (``wy_config``): split a head's column blocks across programs (grid ``(B, HV, NV)``, arrival count as
in the split exact form), each program recomputing the head's small ``[16, 16]`` matrices,
instead of one program per head looping over them. Measured on an NVIDIA H200, 2026-11-29
(reports/h200-2026-11-29s3/logs/tune-carry.log; HK=16, HV=32, kd=vd=128, K=4, bf16 inputs, lazy):
split with 2 warps 394 / 425 us at B=64 without / with write-back, 759 / 823 us at B=128,
against 1373 / 1499 and 2767 / 3014 us for one program per head (4 warps, ``"ieee"``): 3.5x.
Still 3-4x slower than the split exact form (perf-notes v4, v8). Read at launch time;
``scripts/tune_carry.py`` times both, and the tests run both."""

WY_NUM_WARPS = 2
"""Warps per program of the split WY form. The WY form is not bound to decode's reductions (only
its fold is, and that is elementwise). Measured (H200, same log as ``WY_SPLIT_COLUMNS``): 2 warps
394 us, 4 warps 434 us, 1 warp 901 us at B=64, no write-back."""

WY_PER_HEAD_WARPS = 4
"""Warps per program of the per-head WY form (``WY_SPLIT_COLUMNS = False``, and key heads
wider than 128): fastest with 4 (1373 us against 2663 with 2 and 1673 with 1; same log)."""

VK_WY_ROWS = 16
"""Value rows per program of the V-major WY form (``tl.dot`` needs every side >= 16)."""

VK_WY_WARPS = 1
"""Warps per program of the V-major WY form (one ``[16, BK]`` tile)."""

WY_WIDE_HEAD_MIN_KD = 256
"""Key heads at least this wide run the per-head WY form with ``WY_PER_HEAD_WARPS``: the split
form with 2 warps took 12255 us against 3740 us per head with 4 warps at kd = vd = 256, HV=32,
B=64, K=4 (H200, roofline runs h200-2026-11-29s3 and h200-2026-11-29e: its ``[16, 256]`` row
tiles on 2 warps; perf-notes v8)."""


def wy_config(k_dim: int) -> tuple[bool, int]:
    """``(split columns, num_warps)`` of the WY launch for key head size ``k_dim``, from the
    measured table: split with ``WY_NUM_WARPS`` when ``WY_SPLIT_COLUMNS`` and
    ``k_dim < WY_WIDE_HEAD_MIN_KD``, else one program per head with ``WY_PER_HEAD_WARPS``."""
    if WY_SPLIT_COLUMNS and k_dim < WY_WIDE_HEAD_MIN_KD:
        return True, WY_NUM_WARPS
    return False, WY_PER_HEAD_WARPS


ACCEPT_BLOCK = 128
"""Sequences per program of the accept kernel (a handful of int32 loads/stores each)."""


# ---------------------------------------------------------------------------------------------
# The stash
# ---------------------------------------------------------------------------------------------

@dataclass(eq=False)
class GdnCarry:
    """One layer's carried-state stash and pending counts for ``S`` slots (SPEC §3b).

    ``buf [S, CAP*(HV*vd + HV + HV*kd)]`` fp32, per slot the seed's layout
    ``vn[CAP][HV][vd] | g[CAP][HV] | sk[CAP][HV][kd]`` (last dim contiguous; any slot stride,
    so a view into a larger buffer works); ``pend [S]`` int32 on the same device, contiguous.
    Build with ``GdnCarry.empty(...)`` or pass existing tensors (validated here).
    Views for tests and references: ``.u [S, CAP, HV, vd]``, ``.g [S, CAP, HV]``,
    ``.k [S, CAP, HV, kd]``.
    """

    buf: torch.Tensor
    pend: torch.Tensor
    num_v_heads: int
    k_dim: int
    v_dim: int
    cap: int = GDN_CARRY_CAP

    def __post_init__(self):
        for name in ("num_v_heads", "k_dim", "v_dim", "cap"):
            _checks.positive_int(name, getattr(self, name))
        width = self.floats_per_slot
        _checks.tensor("buf", self.buf, ndim=2, shape=(None, width), dtype=torch.float32,
                       last_contiguous=True)
        _checks.tensor("pend", self.pend, shape=(self.buf.shape[0],), dtype=torch.int32,
                       device=self.buf.device, contiguous=True)

    @classmethod
    def empty(cls, slots: int, num_v_heads: int, k_dim: int, v_dim: int, *,
              cap: int = GDN_CARRY_CAP, device=None) -> "GdnCarry":
        """A zeroed stash with ``pend = 0`` for ``slots`` slots on ``device`` (default
        ``pmll_lab.DEVICE``). Raises ``ValueError`` naming a bad size or ``device``."""
        _checks.positive_int("slots", slots)
        for name, val in (("num_v_heads", num_v_heads), ("k_dim", k_dim), ("v_dim", v_dim),
                          ("cap", cap)):
            _checks.positive_int(name, val)
        dev = _checks.device("device", device, DEVICE)
        width = cap * (num_v_heads * v_dim + num_v_heads + num_v_heads * k_dim)
        return cls(buf=torch.zeros(slots, width, dtype=torch.float32, device=dev),
                   pend=torch.zeros(slots, dtype=torch.int32, device=dev),
                   num_v_heads=num_v_heads, k_dim=k_dim, v_dim=v_dim, cap=cap)

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
        """Bytes of stash per slot (fp32)."""
        return 4 * self.floats_per_slot

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
        handed to a new sequence (its state is the caller's)."""
        idx = _checks.index_tensor("slots", slots, self.slots, device=self.pend.device)
        self.pend.index_fill_(0, idx, 0)
        self.buf.index_fill_(0, idx, 0.0)


def stash_bytes_per_slot(num_v_heads: int, k_dim: int, v_dim: int, cap: int = GDN_CARRY_CAP) -> int:
    """Stash bytes per (layer, slot) without allocating: ``4*CAP*(HV*vd + HV + HV*kd)``."""
    return 4 * cap * (num_v_heads * v_dim + num_v_heads + num_v_heads * k_dim)


def snapshot_bytes_per_slot(num_v_heads: int, k_dim: int, v_dim: int, rows: int) -> int:
    """Bytes of the snapshot chain's intermediate states per (layer, sequence): ``(K-1)`` fp32
    states of ``HV*kd*vd`` (SPEC §3a)."""
    return 4 * (rows - 1) * num_v_heads * k_dim * v_dim


# ---------------------------------------------------------------------------------------------
# Kernels: the exact form and the flush in gdn_carry_exact, the WY form in gdn_carry_wy,
# the V-major ones in gdn_carry_vk; the accept kernel here
# ---------------------------------------------------------------------------------------------

@triton.jit
def _carry_accept_kernel(pend_ptr, pend_off_ptr, slot_ptr, engaged_ptr, acc_ptr, B,
                         BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < B
    pend = pend_ptr + tl.load(pend_off_ptr + tl.program_id(1))
    slot = tl.load(slot_ptr + offs, mask=m, other=-1).to(tl.int64)
    m = m & (slot >= 0)                  # slot -1: a padding lane, its pend is not touched
    e = tl.load(engaged_ptr + offs, mask=m, other=1)
    a = tl.load(acc_ptr + offs, mask=m, other=0).to(tl.int32)
    p = tl.load(pend + slot, mask=m, other=0)
    tl.store(pend + slot, tl.where(e == 2, a, p + a), mask=m)


# ---------------------------------------------------------------------------------------------
# Launchers
# ---------------------------------------------------------------------------------------------

FORMS = ("exact", "wy")
INDEX_DTYPES = (torch.int32, torch.int64)

_TABLES: dict[tuple, torch.Tensor] = {}


def offsets_table(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """int64 ``[L]`` tensor of each tensor's element offset from ``tensors[0]``'s data pointer,
    on their device. Cached by the pointers (the table depends on nothing else), so a launcher
    called again on the same buffers does no host-to-device copy."""
    t0 = tensors[0]
    item = t0.element_size()
    key = (t0.device, item) + tuple(t.data_ptr() for t in tensors)
    table = _TABLES.get(key)
    if table is None:
        offs = []
        for t in tensors:
            delta = t.data_ptr() - t0.data_ptr()
            if delta % item:
                raise ValueError("tensors: data pointers are not a whole number of elements apart")
            offs.append(delta // item)
        if len(_TABLES) > 256:
            _TABLES.clear()
        table = _TABLES[key] = torch.tensor(offs, dtype=torch.int64, device=t0.device)
    return table


def check_carry(name: str, carry, state: torch.Tensor | None = None,
                layout: str = DEFAULT_STATE_LAYOUT) -> None:
    """``carry`` is a ``GdnCarry`` matching ``state`` (slots, heads, dims) in ``layout``."""
    if not isinstance(carry, GdnCarry):
        raise ValueError(f"{name}: expected a GdnCarry, got {type(carry).__name__}")
    if state is not None:
        S, HV = state.shape[:2]
        kd, vd = head_dims(state.shape, layout)
        if (carry.slots, carry.num_v_heads, carry.k_dim, carry.v_dim) != (S, HV, kd, vd):
            raise ValueError(
                f"{name}: stash for (slots, HV, kd, vd) = {(carry.slots, carry.num_v_heads, carry.k_dim, carry.v_dim)}"
                f" does not match state {tuple(state.shape)} read as state_layout={layout!r} "
                f"(slots, HV, kd, vd) = {(S, HV, kd, vd)}: is state_layout right?")
        _checks.same_device("state", state, **{f"{name}.buf": carry.buf, f"{name}.pend": carry.pend})


def check_state(name: str, state) -> torch.Tensor:
    """fp32, bf16 or fp16 ``[S, HV, kd, vd]`` (or ``[S, HV, vd, kd]``) on the kernels' device
    type, inner three dims contiguous (any slot stride)."""
    _checks.tensor(name, state, ndim=4, dtype=_checks.FLOAT_DTYPES)
    if state.device.type != DEVICE.type:
        raise ValueError(f"{name}: on {state.device}, but kernels run on {DEVICE} (pmll_lab.backend.DEVICE)")
    _, HV, d2, d3 = state.shape
    if min(HV, d2, d3) < 1:
        raise ValueError(f"{name}: heads HV and head sizes (dims 1-3) must be >= 1, got "
                         f"shape {tuple(state.shape)}")
    if state.stride()[1:] != (d2 * d3, d3, 1) and state.numel() > 0:
        raise ValueError(f"{name}: inner three dims must be contiguous, got strides {state.stride()}")
    return state


def _check_verify(state, carry, q, k, v, g, beta, slot_tab, form, lazy, scale, validate,
                  eager_max_pending, layout=DEFAULT_STATE_LAYOUT, gating=None):
    """``gdn_carry_verify``'s argument checks; returns ``(B, K, HK, scale)``."""
    check_layout("state_layout", layout)
    check_state("state", state)
    check_carry("carry", carry, state, layout)
    _checks.choice("form", form, FORMS)
    if not isinstance(lazy, bool):
        raise ValueError(f"lazy: expected a bool, got {type(lazy).__name__}")
    S, HV = state.shape[:2]
    kd, vd = head_dims(state.shape, layout)
    _checks.tensor("q", q, ndim=4, dtype=_checks.FLOAT_DTYPES, device=state.device, last_contiguous=True)
    B, K, HK = q.shape[:3]
    _checks.tensor("q", q, shape=(B, K, HK, kd))
    _checks.tensor("k", k, shape=(B, K, HK, kd), dtype=q.dtype, device=state.device, last_contiguous=True)
    _checks.tensor("v", v, shape=(B, K, HV, vd), dtype=q.dtype, device=state.device, last_contiguous=True)
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
    if form == "wy" and state.dtype != torch.float32:
        raise ValueError(f"form: the WY form needs an fp32 state, got {state.dtype}: it computes "
                         "the K rows at once, so it cannot round the state to the state's dtype "
                         "after every row as decoding does; use form='exact'")
    if form == "wy" and K > WY_ROWS_PAD:
        raise ValueError(f"K: the WY form verifies at most {WY_ROWS_PAD} rows (its row tiles), "
                         f"got K = {K}; use form='exact'")
    if B > S:
        raise ValueError(f"slot_tab: {B} sequences but only {S} slots")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))):
        raise ValueError(f"scale: expected a float or None, got {type(scale).__name__}")
    scale = kd ** -0.5 if scale is None else float(scale)
    if validate:
        _checks.indices_values("slot_tab", slot_tab, S, padding=True)
        pend = carry.pend[slot_tab[slot_tab >= 0].long()]
        _checks.range_values("carry.pend", pend, 0, carry.cap)
        if not lazy and eager_max_pending is not None and pend.numel() \
                and int(pend.max()) > eager_max_pending:
            raise ValueError(
                f"carry.pend: an eager verify folds at most eager_max_pending = {eager_max_pending}"
                f" rows, a slot holds {int(pend.max())}: flush first (gdn_carry_flush)")
        if gating is None:
            _checks.range_values("g", g, float("-inf"), 0.0)
            _checks.range_values("beta", beta, 0.0, 1.0)

    return B, K, HK, scale


def _checked_outputs(state, carry, q, k, v, g, beta, slot_tab, form, lazy, scale, validate,
                     eager_max_pending, layout=DEFAULT_STATE_LAYOUT, gating=None):
    """Checks (``_check_verify``), then the verify's outputs: ``(scale, o [B, K, HV, vd] in v's
    dtype, engaged [B] int32)``, uninitialised."""
    B, K, _, scale = _check_verify(state, carry, q, k, v, g, beta, slot_tab, form, lazy, scale,
                                   validate, eager_max_pending, layout, gating)
    HV, vd = state.shape[1], head_dims(state.shape, layout)[1]
    o = torch.empty(B, K, HV, vd, dtype=v.dtype, device=v.device)
    return scale, o, torch.empty(B, dtype=torch.int32, device=v.device)


def gdn_carry_verify(state, carry, q, k, v, g=None, beta=None, *, slot_tab, form="exact",
                     lazy=False, scale=None, use_qk_l2norm=True, validate=False,
                     eager_max_pending=None, state_layout=DEFAULT_STATE_LAYOUT, A_log=None,
                     a=None, dt_bias=None, b=None):
    """Carried-state verify of ``K`` draft rows per sequence (SPEC §3b; seed ``gdn_exact_carry``,
    ``gdn_carry_wy`` and their ``_lazy`` forms).

    Args:
        state: ``[S, HV, kd, vd]`` (``state_layout="kv"``) or ``[S, HV, vd, kd]`` (``"vk"``),
            fp32, bf16 or fp16, inner dims contiguous. Read; written only on a write-back
            (``engaged == 2``), with the slot's pending rows folded in. A bf16/fp16 state is
            computed on in fp32 and rounded to its dtype after every folded and verified row,
            where decoding stores it (the exact form stays bitwise equal to decoding; the WY
            form refuses it); the stash stays fp32.
        carry: the layer's ``GdnCarry`` (``S`` slots, ``HV``, ``kd``, ``vd``, ``CAP``). Its stash
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
        form: ``"exact"`` (bitwise equal to decoding the rows one at a time) or ``"wy"``.
        lazy: ``False`` = eager (write back whenever ``pend > 0``); ``True`` = write back only
            when ``pend + K > CAP``.
        scale: query scale, default ``kd ** -0.5``. use_qk_l2norm: l2-normalise q and k.
        validate: also run the checks that sync with the device: slots distinct and in range,
            ``0 <= pend <= CAP``, ``g <= 0``, ``beta`` in ``[0, 1]``, and for an eager verify
            ``pend <= eager_max_pending`` (when that is not ``None``; the kernel itself folds
            any ``pend <= CAP``).
        state_layout: ``"kv"`` (K-major kernels, this module) or ``"vk"`` (V-major kernels,
            ``pmll_lab.ops.carry.gdn_carry_vk``: a tile of value rows per program, bitwise
            equal to V-major ``gdn_decode``). The stash is the same for both.

    Returns:
        ``(o, engaged)``: ``o [B, K, HV, vd]`` in ``v``'s dtype; ``engaged [B]`` int32, 2 if the
        verify wrote the state back, else 1.

    Raises:
        ValueError naming the argument: shapes, dtypes, devices, strides, ``HV % HK``,
        ``1 <= K <= CAP``, unknown ``form``; value errors with ``validate=True``.
    """
    g, beta, gating = split_gating(g, beta, A_log, a, dt_bias, b)
    scale, o, engaged = _checked_outputs(state, carry, q, k, v, g, beta, slot_tab, form, lazy,
                                         scale, validate, eager_max_pending, state_layout,
                                         gating)
    if o.shape[0] == 0:
        return o, engaged
    with _device_guard(state):
        _launch_verify(state, carry, q, k, v, g, beta, o, engaged, slot_tab, form, lazy, scale,
                       use_qk_l2norm, state_layout, gating)
    return o, engaged


def _arrivals(carry, num_v_heads: int) -> torch.Tensor:
    """The split forms' (exact and WY) arrival counts ``[S, HV]`` int32 for ``carry``: zeros, allocated
    on first use and kept on the carry (every launch leaves them at zero)."""
    arrive = getattr(carry, "_arrivals", None)
    if arrive is None or arrive.shape != (carry.slots, num_v_heads) or arrive.device != carry.device:
        arrive = torch.zeros(carry.slots, num_v_heads, dtype=torch.int32, device=carry.device)
        carry._arrivals = arrive
    return arrive


def _device_guard(t: torch.Tensor):
    """Launch on ``t``'s GPU (Triton launches on the current device)."""
    return torch.cuda.device(t.device) if t.device.type == "cuda" else contextlib.nullcontext()


def _verify_launch_args(state, carry, q, k, v, g, beta, o, engaged, slot_tab, form, lazy, scale,
                        use_qk_l2norm, layout=DEFAULT_STATE_LAYOUT, gating=None):
    """``(kernel, grid, args, kwargs)`` of the verify launch for ``form``, ``layout`` and the
    launch-time settings (``EXACT_SPLIT_COLUMNS``, ``WY_*``, ``CARRY_PREFETCH_ROWS``,
    ``block_config`` / ``vk_config``)."""
    B, K, HK = q.shape[:3]
    HV = state.shape[1]
    kd, vd = head_dims(state.shape, layout)
    if layout == "vk":
        return _verify_launch_args_vk(state, carry, q, k, v, g, beta, o, engaged, slot_tab, form,
                                      lazy, scale, use_qk_l2norm, B, K, HK, HV, kd, vd, gating)
    gate_ptrs = _gate_ptrs(state, gating)
    BK, BV, num_warps = block_config(kd, vd)
    args = (state, carry.buf, carry.pend, slot_tab, q, k, v, g, beta, o, engaged, *gate_ptrs,
            scale, state.stride(0), carry.buf.stride(0),
            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2), g.stride(0), g.stride(1),
            beta.stride(0), beta.stride(1), o.stride(0), o.stride(1), o.stride(2))
    meta = dict(K=K, CAP=carry.cap, HV=HV, GROUP=HV // HK, KD=kd, VD=vd, LAZY=lazy,
                USE_QK_L2NORM=bool(use_qk_l2norm), PREFETCH=recurrence.CARRY_PREFETCH_ROWS,
                GATE=gating is not None)
    unroll = K <= EXACT_UNROLL_MAX_ROWS
    if form == "exact" and EXACT_SPLIT_COLUMNS:
        NV = cdiv(vd, BV)
        return (_gdn_carry_exact_split_kernel, (B, HV, NV),
                (*args[:4], _arrivals(carry, HV), *args[4:]),
                dict(BK=BK, BV=BV, NV=NV, num_warps=num_warps, UNROLL=unroll, **meta))
    if form == "exact":
        return (_gdn_carry_exact_kernel, (B, HV), args,
                dict(BK=BK, BV=BV, NV=cdiv(vd, BV), num_warps=num_warps, UNROLL=unroll, **meta))
    bk, bv = max(BK, 16), max(BV, 16)
    split, warps = wy_config(kd)
    wy = dict(BK=bk, BV=bv, NV=cdiv(vd, bv), KP=WY_ROWS_PAD, DOT_PRECISION=WY_DOT_PRECISION,
              num_warps=warps, **meta)
    if split:
        return (_gdn_carry_wy_split_kernel, (B, HV, wy["NV"]),
                (*args[:4], _arrivals(carry, HV), *args[4:]), wy)
    return _gdn_carry_wy_kernel, (B, HV), args, wy


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
                           scale, use_qk_l2norm, B, K, HK, HV, kd, vd, gating=None):
    """The V-major verify launch (``pmll_lab.ops.carry.gdn_carry_vk``): tiles of value rows
    from ``vk_config`` for ``B * HV`` (the WY form: at least 16 rows and keys, for
    ``tl.dot``)."""
    from pmll_lab.ops.carry import gdn_carry_vk as VK

    args = (state, carry.buf, carry.pend, slot_tab, _arrivals(carry, HV),
            *_row_args(state, carry, q, k, v, g, beta, o, engaged, slot_tab, scale, gating))
    meta = dict(K=K, CAP=carry.cap, HV=HV, GROUP=HV // HK, KD=kd, VD=vd, LAZY=lazy,
                USE_QK_L2NORM=bool(use_qk_l2norm), PREFETCH=recurrence.CARRY_PREFETCH_ROWS,
                GATE=gating is not None)
    BK, BR, num_warps = vk_config(kd, vd, B * HV, "carry")
    if form == "exact":
        NT = cdiv(vd, BR)
        return (VK.gdn_carry_exact_vk_kernel, (B, HV, NT), args,
                dict(BK=BK, BV=BR, NV=NT, num_warps=num_warps,
                     UNROLL=K <= EXACT_UNROLL_MAX_ROWS, **_chunks(BK), **meta))
    bk, br = max(BK, 16), max(BR, VK_WY_ROWS)
    NT = cdiv(vd, br)
    return (VK.gdn_carry_wy_vk_kernel, (B, HV, NT), args,
            dict(BK=bk, BV=br, NV=NT, KP=WY_ROWS_PAD, DOT_PRECISION=VK.WY_VK_DOT_PRECISION,
                 num_warps=VK_WY_WARPS, **_chunks(bk), **meta))


def _chunks(block_k: int) -> dict:
    """The V-major kernels' ``NC``, ``CW`` constexprs for a key block of ``block_k``."""
    return dict(zip(("NC", "CW"), vk_chunks(block_k)))


def _launch_verify(*args):
    kernel, grid, a, kw = _verify_launch_args(*args)
    kernel[grid](*a, **kw)


def gdn_carry_verify_plan(state, carry, q, k, v, g=None, beta=None, *, slot_tab, form="exact",
                          lazy=False, scale=None, use_qk_l2norm=True, validate=False,
                          eager_max_pending=None, state_layout=DEFAULT_STATE_LAYOUT,
                          A_log=None, a=None, dt_bias=None, b=None) -> LaunchPlan:
    """``gdn_carry_verify`` bound to these buffers, for host-bound small batches (issue 5, B=1).

    Checks the arguments once, as ``gdn_carry_verify`` does (``validate`` checks the values at
    plan time only), allocates ``o`` and ``engaged`` once, and returns a
    ``pmll_lab.ops.launch.LaunchPlan``: ``plan()`` runs the verify on whatever ``state``, the
    stash, ``pend``, ``slot_tab`` and the row tensors hold at that moment and returns
    ``(o, engaged)`` (the same two tensors every call: read them before the next call). After
    the first call on a GPU, calls go straight to the compiled kernel: no checks, allocations or
    argument binding. Write each step's rows into the same tensors: a plan keeps reading the
    tensors it was made with, so rebinding a name (``q = new``) is silently ignored; make a new
    plan instead. ``pend`` is read on every call: apply ``carry_accept`` between calls, as with
    ``gdn_carry_verify``. The launch-time settings (``EXACT_SPLIT_COLUMNS``, ``WY_*``, ``block_config``) are
    read when the plan is made. Same results, bit for bit, as ``gdn_carry_verify``.
    Raises ``ValueError`` naming the argument.
    """
    g, beta, gating = split_gating(g, beta, A_log, a, dt_bias, b)
    scale, o, engaged = _checked_outputs(state, carry, q, k, v, g, beta, slot_tab, form, lazy,
                                         scale, validate, eager_max_pending, state_layout,
                                         gating)
    if o.shape[0] == 0:
        return LaunchPlan(None, (1,), (), {}, outputs=(o, engaged))
    kernel, grid, args, kw = _verify_launch_args(state, carry, q, k, v, g, beta, o, engaged,
                                                 slot_tab, form, lazy, scale, use_qk_l2norm,
                                                 state_layout, gating)
    return LaunchPlan(kernel, grid, args, kw, outputs=(o, engaged), device=state.device)


def gdn_carry_flush(states, carries, slot_tab, *, validate=False,
                    state_layout=DEFAULT_STATE_LAYOUT) -> None:
    """Fold every listed slot's pending rows into its state, over ``L`` layers in one launch
    (SPEC §3b "Flush"; the seed's ``gdn_carry_flush``).

    ``states``: list of ``L`` states in ``state_layout`` (``[S, HV, kd, vd]`` for ``"kv"``,
    ``[S, HV, vd, kd]`` for ``"vk"``; separately allocated is fine; same
    shape, strides and dtype: fp32, or bf16/fp16 rounded after every folded row); ``carries``: list of ``L`` ``GdnCarry`` (same layout and slot stride);
    ``slot_tab [B]`` int32/int64, contiguous. A slot with ``pend = 0`` is left alone; ``pend`` is not changed
    (the caller clears it). Folding uses ``fold_row`` on ``block_config`` blocks, so the state is
    bitwise the one plain decoding would hold. ``validate=True``: slots distinct and in range,
    ``0 <= pend <= CAP`` in every layer. ``state_layout``: ``"kv"`` (states
    ``[S, HV, kd, vd]``) or ``"vk"`` (``[S, HV, vd, kd]``, V-major tiles; the same bits as
    V-major decoding). Raises ``ValueError`` naming the argument.
    """
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
    if validate:
        _checks.indices_values("slot_tab", slot_tab, S, padding=True)
        live = slot_tab[slot_tab >= 0].long()
        for i, ca in enumerate(carries):
            _checks.range_values(f"carries[{i}].pend", ca.pend[live], 0, ca.cap)
    if B == 0:
        return
    L = len(states)
    if state_layout == "vk":
        from pmll_lab.ops.carry.gdn_carry_vk import gdn_carry_flush_vk_kernel as kernel

        BK, BV, num_warps = vk_config(kd, vd, B * HV, "carry")
        extra = _chunks(BK)
    else:
        extra = {}
        kernel = _gdn_carry_flush_kernel
        BK, BV, num_warps = block_config(kd, vd)
    NV = cdiv(vd, BV)
    pends = [c.pend for c in carries]
    with _device_guard(states[0]):
        kernel[(B, HV * NV, L)](
            states[0], carries[0].buf, pends[0], slot_tab,
            offsets_table(states), offsets_table([c.buf for c in carries]), offsets_table(pends),
            states[0].stride(0), carries[0].buf.stride(0),
            CAP=carries[0].cap, HV=HV, KD=kd, VD=vd, BK=BK, BV=BV, NV=NV,
            PREFETCH=recurrence.CARRY_PREFETCH_ROWS, num_warps=num_warps, **extra)


def carry_accept(carry, slot_tab, engaged, accepted, *, rows=None, validate=False) -> None:
    """The pending update after a verify, on the device with no host sync (SPEC §3b):
    ``pend[slot] = a if engaged == 2 else pend[slot] + a`` for each sequence.

    ``carry``: one carry or a list of carries (one launch for all; e.g. every layer's GDN and conv
    carry of a step, which share ``slot_tab`` and ``engaged``), each with ``.pend`` int32 ``[S]``
    and ``.cap`` (``GdnCarry``, ``ConvCarry``; ``pend`` contiguous); ``slot_tab [B]``
    int32/int64; ``engaged [B]`` int32 as the verify returned it; ``accepted [B]`` int32/int64
    on the same device, or a list of ints (copied to the device; floats are rejected). The three
    index tensors must be contiguous (read at offset ``b``). Raises ``ValueError`` naming the
    argument. ``rows``: the verify's ``K``. Host ints are always checked to lie in ``[0, K]``
    (``[0, CAP]`` without ``rows``): no sync needed, and an ``a > K`` would count stale stash
    rows of an earlier step as pending.
    ``validate=True`` checks slots distinct and in range, ``engaged`` in {1, 2}, ``0 <= a <= K``
    (``rows``) and ``<= CAP``, and that no ``pend`` exceeds ``CAP`` afterwards (a sync).
    """
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
    if validate:
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
    with _device_guard(pends[0]):
        _carry_accept_kernel[(cdiv(B, ACCEPT_BLOCK), len(pends))](
            pends[0], offsets_table(pends), slot_tab, engaged, accepted, B, BLOCK=ACCEPT_BLOCK)
