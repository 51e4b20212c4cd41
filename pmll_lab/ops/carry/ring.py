"""The ring form of the carried-state GDN verify (SPEC §3d): ``GdnRing``, verify, commit, flush.

The stored state is read-only during a verify; the accepted rows live in a ring per
(layer, slot) until a fold, and enter each verify as a low-rank correction. Design: the
ReplaySSM verify (FlashInfer 0.7.2's ``gated_delta_rule_mtp_ucache_flush``, SGLang, TensorRT-LLM),
written here from SPEC §3d. A tolerance form: outputs and folded states answer to the float64
exact protocol (``pmll_lab.reference.carry``) within ``RING_TOLERANCE``, not bitwise; the float64
restatement of its algebra is ``pmll_lab.reference.ring``. Kernels:
``pmll_lab.ops.carry.ring_verify`` (the verify) and ``ring_kernels`` (flush, commit).

Buffers (``GdnRing``), per layer, ``NS = 2 R`` physical rows per head (``R`` = ``length``):

  ==========  ======================  ===========  ================================================
  name        shape                   dtype        meaning
  ==========  ======================  ===========  ================================================
  ``k``       ``[S, HK, NS, kd]``     state's      normalised keys (one per key head, as GVA shares)
  ``u``       ``[S, HV, NS, vd]``     state's      corrections ``u_j``
  ``G``       ``[S, HV, NS]``         fp32         cumulative log decay from the stored state
  ``len``     ``[S]``                 int32        rows in the window (``P``), set by the caller
  ``base``    ``[S]``                 int32        first row of the window, set by the caller
  ==========  ======================  ===========  ================================================

The window is rows ``base .. base + len - 1`` (mod ``NS``); a verify appends at ``base + len ..``,
past it, so no program of the launch overwrites a row another still reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from pmll_lab import _checks
from pmll_lab.backend import DEVICE
from pmll_lab.ops import settings
from pmll_lab.ops.carry.common import INDEX_DTYPES, check_state, offsets_table
from pmll_lab.ops.carry.ring_verify import gdn_ring_fused_kernel
from pmll_lab.ops.carry.ring_kernels import (SMALL_PRODUCTS, gdn_ring_flush_kernel,
                                                 ring_accept_kernel)
from pmll_lab.ops.gdn.gating import check_gating, gate_groups, gate_inputs, split_gating
from pmll_lab.ops.gdn.recurrence import DEFAULT_STATE_LAYOUT
from pmll_lab.ops.host import cdiv, next_power_of_2
from pmll_lab.ops.launch import device_guard
from pmll_lab.tolerances import RING_TOL

RING_LENGTHS = (8, 16, 32)
"""Ring lengths ``R`` (rows a slot holds before a fold) the kernels take."""
RING_DEFAULT_LENGTH = 16
"""FlashInfer's window (``W_RING``): with ``K = 4`` a fold about every fourth step."""
RING_HEAD_DIMS = (16, 256)
"""``kd``/``vd`` range of the kernels (multiples of 16: ``tl.dot`` tiles)."""
RING_MAX_ROWS = 8
"""Most draft rows per verify: the new rows' keys and queries share one 16-column tile."""
RING_TOLERANCE = RING_TOL
"""rel L2 of the ring form against the float64 exact protocol, per state dtype
(``pmll_lab.tolerances.RING_TOL``)."""


def _ring_head_dim(name: str, d: int) -> None:
    """``ValueError`` naming ``name`` unless ``d`` is a head size the ring form's ``tl.dot``
    tiles take (multiples of 16 in ``RING_HEAD_DIMS``)."""
    lo, hi = RING_HEAD_DIMS
    if d % 16 or not lo <= d <= hi:
        raise ValueError(f"{name}: head size {d} is not supported by the ring form "
                         f"(multiples of 16 in [{lo}, {hi}]: tl.dot tiles)")


