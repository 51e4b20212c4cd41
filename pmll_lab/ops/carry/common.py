"""Pieces shared by the carried-state GDN launchers (verify, flush, accept; SPEC §3b): the
argument checks and the per-layer offset tables of the multi-layer launches (the device guard is
``pmll_lab.ops.launch.device_guard``, the V-major key chunks ``recurrence.vk_chunk_meta``).

Every check raises ``ValueError`` naming the argument, before any kernel runs.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from pmll_lab import _checks
from pmll_lab.backend import DEVICE
from pmll_lab.ops.carry.stash import GdnCarry
from pmll_lab.ops.gdn.gating import check_gating, gate_groups, gate_inputs
from pmll_lab.ops.gdn.recurrence import DEFAULT_STATE_LAYOUT, check_layout, head_dims

FORMS = ("exact",)
"""Forms of ``gdn_carry_verify``: the exact form only (bitwise equal to decoding). The tolerance
form of the carried state is the ring form, ``pmll_lab.ops.carry.ring``."""
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


def check_state(name: str, state) -> torch.Tensor:
    """fp32, bf16 or fp16 ``[S, HV, kd, vd]`` (or ``[S, HV, vd, kd]``) on the kernels' device
    type, inner three dims contiguous (any slot stride that keeps slots apart)."""
    _checks.tensor(name, state, ndim=4, dtype=_checks.FLOAT_DTYPES)
    if state.device.type != DEVICE.type:
        raise ValueError(f"{name}: on {state.device}, but kernels run on {DEVICE} (pmll_lab.backend.DEVICE)")
    _, HV, d2, d3 = state.shape
    if min(HV, d2, d3) < 1:
        raise ValueError(f"{name}: heads HV and head sizes (dims 1-3) must be >= 1, got "
                         f"shape {tuple(state.shape)}")
    if state.stride()[1:] != (d2 * d3, d3, 1) and state.numel() > 0:
        raise ValueError(f"{name}: inner three dims must be contiguous, got strides {state.stride()}")
    _checks.no_overlap(name, state)
    return state


def check_form(name: str, form, options: Sequence[str] = FORMS) -> None:
    """``form`` is one of ``options``; ``"wy"`` gets its own message: the tolerance form of the
    carried state is the ring form (``pmll_lab.ops.carry.ring``), a launcher of its own."""
    if form == "wy":
        raise ValueError(f"{name}: 'wy' is not a form of the carried-state verify (forms: "
                         f"{list(options)}); the tolerance form is the ring form, "
                         "pmll_lab.ops.carry.ring (GdnRing, gdn_ring_verify)")
    _checks.choice(name, form, options)


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


def check_host_slots(name: str, slot_tab, carries) -> None:
    """On the host (every CPU run; free there, a sync on a GPU, where ``validate=True`` runs
    the same checks): ``slot_tab`` entries in ``[0, S)`` or -1, and the pending count of each
    of those slots in ``[0, CAP]`` for every ``(label, carry)`` of ``carries`` (``.pend [S]``,
    ``.cap``). A kernel given a slot out of range, or told to fold more rows than the stash
    holds, addresses memory outside its buffers. ``ValueError`` naming the argument."""
    if not _checks.on_host(slot_tab) or not carries:
        return
    S = min(c.pend.shape[0] for _, c in carries)
    _checks.host_indices(name, slot_tab, S)
    live = slot_tab[slot_tab >= 0].long()
    for label, c in carries:
        if _checks.on_host(c.pend):
            _checks.range_values(label, c.pend[live], 0, c.cap)


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

