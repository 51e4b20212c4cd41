"""Carried-state verify of K draft rows: public API (SPEC §3b, §3c; seed ``001_…txt``).

Speculative decoding verifies ``K`` draft rows per sequence and later accepts ``a <= K`` of them.
The snapshot chain (``pmll_lab.gdn.gdn_chain``) keeps the state after every row. The carried
state instead stashes, per row, what replays it (``u_t``, ``g_t``, ``k_t``; the conv twin: the
input row) and counts the accepted rows not yet folded in ``pend[slot]``; the next verify (or a
flush) folds them. Launchers:

- ``GdnCarry`` (one layer's stash + ``pend``), ``gdn_carry_verify`` (exact form, eager or lazy), ``gdn_carry_verify_plan`` (the same bound to fixed buffers, a lean call for small
  batches: ``pmll_lab.ops.launch.LaunchPlan``), ``gdn_carry_flush`` (``L`` layers, one
  launch): ``pmll_lab.ops.carry.exact`` (the stash, the flush and accept in
  ``pmll_lab.ops.carry.stash``).
- ``GdnRing`` (one layer's ring: the accepted rows' keys, corrections and cumulative decays,
  ``R`` per slot), ``gdn_ring_verify`` (the ring form, SPEC §3d: the stored state read-only, a
  tolerance form), ``ring_accept`` (commit ``a`` rows, on the device), ``gdn_ring_flush`` (fold
  every ring into its state, ``L`` layers in one launch), ``RING_TOLERANCE``:
  ``pmll_lab.ops.carry.ring``; a worked example against float64 decoding:
  ``docs/ring-form.md``.
- ``ConvCarry``, ``conv_carry_verify``, ``conv_carry_flush``: the conv twin
  (``pmll_lab.ops.conv.carry``, also public through ``pmll_lab.conv``).
- ``carry_accept``: ``pend = a`` after a write-back (``engaged == 2``), else ``pend + a``, on the
  device, for one carry or a whole stack in one launch (GDN and conv carries alike).
- ``carry_accept_spec``: the commit of a verify with the speculative store
  (``gdn_carry_verify(..., spec_slot_tab=...)``): a sequence that accepted all ``K`` rows swaps
  to its spare slot, which holds that state, and has nothing pending.
- ``gdn_carry_verify(..., impl="cuda")`` and ``gdn_carry_flush(..., impl="cuda")``: the CUDA C++
  twins on a V-major state (``kernels/gdn_carry.cu``, ``pmll_lab.ops.carry.cuda``),
  bitwise the CUDA decode twin's launches of the accepted rows; ``RuntimeError`` without a GPU.
- ``SpecDecodeStep``: a host-side driver for a stack of layers that applies the seed's policy
  (lazy from ``lazy_min_seqs`` sequences; an eager verify folds at most ``eager_max_pending``
  rows, so a slot holding more is flushed first): ``pmll_lab.serving.spec_decode_step``;
  ``CarryLayer``, one layer of the stack: ``pmll_lab.serving.carry_layer``.

**Never run a plain decode or chain on a slot with pending rows.** While ``pend[slot] > 0`` the
stored state (and conv window) of that slot lags its sequence by the accepted rows in the stash;
``pmll_lab.gdn.gdn_decode`` / ``gdn_chain`` and ``pmll_lab.conv.conv_update`` / ``conv_chain``
read the stored state only, so they would silently give wrong outputs and a wrong state. Fold
first (``gdn_carry_flush`` / ``conv_carry_flush``, then clear ``pend``; ``SpecDecodeStep.flush``
does both) or keep verifying with the carry. Passed as ``carry=`` with ``validate=True``, those
launchers refuse such a slot.

**A fork copies the pending rows too.** A slot copied for prefix caching or a forked request
while it holds pending rows needs its stash and ``pend`` copied with its state:
``SpecDecodeStep.copy_slots`` copies every layer's slot whole (``GdnCarry``, ``ConvCarry`` and
``GdnRing`` each have ``copy_slots`` for their part); a decode forking into a slot
(``out_state_indices``) is refused by ``validate=True`` where that slot still holds rows.

**A verify stopped part-way** (Ctrl-C in the interpreter, a killed kernel) leaves the split
verify's arrival counts above zero: ``GdnCarry.reset`` and ``SpecDecodeStep.abort`` / ``reset``
zero them; ``abort`` says which slots it could not keep (a write-back half done).

The float64 reference of the protocol is ``pmll_lab.reference.carry``.
"""

from __future__ import annotations

from pmll_lab.ops.carry.exact import gdn_carry_verify, gdn_carry_verify_plan
from pmll_lab.ops.carry.common import FORMS, INDEX_DTYPES, check_form, check_state  # noqa: F401
from pmll_lab.ops.carry.stash import (GDN_CARRY_CAP, GdnCarry, carry_accept,  # noqa: F401
                                      carry_accept_spec,
                                      check_carry, gdn_carry_flush, snapshot_bytes_per_slot,
                                      stash_bytes_per_slot)
from pmll_lab.ops.carry.ring import (  # noqa: F401
    RING_DEFAULT_LENGTH, RING_LENGTHS, RING_TOLERANCE, GdnRing, gdn_ring_flush, gdn_ring_verify,
    ring_accept)
from pmll_lab.ops.conv.carry import ConvCarry, conv_carry_flush, conv_carry_verify
from pmll_lab.ops.gdn.recurrence import DEFAULT_STATE_LAYOUT, STATE_LAYOUTS  # noqa: F401
from pmll_lab.serving.carry_layer import CarryLayer
from pmll_lab.serving.spec_decode_step import (  # noqa: F401
    GDN_CARRY_EAGER_MAX_PENDING, GDN_CARRY_LAZY_MIN_SEQS, SpecDecodeStep)

__all__ = [
    "GDN_CARRY_CAP", "GDN_CARRY_LAZY_MIN_SEQS", "STATE_LAYOUTS", "GDN_CARRY_EAGER_MAX_PENDING",
    "GdnCarry", "gdn_carry_verify", "gdn_carry_verify_plan", "gdn_carry_flush", "carry_accept",
    "carry_accept_spec",
    "ConvCarry", "conv_carry_verify", "conv_carry_flush",
    "GdnRing", "gdn_ring_verify", "ring_accept", "gdn_ring_flush", "RING_TOLERANCE",
    "CarryLayer", "SpecDecodeStep", "stash_bytes_per_slot", "snapshot_bytes_per_slot",
]
