"""The ring form (SPEC §3d) in a serving stack: ``RingLayer`` (one GDN layer with its conv) and
``RingStep``, the host-side driver of a step over all layers.

Why its own driver: the ring form keeps the stored state read-only during a verify and the
accepted rows in a ring (``GdnRing``) until a fold, so a step's bookkeeping differs from the
exact carry's (``SpecDecodeStep``): the verify folds by itself when ``len + K > R``, the commit
is ``ring_accept``. The conv before each GDN layer keeps the exact conv carry (SPEC §3c; the
ring form has no conv of its own), lazy by default. ``RingStep`` offers ``SpecDecodeStep``'s
interface (``begin``, ``verify_layer``, ``engaged``, ``accept``, ``flush``, ``reset``,
``abort``, ``stats``), so ``pmll_lab.models.cache.ServingCache`` drives either.

A tolerance form: the outputs answer to plain decoding within ``RING_TOLERANCE``, not bitwise.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from pmll_lab import _checks
from pmll_lab.ops.carry.common import check_state
from pmll_lab.ops.carry.stash import carry_accept
from pmll_lab.ops.carry.ring import (RING_MAX_ROWS, GdnRing, check_ring, gdn_ring_flush,
                                         gdn_ring_verify, ring_accept)
from pmll_lab.ops.conv.carry import ConvCarry, conv_carry_flush, conv_carry_verify


@dataclass(eq=False)
class RingLayer:
    """One GDN layer of a ring-form stack: its V-major ``state [S, HV, vd, kd]`` (fp32, bf16 or
    fp16), its ``ring`` (``GdnRing`` of the state's slots, heads, dims and dtype), and the
    causal conv that feeds it: ``conv_state [S, dim, d_conv]``, ``conv_carry`` (``ConvCarry``),
    ``conv_weight [dim, d_conv]``, ``conv_bias [dim]`` or None, ``num_k_heads`` (HK), with
    ``dim = 2*HK*kd + HV*vd`` (q, k, v are views of the conv output, Qwen3-Next's order; the
    GDN kernel l2-normalises q and k). Construction checks the fields (``ValueError`` naming
    the field)."""

    state: torch.Tensor
    ring: GdnRing
    conv_state: torch.Tensor
    conv_carry: ConvCarry
    conv_weight: torch.Tensor
    conv_bias: torch.Tensor | None
    num_k_heads: int

    def __post_init__(self):
        _check_layer("", self)

    def qkv(self, y: torch.Tensor) -> tuple:
        """``q, k [B, K, HK, kd]``, ``v [B, K, HV, vd]``: views of the conv output ``y``."""
        HK, kd = self.num_k_heads, self.ring.k_dim
        HV, vd = self.ring.num_v_heads, self.ring.v_dim
        return (y[..., :HK * kd].unflatten(-1, (HK, kd)),
                y[..., HK * kd:2 * HK * kd].unflatten(-1, (HK, kd)),
                y[..., 2 * HK * kd:].unflatten(-1, (HV, vd)))


def _check_layer(prefix: str, lay: RingLayer) -> None:
    check_state(f"{prefix}state", lay.state)
    check_ring(f"{prefix}ring", lay.ring, lay.state)
    _checks.positive_int(f"{prefix}num_k_heads", lay.num_k_heads)
    if lay.ring.num_k_heads != lay.num_k_heads:
        raise ValueError(f"{prefix}ring: {lay.ring.num_k_heads} key heads, num_k_heads is "
                         f"{lay.num_k_heads}")
    _checks.tensor(f"{prefix}conv_state", lay.conv_state, ndim=3)
    if not isinstance(lay.conv_carry, ConvCarry):
        raise ValueError(f"{prefix}conv_carry: expected a ConvCarry, got "
                         f"{type(lay.conv_carry).__name__}")
    _checks.tensor(f"{prefix}conv_weight", lay.conv_weight, ndim=2)
    r = lay.ring
    dim = 2 * lay.num_k_heads * r.k_dim + r.num_v_heads * r.v_dim
    if lay.conv_state.shape[1] != dim:
        raise ValueError(f"{prefix}conv_state: {lay.conv_state.shape[1]} channels, but the conv "
                         f"feeds q, k, v: 2*HK*kd + HV*vd = {dim}")


class RingStep:
    """Host-side driver of the ring form for a stack of ``RingLayer`` (module docstring).

    One step: ``begin(slots, rows)``; ``verify_layer(i, x=, g=, beta=)`` per layer (the conv
    carry's verify, then ``gdn_ring_verify``); ``accept(accepted)`` (``carry_accept`` of the
    conv carries and ``ring_accept`` of the rings, one launch each). ``flush(slots)`` folds
    every layer's ring (``gdn_ring_flush``) and conv carry, and clears ``len`` / ``pend``.
    ``conv_lazy``: the conv carry's form (True: write the window back only when its stash would
    overflow). ``timer``: as ``SpecDecodeStep``'s (sections ``conv_verify``, ``gdn_verify``,
    ``accept``, ``gdn_flush``, ``conv_flush``). No step syncs with the device.

    ``ValueError`` naming the argument: no layers, a layer that is not a ``RingLayer``, rings
    of different lengths, shared buffers, bad slots, ``rows`` outside ``[1, min(R, 8, CAP)]``,
    a step begun while another waits for its accept."""

    def __init__(self, layers: Sequence[RingLayer], *, conv_lazy: bool = True,
                 timer: Callable[[str], contextlib.AbstractContextManager] | None = None):
        layers = list(layers)
        if not layers:
            raise ValueError("layers: need at least one RingLayer")
        written = {}
        for i, lay in enumerate(layers):
            if not isinstance(lay, RingLayer):
                raise ValueError(f"layers[{i}]: expected a RingLayer, got {type(lay).__name__}")
            _check_layer(f"layers[{i}].", lay)
            if lay.state.shape != layers[0].state.shape or \
                    lay.ring.length != layers[0].ring.length or \
                    lay.conv_carry.cap != layers[0].conv_carry.cap:
                raise ValueError(f"layers[{i}]: state shape / ring length / conv CAP differ "
                                 "from layers[0]")
            written.update({f"layers[{i}].state": lay.state, f"layers[{i}].ring.k": lay.ring.k,
                            f"layers[{i}].ring.u": lay.ring.u, f"layers[{i}].ring.G": lay.ring.G,
                            f"layers[{i}].ring.len": lay.ring.len,
                            f"layers[{i}].ring.base": lay.ring.base,
                            f"layers[{i}].conv_state": lay.conv_state,
                            f"layers[{i}].conv_carry.stash": lay.conv_carry.stash,
                            f"layers[{i}].conv_carry.pend": lay.conv_carry.pend})
        _checks.apart(written)
        if timer is not None and not callable(timer):
            raise ValueError(f"timer: expected None or a callable, got {type(timer).__name__}")
        self.layers, self.timer = layers, timer
        self.conv_lazy = _checks.flag("conv_lazy", conv_lazy)
        self.slots = layers[0].state.shape[0]
        self.device = layers[0].state.device
        self.max_rows = min(layers[0].ring.length, RING_MAX_ROWS, layers[0].conv_carry.cap)
        self._cur = None                 # (host slots, device slot table, rows)
        self._engaged: list = [None] * len(layers)
        self._conv_engaged: list = [None] * len(layers)
        self.stats = dict(steps=0, flushes=0, flushed_slots=0, host_syncs=0)

    def _section(self, name: str):
        return contextlib.nullcontext() if self.timer is None else self.timer(name)

    def _slots(self, slots):
        host = _checks.index_tensor("slots", slots, self.slots, distinct=True)
        return host, host.to(torch.int32).to(self.device)

    # -- the protocol ---------------------------------------------------------------------------
    def begin(self, slots, rows: int) -> dict:
        """Start a step of ``rows`` (K) rows for ``slots``. Returns ``{"lazy", "flushed",
        "synced"}`` (``lazy``: the conv carry's form; nothing is flushed or synced here)."""
        if self._cur is not None and any(e is not None for e in self._engaged):
            raise ValueError("begin: the previous step was verified but not accepted "
                             "(accept it, or abort() / reset() to abandon it)")
        _checks.positive_int("rows", rows, maximum=self.max_rows)
        host, dev = self._slots(slots)
        self._cur = (host, dev, rows)
        self._engaged = [None] * len(self.layers)
        self._conv_engaged = [None] * len(self.layers)
        self.stats["steps"] += 1
        return {"lazy": self.conv_lazy, "flushed": 0, "synced": False}

    def verify_layer(self, i: int, *, x, g, beta):
        """Layer ``i`` of the current step: ``x [B, K, dim]`` (conv input), ``g, beta [B, K,
        HV]`` fp32. Returns ``o [B, K, HV, vd]``."""
        if self._cur is None:
            raise ValueError("verify_layer: call begin() first")
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < len(self.layers):
            raise ValueError(f"i: layer index must be an int in [0, {len(self.layers)}), got {i!r}")
        _, dev, rows = self._cur
        lay = self.layers[i]
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[1] != rows:
            raise ValueError(f"x: expected [B, {rows}, dim], got "
                             f"{tuple(x.shape) if isinstance(x, torch.Tensor) else x!r}")
        with self._section("conv_verify"):
            y, eng_c = conv_carry_verify(lay.conv_state, lay.conv_carry, x, lay.conv_weight,
                                         lay.conv_bias, slot_tab=dev, lazy=self.conv_lazy,
                                         head_dim=lay.ring.k_dim)
        self._conv_engaged[i] = eng_c
        q, k, v = lay.qkv(y)
        with self._section("gdn_verify"):
            o, eng = gdn_ring_verify(lay.state, lay.ring, q, k, v, g, beta, slot_tab=dev,
                                     use_qk_l2norm=True)
        self._engaged[i] = eng
        return o

    @property
    def engaged(self) -> list:
        """The current step's ring ``engaged [B]`` per layer (2: the verify folded the ring into
        the state); ``None`` for a layer not yet verified."""
        return list(self._engaged)

    def accept(self, accepted) -> None:
        """Accept ``a`` rows per sequence (host ints in ``[0, K]``): the conv carries' ``pend``
        and the rings' cursors, one launch each."""
        if self._cur is None or any(e is None for e in self._engaged):
            raise ValueError("accept: every layer of the step must be verified first")
        host, dev, rows = self._cur
        acc = _checks.int_list("accepted", accepted)
        if len(acc) != host.numel() or not all(0 <= a <= rows for a in acc):
            raise ValueError(f"accepted: expected {host.numel()} ints in [0, {rows}], got {acc}")
        a = torch.tensor(acc, dtype=torch.int32).to(self.device)
        with self._section("accept"):
            carry_accept([lay.conv_carry for lay in self.layers], dev, self._conv_engaged[0], a,
                         rows=rows)
            ring_accept([lay.ring for lay in self.layers], dev, self._engaged[0], a, rows=rows)
        self._done()

    def _done(self):
        self._cur = None
        self._engaged = [None] * len(self.layers)
        self._conv_engaged = [None] * len(self.layers)

    def abort(self) -> None:
        """Abandon the step in progress (no-op without one): every verified layer accepts 0
        rows; if only part of the stack was verified, the step's slots are flushed in every
        layer so that all layers hold the same sequence again."""
        if self._cur is None:
            return
        host, dev, rows = self._cur
        zeros = torch.zeros(host.numel(), dtype=torch.int32, device=self.device)
        done = [i for i, e in enumerate(self._engaged) if e is not None]
        conv_done = [i for i, e in enumerate(self._conv_engaged) if e is not None]
        for i in conv_done:
            carry_accept(self.layers[i].conv_carry, dev, self._conv_engaged[i], zeros, rows=rows)
        for i in done:
            ring_accept(self.layers[i].ring, dev, self._engaged[i], zeros, rows=rows)
        self._done()
        if 0 < len(done) < len(self.layers) or 0 < len(conv_done) < len(self.layers):
            self.flush(host)

    def flush(self, slots) -> None:
        """Fold the rings and conv carries of ``slots`` into their states and windows (one
        launch each over all layers) and clear their ``len`` and ``pend``."""
        host, dev = self._slots(slots)
        if host.numel() == 0:
            return
        with self._section("gdn_flush"):
            gdn_ring_flush([lay.state for lay in self.layers],
                           [lay.ring for lay in self.layers], dev)
        with self._section("conv_flush"):
            conv_carry_flush([lay.conv_state for lay in self.layers],
                             [lay.conv_carry for lay in self.layers], dev)
        idx = dev.long()
        for lay in self.layers:
            lay.ring.len.index_fill_(0, idx, 0)
            lay.conv_carry.pend.index_fill_(0, idx, 0)
        self.stats["flushes"] += 1
        self.stats["flushed_slots"] += int(host.numel())

    def reset(self, slots) -> None:
        """``slots`` start new sequences: any step in progress is aborted, their rings and conv
        carries forgotten (the states are the caller's to set)."""
        self.abort()
        host, _ = self._slots(slots)
        for lay in self.layers:
            lay.ring.reset(host)
            lay.conv_carry.reset(host)