@dataclass(eq=False)
class GdnRing:
    """One layer's ring for ``S`` slots (SPEC §3d); its fields are tabled in the docstring of
    ``pmll_lab.ops.carry.ring``.

    Build with ``GdnRing.empty(...)`` (zeroed; ``len = base = 0``). ``length`` is ``R``, one of
    ``RING_LENGTHS`` (8, 16, 32). ``state_layout`` is ``"vk"`` (class attribute): the ring
    form runs on V-major states only, every GDN launcher's default layout.
    ``ValueError`` naming the field for a shape, dtype or device that does not fit."""

    state_layout: ClassVar[str] = "vk"
    k: torch.Tensor
    u: torch.Tensor
    G: torch.Tensor
    len: torch.Tensor
    base: torch.Tensor
    length: int = RING_DEFAULT_LENGTH

    def __post_init__(self):
        _checks.choice("length", self.length, RING_LENGTHS)
        ns = 2 * self.length
        _checks.tensor("u", self.u, ndim=4, dtype=_checks.FLOAT_DTYPES, contiguous=True)
        S, HV, _, vd = self.u.shape
        for name, t in (("u", self.u), ("k", self.k)):
            if t.dim() == 4 and min(t.shape[:2]) < 1:
                raise ValueError(f"{name}: slots and heads must be at least 1, got shape "
                                 f"{tuple(t.shape)}")
        _checks.tensor("u", self.u, shape=(S, HV, ns, vd))
        _checks.tensor("k", self.k, ndim=4, dtype=self.u.dtype, device=self.u.device,
                       contiguous=True)
        if self.k.shape[0] != S or self.k.shape[2] != ns or HV % max(self.k.shape[1], 1):
            raise ValueError(f"k: expected [{S}, HK, {ns}, kd] with HV = {HV} a multiple of HK, "
                             f"got {tuple(self.k.shape)}")
        _checks.tensor("G", self.G, shape=(S, HV, ns), dtype=torch.float32,
                       device=self.u.device, contiguous=True)
        for name in ("len", "base"):
            _checks.tensor(name, getattr(self, name), shape=(S,), dtype=torch.int32,
                           device=self.u.device, contiguous=True)
        for name, d in (("k", self.k.shape[3]), ("u", self.u.shape[3])):
            _ring_head_dim(name, d)

    def __repr__(self) -> str:
        return (f"GdnRing(slots={self.slots}, num_k_heads={self.num_k_heads}, "
                f"num_v_heads={self.num_v_heads}, k_dim={self.k_dim}, v_dim={self.v_dim}, "
                f"length={self.length}, dtype={self.dtype}, device={self.device})")

    @classmethod
    def empty(cls, slots: int, num_k_heads: int, num_v_heads: int, k_dim: int, v_dim: int, *,
              length: int = RING_DEFAULT_LENGTH, dtype=torch.float32, device=None) -> "GdnRing":
        """A zeroed ring (``len = base = 0``) whose ``k``/``u`` rows are in ``dtype`` (the state
        pool's dtype), on ``device`` (default ``pmll_lab.DEVICE``)."""
        for name, val in (("slots", slots), ("num_k_heads", num_k_heads),
                          ("num_v_heads", num_v_heads), ("k_dim", k_dim), ("v_dim", v_dim)):
            _checks.positive_int(name, val)
        _checks.positive_int("length", length)
        _checks.choice("length", length, RING_LENGTHS)
        _checks.choice("dtype", dtype, _checks.FLOAT_DTYPES)
        if num_v_heads % num_k_heads:
            raise ValueError(f"num_v_heads: {num_v_heads} is not a multiple of num_k_heads "
                             f"({num_k_heads})")
        _ring_head_dim("k_dim", k_dim)
        _ring_head_dim("v_dim", v_dim)
        dev = _checks.device("device", device, DEVICE)
        ns = 2 * length
        _checks.fits("slots, num_k_heads, num_v_heads, k_dim, v_dim",
                     slots * (ns * (num_k_heads * k_dim + num_v_heads * v_dim) * dtype.itemsize
                              + 4 * ns * num_v_heads + 8), dev,
                     f"a ring of k [{slots}, {num_k_heads}, {ns}, {k_dim}], "
                     f"u [{slots}, {num_v_heads}, {ns}, {v_dim}] and G, len, base")
        z = lambda *s, dt=dtype: torch.zeros(*s, dtype=dt, device=dev)  # noqa: E731
        return cls(k=z(slots, num_k_heads, ns, k_dim), u=z(slots, num_v_heads, ns, v_dim),
                   G=z(slots, num_v_heads, ns, dt=torch.float32),
                   len=z(slots, dt=torch.int32), base=z(slots, dt=torch.int32), length=length)

    @property
    def slots(self) -> int:
        return self.u.shape[0]

    @property
    def num_k_heads(self) -> int:
        return self.k.shape[1]

    @property
    def num_v_heads(self) -> int:
        return self.u.shape[1]

    @property
    def k_dim(self) -> int:
        return self.k.shape[3]

    @property
    def v_dim(self) -> int:
        return self.u.shape[3]

    @property
    def dtype(self) -> torch.dtype:
        return self.u.dtype

    @property
    def device(self) -> torch.device:
        return self.u.device

    @property
    def bytes_per_slot(self) -> int:
        """Bytes the ring holds per slot (rows, ``G``, ``len``, ``base``)."""
        rows = self.k[0].numel() * self.k.element_size() + self.u[0].numel() * self.u.element_size()
        return rows + self.G[0].numel() * 4 + 8

    def reset(self, slots) -> None:
        """Forget the ring of ``slots`` (an int, ints or an index tensor in ``[0, S)``):
        ``len = base = 0`` and its rows zeroed. ``ValueError`` naming ``slots`` otherwise."""
        idx = _checks.index_tensor("slots", slots, self.slots, device=self.device)
        for t in (self.len, self.base, self.k, self.u, self.G):
            t.index_fill_(0, idx, 0)

    def copy_slots(self, src, dst) -> None:
        """Copy the ring of slots ``src`` to slots ``dst`` (rows, ``G``, ``len``, ``base``;
        ``dst`` distinct, none in ``src``): a slot forked from another (prefix caching, a
        forked request) holds the same accepted rows over the same stored state; copy the
        states alongside (``state[dst] = state[src]``). ``ValueError`` naming the argument."""
        s_idx, d_idx = _checks.copy_indices(src, dst, self.slots, self.device)
        for t in (self.len, self.base, self.k, self.u, self.G):
            t[d_idx] = t[s_idx]


