"""Pieces shared by every carried-state GDN launcher, exact and ring forms alike (SPEC §3b, §3d):
the state's and the form's checks, the host-side slot check and the per-layer offset tables of the
multi-layer launches (the device guard is ``pmll_lab.ops.launch.device_guard``, the V-major key
chunks ``recurrence.vk_chunk_meta``). The stash's own check (``check_carry``) is with
``GdnCarry`` in ``pmll_lab.ops.carry.stash``; the exact verify's argument checks
(``check_verify``) with its launchers in ``pmll_lab.ops.carry.exact``.

Every check raises ``ValueError`` naming the argument, before any kernel runs.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from pmll_lab import _checks
from pmll_lab.backend import DEVICE

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


def check_spare_slots(name: str, spec_slot_tab, slot_tab, slots: int, validate: bool) -> None:
    """The speculative store's spare slots (``gdn_carry_verify(spec_slot_tab=...)``,
    ``carry_accept_spec``): ``[B]`` int32/int64 like ``slot_tab``, contiguous, another tensor;
    and, with ``validate`` or both tables on the host (free there), entries in ``[0, slots)``
    or -1 (no spare: that lane stores nothing and commits as the lazy form), distinct, none of
    them a live slot of ``slot_tab`` (the store would overwrite a live state). ``ValueError``
    naming ``name``."""
    _checks.tensor(name, spec_slot_tab, shape=tuple(slot_tab.shape), dtype=INDEX_DTYPES,
                   device=slot_tab.device, contiguous=True)
    if spec_slot_tab.data_ptr() == slot_tab.data_ptr():
        raise ValueError(f"{name}: must be another tensor than slot_tab (the spare slots)")
    if not (validate or (_checks.on_host(spec_slot_tab) and _checks.on_host(slot_tab))):
        return
    _checks.indices_values(name, spec_slot_tab, slots, padding=True)
    live = slot_tab >= 0
    spare = spec_slot_tab[spec_slot_tab >= 0]
    if bool(torch.isin(spare, slot_tab[live].to(spare.dtype)).any()):
        raise ValueError(f"{name}: a spare slot is also a slot of slot_tab")
