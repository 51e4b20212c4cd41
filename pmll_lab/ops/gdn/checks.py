"""Argument checks of GDN decode and the chain (``pmll_lab.ops.gdn.decode``; SPEC §2, §3a, §3
"Bad input"): shapes, dtypes, devices, strides, buffers that must not share memory, slot tables
on the host, and the value checks of ``validate=True``. Every check raises ``ValueError``
naming the argument, before any kernel runs.
"""

from __future__ import annotations

import torch

from pmll_lab import _checks
from pmll_lab.backend import DEVICE
from pmll_lab.ops.gdn.gating import Gating, check_gating, gate_groups, gate_inputs
from pmll_lab.ops.gdn.recurrence import check_layout, head_dims

MAX_ROWS = 8
"""Most rows one chain launch verifies (SPEC §3: ``K <= CAP``, ``CAP = 8``)."""


def check_decode_args(state, q, k, v, g, beta, state_indices, intermediate, scale, out_dtype,
                      validate, *, rows: bool, layout: str, out_state_indices=None,
                      gating: Gating | None = None, use_qk_l2norm=True, carry=None):
    """Validate a decode (``rows=False``) or chain (``rows=True``) call; return its sizes
    ``(B, K, HK, HV, kd, vd)`` (``K = 1`` for a decode).

    Arguments as ``gdn_decode`` / ``gdn_chain`` take them (``layout`` their ``state_layout``,
    ``gating`` the fused gating of ``split_gating`` or ``None``): shapes, dtypes, devices,
    strides, buffers apart, host slot tables, and the value checks with ``validate=True``.
    Raises ``ValueError`` naming the argument. One place for the calls and their plans
    (``pmll_lab.ops.gdn.decode``), so a plan refuses exactly what a call refuses."""
    C = _checks
    C.flag("use_qk_l2norm", use_qk_l2norm)
    C.flag("validate", validate)
    check_layout("state_layout", layout)
    C.tensor("state", state, ndim=4, dtype=C.FLOAT_DTYPES, last_contiguous=True)
    C.no_overlap("state", state)
    if state.device.type != DEVICE.type:
        raise ValueError(f"state: on {state.device}, but kernels run on {DEVICE} "
                         "(pmll_lab.backend.DEVICE)")
    S, HV = state.shape[:2]
    kd, vd = head_dims(state.shape, layout)
    if min(HV, kd, vd) < 1:
        raise ValueError(f"state: heads HV and head sizes kd, vd (dims 1-3) must be >= 1, got "
                         f"shape {tuple(state.shape)}")
    nd = 4 if rows else 3
    C.tensor("q", q, ndim=nd, dtype=C.FLOAT_DTYPES, last_contiguous=True)
    lead = tuple(q.shape[:nd - 2])                      # (B,) or (B, K)
    HK = q.shape[-2]
    if q.shape[-1] != kd:
        raise ValueError(f"q: key head size {q.shape[-1]} differs from state's kd = {kd} "
                         f"(state shape {tuple(state.shape)} read as state_layout={layout!r})")
    if rows and not 1 <= lead[1] <= MAX_ROWS:
        raise ValueError(f"q: rows per sequence K (dim 1) must lie in [1, {MAX_ROWS}], "
                         f"got {lead[1]}")
    if HK < 1 or HV % HK != 0:
        raise ValueError(f"q: value heads HV = {HV} (state dim 1) must be a multiple of key "
                         f"heads HK = {HK} (q dim {nd - 2})")
    C.tensor("k", k, shape=q.shape, dtype=q.dtype, like="q", last_contiguous=True)
    C.tensor("v", v, shape=(*lead, HV, vd), dtype=q.dtype, like="q", last_contiguous=True)
    if gating is None:
        C.tensor("g", g, shape=(*lead, HV), dtype=torch.float32, last_contiguous=True)
        C.tensor("beta", beta, shape=(*lead, HV), dtype=torch.float32, last_contiguous=True)
    else:
        check_gating(gating, lead, HV, q.dtype, state.device)
    C.same_device("state", state, q=q, k=k, v=v, g=g, beta=beta, state_indices=state_indices,
                  intermediate=intermediate, out_state_indices=out_state_indices)
    B = lead[0]
    if state_indices is not None:
        # the kernel reads entry b at offset b: a strided view would address other slots
        C.tensor("state_indices", state_indices, shape=(B,), dtype=(torch.int32, torch.int64),
                 contiguous=True)
        if B > S:
            raise ValueError(f"state_indices: {B} sequences but only {S} state slots")
    elif B > S:
        raise ValueError(f"state_indices: None means slots arange(B), but B = {B} > S = {S} "
                         "state slots")
    if out_state_indices is not None:
        C.tensor("out_state_indices", out_state_indices, shape=(B,),
                 dtype=(torch.int32, torch.int64), contiguous=True)
    if intermediate is not None:
        C.tensor("intermediate", intermediate, shape=(B, lead[1] - 1, *state.shape[1:]),
                 dtype=state.dtype, last_contiguous=True)
        C.no_overlap("intermediate", intermediate)
    C.optional_float("scale", scale)
    if out_dtype is not None:
        C.choice("out_dtype", out_dtype, [None, *C.FLOAT_DTYPES])
    # the state and the snapshots are written while every row input is still read
    C.apart({"state": state, "intermediate": intermediate},
            {"q": q, "k": k, "v": v, **gate_inputs(g, beta, gating),
             "state_indices": state_indices, "out_state_indices": out_state_indices})
    # slots on the host (every CPU run): a slot out of range is refused whatever `validate`
    # says (the kernel would address memory outside the state); free there, a sync on a GPU
    C.host_indices("state_indices", state_indices, S)
    C.host_indices("out_state_indices", out_state_indices, S)
    if C.on_host(out_state_indices) and (state_indices is None or C.on_host(state_indices)):
        _check_write_slots(state_indices, out_state_indices, B, S)
    if carry is not None:
        C.tensor("carry.pend", getattr(carry, "pend", None), shape=(S,), dtype=torch.int32,
                 device=state.device)
    if validate:
        if state_indices is not None:
            C.indices_values("state_indices", state_indices, S, padding=True)
        if out_state_indices is not None:
            _check_write_slots(state_indices, out_state_indices, B, S)
        live = _live_lanes(state_indices, out_state_indices)
        if gating is None:        # padding lanes' gates are never used: not checked
            C.range_values("g", g if live is None else g[live], -float("inf"), 0.0)
            C.range_values("beta", beta if live is None else beta[live], 0.0, 1.0)
        lanes, heads = gate_groups(g, beta, gating)
        C.finite_inputs({"q": q, "k": k, "v": v, **lanes}, live, heads)
        C.finite_slots("state", state, C.live_slots(state_indices, B, state.device))
        if carry is not None:
            C.nothing_pending("carry.pend", carry.pend, state_indices, B)
            if out_state_indices is not None:     # a fork's target: its own rows are stale
                C.nothing_pending("carry.pend", carry.pend, out_state_indices, B, written=True)
    return B, (lead[1] if rows else 1), HK, HV, kd, vd