def check_ring(name: str, ring, state: torch.Tensor) -> None:
    """``ring`` is a ``GdnRing`` for the V-major ``state [S, HV, vd, kd]`` (slots, heads, dims,
    dtype, device)."""
    if not isinstance(ring, GdnRing):
        raise ValueError(f"{name}: expected a GdnRing, got {type(ring).__name__}")
    S, HV, vd, kd = state.shape
    got = (ring.slots, ring.num_v_heads, ring.v_dim, ring.k_dim)
    if got != (S, HV, vd, kd):
        hint = (" (is it a K-major [S, HV, kd, vd] state? the ring form takes V-major states "
                "only)" if got == (S, HV, kd, vd) else "")
        raise ValueError(f"{name}: ring for (slots, HV, vd, kd) = {got} does not match the "
                         f"V-major state {tuple(state.shape)}{hint}")
    if ring.dtype != state.dtype:
        raise ValueError(f"{name}: ring rows are {ring.dtype}, the state is {state.dtype}: "
                         "build the ring with the state pool's dtype")
    _checks.same_device("state", state, **{f"{name}.u": ring.u})


def _check_dims(state: torch.Tensor, state_layout: str) -> tuple[int, int]:
    if state_layout != "vk":
        raise ValueError(f"state_layout: the ring form runs on a V-major state ('vk', "
                         f"[S, HV, vd, kd]), got {state_layout!r}")
    vd, kd = state.shape[2:]
    lo, hi = RING_HEAD_DIMS
    for what, d in (("kd", kd), ("vd", vd)):
        if d % 16 or not lo <= d <= hi:
            raise ValueError(f"state: head size {what} = {d} is not supported by the ring form "
                             f"(multiples of 16 in [{lo}, {hi}]: tl.dot tiles)")
    return kd, vd


