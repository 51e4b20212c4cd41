"""One layer's carried-state GDN stash and pending counts (``GdnCarry``; SPEC §3b). The bytes
per slot of the stash and of the snapshot chain it replaces (SPEC §3a) are
``pmll_lab.sizes``'s, re-exported here.

The stash layout (the seed's ``vn | g | sk`` rows, ``CAP`` of them per slot) is given on
``GdnCarry``; how the verify, flush and accept kernels read and write it is in the module
docstrings of ``pmll_lab.ops.carry.exact`` (verify) and
``pmll_lab.ops.carry.gdn_carry_pending`` (flush, accept).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pmll_lab import _checks
from pmll_lab.backend import DEVICE
from pmll_lab.ops.gdn.recurrence import DEFAULT_STATE_LAYOUT, check_layout
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