def _live_lanes(state_indices, out_state_indices):
    """``[B]`` bool of the lanes that are not padding (read and write slot >= 0), or ``None``
    when no index table marks any (every lane live)."""
    live = None
    for idx in (state_indices, out_state_indices):
        if idx is not None:
            live = idx >= 0 if live is None else live & (idx >= 0)
    return live


def _check_write_slots(state_indices, out_state_indices, B: int, S: int) -> None:
    """``validate`` of ``out_state_indices``: entries in ``[0, S)`` and distinct, or -1 exactly
    where the read slot is -1 (a padding lane), and no lane writes a slot another lane reads
    (a lane may write its own read slot: in place). One device sync."""
    read = (torch.arange(B, device=out_state_indices.device) if state_indices is None
            else state_indices.long())
    write = out_state_indices.long()
    _checks.indices_values("out_state_indices", write, S, padding=True)
    pad_r, pad_w = read < 0, write < 0
    if bool((pad_r != pad_w).any()):
        b = int((pad_r != pad_w).nonzero()[0])
        raise ValueError(f"out_state_indices: lane {b} is a padding lane (-1) in only one of "
                         f"state_indices ({int(read[b])}) and out_state_indices ({int(write[b])})")
    lanes = torch.arange(B, device=read.device)
    reader = torch.full((S,), -1, dtype=torch.int64, device=read.device)
    live = ~pad_r
    reader[read[live]] = lanes[live]
    who = reader[write[live]]
    clash = (who >= 0) & (who != lanes[live])
    if bool(clash.any()):
        i = int(clash.nonzero()[0])
        b, other = int(lanes[live][i]), int(who[i])
        raise ValueError(f"out_state_indices: lane {b} writes slot {int(write[live][i])}, which "
                         f"lane {other} reads (read and write slots may overlap only "
                         "lane-to-itself)")