def _check_verify(state, ring, q, k, v, g, beta, slot_tab, scale, validate, state_layout,
                  gating, use_qk_l2norm):
    check_state("state", state)
    kd, vd = _check_dims(state, state_layout)
    check_ring("ring", ring, state)
    _checks.flag("validate", validate)
    _checks.flag("use_qk_l2norm", use_qk_l2norm)
    S, HV = state.shape[:2]
    dev = state.device
    _checks.tensor("q", q, ndim=4, dtype=_checks.FLOAT_DTYPES, device=dev, last_contiguous=True)
    B, K, HK = q.shape[:3]
    _checks.tensor("q", q, shape=(B, K, ring.num_k_heads, kd))
    _checks.tensor("k", k, shape=(B, K, HK, kd), dtype=q.dtype, like="q", device=dev, last_contiguous=True)
    _checks.tensor("v", v, shape=(B, K, HV, vd), dtype=q.dtype, like="q", device=dev, last_contiguous=True)
    if gating is None:
        for name, t in (("g", g), ("beta", beta)):
            _checks.tensor(name, t, shape=(B, K, HV), dtype=torch.float32, device=dev,
                           last_contiguous=True)
    else:
        check_gating(gating, (B, K), HV, q.dtype, dev)
    _checks.tensor("slot_tab", slot_tab, shape=(B,), dtype=INDEX_DTYPES, device=dev,
                   contiguous=True)
    if not 1 <= K <= min(ring.length, RING_MAX_ROWS):
        raise ValueError(f"q: K = {K} draft rows must lie in [1, min(R = {ring.length}, "
                         f"{RING_MAX_ROWS})]")
    if B > S:
        raise ValueError(f"slot_tab: {B} sequences but only {S} slots")
    # the state (at a fold) and the ring's rows are written while the inputs, the slot table
    # and the cursors are read
    _checks.apart({"state": state, "ring.k": ring.k, "ring.u": ring.u, "ring.G": ring.G},
                  {"q": q, "k": k, "v": v, **gate_inputs(g, beta, gating),
                   "slot_tab": slot_tab, "ring.len": ring.len, "ring.base": ring.base})
    _host_slots(slot_tab, S)
    _host_cursors(ring, slot_tab)
    scale = _checks.optional_float("scale", scale)
    if validate:
        _checks.indices_values("slot_tab", slot_tab, S, padding=True)
        lanes = slot_tab >= 0
        live = slot_tab[lanes].long()
        _checks.range_values("ring.len", ring.len[live], 0, ring.length)
        _checks.range_values("ring.base", ring.base[live], 0, 2 * ring.length - 1)
        if gating is None:        # padding lanes' gates are never used: not checked
            _checks.range_values("g", g[lanes], float("-inf"), 0.0)
            _checks.range_values("beta", beta[lanes], 0.0, 1.0)
        rows, heads = gate_groups(g, beta, gating)
        _checks.finite_inputs({"q": q, "k": k, "v": v, **rows}, lanes, heads)
        _checks.finite_slots("state", state, live)
        _finite_window("ring", ring, live)
    return B, K, kd ** -0.5 if scale is None else scale


def _finite_window(name: str, ring: GdnRing, slots: torch.Tensor) -> None:
    """``validate=True``'s finite rule on the rows a launch reads from a ring: each listed
    slot's window (``len`` rows from ``base``, mod ``2R``): ``k`` and ``u`` finite, ``G`` not
    NaN (``-inf`` after a row that forgets the history). ``ValueError`` naming ``name``, the
    slot and the row of the window."""
    if slots.numel() == 0:
        return
    ns = 2 * ring.length
    pos = (torch.arange(ns, device=slots.device)[None, :] - ring.base[slots].long()[:, None]) % ns
    in_window = pos < ring.len[slots].long()[:, None]                       # [n, NS]
    for part, t in (("k", ring.k), ("u", ring.u), ("G", ring.G)):
        sub = t[slots]
        sub = sub[..., None] if part == "G" else sub                        # [n, H, NS, d]
        ok = ~torch.isnan(sub) if part == "G" else torch.isfinite(sub)
        bad = ~ok.all(-1).all(1) & in_window
        if bool(bad.any()):
            i, j = (int(x) for x in bad.nonzero()[0])
            val = sub[i, :, j][~ok[i, :, j]][0].item()
            raise ValueError(f"{name}: slot {int(slots[i])}'s row {int(pos[i, j])} holds a "
                             f"non-finite value ({val})")


def _host_slots(slot_tab, S: int) -> None:
    """On the host the slots are checked for free, whatever ``validate`` says: in range (or -1)
    and distinct, since two lanes of one slot would append to the same ring rows and fold the
    same state (``ValueError`` naming ``slot_tab``)."""
    _checks.host_indices("slot_tab", slot_tab, S)
    if _checks.on_host(slot_tab):
        _checks.indices_values("slot_tab", slot_tab, S, padding=True)


def _host_cursors(ring: GdnRing, slot_tab) -> None:
    """On the host (every CPU run) the ring's ``len`` and ``base`` of the live slots address
    memory: checked for free, whatever ``validate`` says (``ValueError`` naming them)."""
    if _checks.on_host(ring.len) and _checks.on_host(slot_tab):
        live = slot_tab[slot_tab >= 0].long()
        _checks.range_values("ring.len", ring.len[live], 0, ring.length)
        _checks.range_values("ring.base", ring.base[live], 0, 2 * ring.length - 1)


def ring_tiles(work: int, state_dtype, kd: int, vd: int) -> tuple[int, int, int, int]:
    """``(BV, BK, num_warps, stages)`` of the ring kernels for ``work = B * HV`` heads of a state
    of ``state_dtype``, from the ``ring_form_tiles`` setting's row
    (``pmll_lab.ops.settings.ring_form_tiles_row``, the measurement behind each row there);
    ``BV`` capped at ``vd``, ``BK`` at ``kd``. ``ValueError`` naming ``state_dtype`` for a
    dtype the table has no rows for."""
    row = settings.ring_form_tiles_row(work, state_dtype)
    return (min(row.block_v, next_power_of_2(vd)), min(row.block_k, next_power_of_2(kd)),
            row.num_warps, row.num_stages)


def gdn_ring_verify(state, ring, q, k, v, g=None, beta=None, *, slot_tab, scale=None,
                    use_qk_l2norm=True, validate=False, state_layout=DEFAULT_STATE_LAYOUT,
                    A_log=None, a=None, dt_bias=None, b=None, impl="triton"):
    """Ring-form verify of ``K`` draft rows per sequence (SPEC §3d; the ReplaySSM design).

    Args:
        state: V-major ``[S, HV, vd, kd]`` fp32, bf16 or fp16, inner dims contiguous; written
            only where the verify folds (``engaged == 2``), rounded once to its dtype.
        ring: the layer's ``GdnRing`` (same slots, heads, dims and dtype); rows
            ``base + len .. + K - 1`` (mod ``2R``) of each live slot are written; ``len`` and
            ``base`` are read, never written (``ring_accept`` commits).
        q, k: ``[B, K, HK, kd]``; v: ``[B, K, HV, vd]`` (one float dtype, last dim contiguous);
            ``1 <= K <= min(R, 8)``.
        g, beta: ``[B, K, HV]`` fp32 (``g <= 0`` the log decay, ``0 <= beta <= 1``), or
            ``g=beta=None`` with ``A_log, dt_bias [HV]``,
            ``a, b [B, K, HV]``: the gating computed in the kernel (SPEC §2 "Gating").
        slot_tab: ``[B]`` int32/int64 slots, distinct; -1 marks a padding lane (zero outputs,
            ``engaged`` 1, nothing read or written).
        scale: query scale (default ``kd ** -0.5``); use_qk_l2norm: l2-normalise q and k.
        validate: also check (with a device sync; ``pmll_lab._checks``; docs/layouts.md,
            "validate=True") slots (in range, distinct), ``0 <= len <= R``, ``base < 2R``, the
            gates' ranges, and that the live lanes' inputs, the states read and the rings' live rows
            are finite. With the slot table on the host (every CPU run) the slots and cursors are
            checked whatever ``validate`` says.
        state_layout: ``"vk"`` only (the default of every GDN launcher).
        impl: ``"triton"`` only (the ring form has no CUDA twin).

    Returns ``(o [B, K, HV, vd] in v's dtype, engaged [B] int32)``: 2 where the verify folded.
    Raises ``ValueError`` naming the argument (shapes, dtypes, devices, ``K > R``, head sizes
    that are not multiples of 16 in ``[16, 256]``, a K-major state where ``kd != vd``: a square
    K-major state cannot be told from its shape). The float64 references
    (``pmll_lab.reference.ring.verify``, ``reference.carry``) take K-major states:
    ``state.double().transpose(-1, -2)``.
    """
    _checks.impl("gdn_ring_verify", impl)
    g, beta, gating = split_gating(g, beta, A_log, a, dt_bias, b)
    B, K, scale = _check_verify(state, ring, q, k, v, g, beta, slot_tab, scale, validate,
                                state_layout, gating, use_qk_l2norm)
    S, HV, vd, kd = state.shape
    o = torch.empty(B, K, HV, vd, dtype=v.dtype, device=v.device)
    engaged = _checks.engaged_flags(B, K, v.device)
    if B == 0:
        return o, engaged
    gate = (gating.A_log, gating.dt_bias) if gating is not None else (state, state)
    BV, BK, warps, stages = ring_tiles(B * HV, state.dtype, kd, vd)
    early = BV >= vd and state.element_size() <= settings.ring_form().ring_coefficients_first
    with device_guard(state):
        gdn_ring_fused_kernel[(B * HV * cdiv(vd, BV),)](
            state, ring.k, ring.u, ring.G, ring.len, ring.base, slot_tab, q, k, v, o, g, beta,
            engaged, *gate, scale, state.stride(0), ring.k.stride(0), ring.u.stride(0),
            ring.G.stride(0), q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1),
            k.stride(2), v.stride(0), v.stride(1), v.stride(2), o.stride(0), o.stride(1),
            o.stride(2), g.stride(0), g.stride(1), beta.stride(0), beta.stride(1),
            K=K, R=ring.length, NS=2 * ring.length, RW=max(16, ring.length), HV=HV,
            HK=ring.num_k_heads, KD=kd, KP=next_power_of_2(kd), VD=vd, BK=BK, BV=BV,
            NT=cdiv(vd, BV), STAGES=stages, USE_QK_L2NORM=bool(use_qk_l2norm),
            GATE=gating is not None, SMALL=SMALL_PRODUCTS[str(state.dtype).split(".")[1]],
            FBK=min(BK, settings.ring_form().ring_fold_chunk or BK), EARLY=early,
            num_warps=warps)
    return o, engaged


def _ring_list(rings) -> list[GdnRing]:
    rings = list(rings) if isinstance(rings, (list, tuple)) else [rings]
    if not rings:
        raise ValueError("rings: empty list")
    for i, r in enumerate(rings):
        if not isinstance(r, GdnRing):
            raise ValueError(f"rings[{i}]: expected a GdnRing, got {type(r).__name__}")
        if (r.slots, r.length) != (rings[0].slots, rings[0].length):
            raise ValueError(f"rings[{i}]: slots/length differ from rings[0]")
        _checks.same_device("rings[0].len", rings[0].len, **{f"rings[{i}].len": r.len})
    return rings


def ring_accept(rings, slot_tab, engaged, accepted, *, rows=None, validate=False,
                impl="triton") -> None:
    """The cursor commit after a ring verify, on the device with no host sync (SPEC §3d):
    ``base = (base + len) % 2R, len = a`` where the verify folded (``engaged == 2``), else
    ``len += a``, for one ring or a list (one launch; e.g. every layer of a step).

    ``slot_tab [B]``, ``engaged [B]`` int32 as the verify returned it, ``accepted [B]``
    int32/int64 (``0 <= a <= K``), all contiguous on the rings' device. ``rows``: the verify's
    ``K``; default: the ``K`` of the verify that returned ``engaged`` (its flags carry it), so
    ``a <= K`` is checked with the rest (with neither only ``a <= R`` can be: an ``a`` above
    ``K`` would take rows the verify never wrote into the window). ``validate=True``
    checks slots, ``engaged`` in {1, 2}, the accepted counts and that no ``len`` leaves
    ``[0, R]`` (a sync); with every table on the host (every CPU run) the same checks run
    whatever ``validate`` says. ``impl``: ``"triton"`` only. Raises ``ValueError`` naming the
    argument."""
    _checks.impl("ring_accept", impl)
    rings = _ring_list(rings)
    dev = rings[0].device
    _checks.tensor("slot_tab", slot_tab, ndim=1, dtype=INDEX_DTYPES, device=dev, contiguous=True)
    B = slot_tab.shape[0]
    _checks.tensor("engaged", engaged, shape=(B,), dtype=torch.int32, device=dev, contiguous=True)
    _checks.tensor("accepted", accepted, shape=(B,), dtype=INDEX_DTYPES, device=dev,
                   contiguous=True)
    _checks.flag("validate", validate)
    if rows is not None:
        _checks.positive_int("rows", rows, maximum=rings[0].length)
    rows = _checks.accepted_bound(rows, engaged)
    if B > rings[0].slots:
        raise ValueError(f"slot_tab: {B} sequences but only {rings[0].slots} slots")
    # every ring's cursors are written while the tables are read
    _checks.apart({**{f"rings[{i}].len": r.len for i, r in enumerate(rings)},
                   **{f"rings[{i}].base": r.base for i, r in enumerate(rings)}},
                  {"slot_tab": slot_tab, "engaged": engaged, "accepted": accepted})
    _host_slots(slot_tab, rings[0].slots)
    if validate or all(_checks.on_host(t) for t in (slot_tab, engaged, accepted, rings[0].len)):
        _checks.indices_values("slot_tab", slot_tab, rings[0].slots, padding=True)
        _checks.range_values("engaged", engaged, 1, 2)
        live = slot_tab >= 0
        for i, r in enumerate(rings):
            n = r.len[slot_tab[live].long()]
            acc = accepted[live].to(torch.int32)
            _checks.range_values("accepted", acc, 0, r.length if rows is None else rows)
            after = torch.where(engaged[live] == 2, acc, n + acc)
            _checks.range_values(f"rings[{i}].len after accept", after, 0, r.length)
    if B == 0:
        return
    lens, bases = [r.len for r in rings], [r.base for r in rings]
    with device_guard(lens[0]):
        ring_accept_kernel[(cdiv(B, 128), len(rings))](
            lens[0], bases[0], offsets_table(lens), offsets_table(bases), slot_tab, engaged,
            accepted, B, NS=2 * rings[0].length, BLOCK=128)


def gdn_ring_flush(states, rings, slot_tab, *, validate=False,
                   state_layout=DEFAULT_STATE_LAYOUT, impl="triton") -> None:
    """Fold every listed slot's ring into its state (``H0 <- H_P``, rounded once), over ``L`` layers
    in one launch (SPEC §3d "Flush"). ``states``: ``L`` V-major states (same shape, strides and
    dtype), ``rings``: ``L`` ``GdnRing`` (same length), ``slot_tab [B]``. ``len`` is left for the
    caller to clear (``ring.len[slots] = 0``). ``validate=True`` (a sync; ``pmll_lab._checks``;
    docs/layouts.md, "validate=True"): slots in range and distinct, ``0 <= len <= R``, the states
    and the rings' live rows read finite. ``impl``: ``"triton"`` only. Raises ``ValueError`` naming
    the argument."""
    _checks.impl("gdn_ring_flush", impl)
    if isinstance(states, torch.Tensor) or isinstance(rings, GdnRing):
        raise ValueError("states, rings: pass lists (one entry per layer)")
    states, rings = list(states), _ring_list(rings)
    if len(states) != len(rings):
        raise ValueError(f"rings: need one per state, got {len(rings)} rings for {len(states)} states")
    for i, (st, r) in enumerate(zip(states, rings)):
        check_state(f"states[{i}]", st)
        _check_dims(st, state_layout)
        check_ring(f"rings[{i}]", r, st)
        if r.num_k_heads != rings[0].num_k_heads:     # one launch takes rings[0]'s HK, strides
            raise ValueError(f"rings[{i}]: {r.num_k_heads} key heads, rings[0] has "
                             f"{rings[0].num_k_heads} (one flush launch serves layers of one "
                             "shape)")
        if st.shape != states[0].shape or st.stride() != states[0].stride() \
                or st.dtype != states[0].dtype:
            raise ValueError(f"states[{i}]: shape/strides/dtype differ from states[0]")
    S, HV, vd, kd = states[0].shape
    _checks.tensor("slot_tab", slot_tab, ndim=1, dtype=INDEX_DTYPES, device=states[0].device,
                   contiguous=True)
    B = slot_tab.shape[0]
    if B > S:
        raise ValueError(f"slot_tab: {B} sequences but only {S} slots")
    _checks.flag("validate", validate)
    # every layer's state is written while every ring and the slot table are read
    _checks.apart({f"states[{i}]": st for i, st in enumerate(states)},
                  {"slot_tab": slot_tab,
                   **{f"rings[{i}].{a}": getattr(r, a) for i, r in enumerate(rings)
                      for a in ("k", "u", "G", "len", "base")}})
    _host_slots(slot_tab, S)
    for r in rings:
        _host_cursors(r, slot_tab)
    if validate:
        _checks.indices_values("slot_tab", slot_tab, S, padding=True)
        live = slot_tab[slot_tab >= 0].long()
        for i, r in enumerate(rings):
            _checks.range_values(f"rings[{i}].len", r.len[live], 0, r.length)
        for i, (st, r) in enumerate(zip(states, rings)):
            _checks.finite_slots(f"states[{i}]", st, live)
            _finite_window(f"rings[{i}]", r, live)
    if B == 0:
        return
    BV, BK, warps, stages = ring_tiles(B * HV, states[0].dtype, kd, vd)
    r0 = rings[0]
    with device_guard(states[0]):
        gdn_ring_flush_kernel[(B * HV * cdiv(vd, BV), len(states))](
            states[0], r0.k, r0.u, r0.G, r0.len, r0.base, slot_tab,
            offsets_table(states), offsets_table([r.k for r in rings]),
            offsets_table([r.u for r in rings]), offsets_table([r.G for r in rings]),
            offsets_table([r.len for r in rings]), offsets_table([r.base for r in rings]),
            states[0].stride(0), r0.k.stride(0), r0.u.stride(0), r0.G.stride(0),
            NS=2 * r0.length, RP=max(16, r0.length), HV=HV, HK=r0.num_k_heads, KD=kd, VD=vd,
            BK=BK, BV=BV, NT=cdiv(vd, BV), STAGES=stages,
            SMALL=SMALL_PRODUCTS[str(states[0].dtype).split(".")[1]], num_warps=warps)
