"""The host-side driver of the carried-state protocol for a stack of layers, ``SpecDecodeStep``,
and the seed's policy constants it defaults to (SPEC §3b, §3c). Public through
``pmll_lab.carry``; the layers it drives (``CarryLayer``) and their checks are in
``pmll_lab.serving.carry_layer``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence

import torch

from pmll_lab import _checks
from pmll_lab.ops.carry.exact import gdn_carry_verify
from pmll_lab.ops.carry.common import INDEX_DTYPES
from pmll_lab.ops.carry.stash import carry_accept, gdn_carry_flush
from pmll_lab.ops.conv.carry import conv_carry_flush, conv_carry_verify
from pmll_lab.ops.gdn.gating import split_gating
from pmll_lab.serving.carry_layer import (CarryLayer, check_input_keys, check_layer_inputs,
                                          check_stack, conv_qkv, layer_gates)

GDN_CARRY_LAZY_MIN_SEQS = 8
"""Batch width from which the seed takes the lazy verify. The seed measured it end to end on a
GB10 (dgx3): lazy 2.5 % faster at 16 sequences, 8 instead of 16 gave 214.4 -> 216.2 tok/s at 8,
eager ahead at 2 and 4. Not measured on the H200 yet: ``notebooks/carry_protocol`` measures it."""

GDN_CARRY_EAGER_MAX_PENDING = 4
"""Most pending rows the seed's eager kernels fold; a slot holding more (possible only after lazy
verifies) is flushed first. Our kernels fold any ``pend <= CAP``; the limit is policy."""


class SpecDecodeStep:
    """Host-side driver of the carried-state protocol for a stack of layers (SPEC §3b, §3c).

    One step: ``begin(slots)`` chooses eager or lazy and flushes slots that hold too many
    pending rows for an eager verify; ``verify_layer(i, ...)`` runs layer ``i`` (conv twin, then
    GDN); ``accept(accepted)`` updates every carry's ``pend`` in one launch. ``verify(slots,
    inputs)`` does ``begin`` plus every layer (inputs known up front, as in tests and sweeps).

    Policy (the seed's constants, parameters here because ``notebooks/carry_protocol`` measures
    them): a step of ``B >= lazy_min_seqs`` sequences runs the lazy form, else the eager form;
    an eager verify folds at most ``eager_max_pending`` rows (``None``: no limit), so a slot
    holding more is first folded by ``gdn_carry_flush`` / ``conv_carry_flush`` (all layers, one
    launch each) and its ``pend`` cleared.

    Host syncs: the step keeps a host-side upper bound on every slot's ``pend`` (exact when
    ``accepted`` is given as host ints; ``a <= K`` when it is a device tensor). Only an eager
    step whose bound exceeds ``eager_max_pending`` for some slot reads the batch's true ``pend``
    from the device (one ``B``-int32 copy, a sync; ``stats["host_syncs"]``) to decide which
    slots to flush. So a run that stays eager with ``K <= eager_max_pending``, or stays lazy,
    never syncs; the first eager step after lazy ones syncs once. Slots given as a host list are
    copied to the device (cached per slot list); a device ``slots`` tensor costs one
    device-to-host copy for the bookkeeping.

    All layers receive the same accepts, so their ``pend`` (and ``engaged``) agree; ``accept``
    uses layer 0's ``engaged`` for all carries (``validate=True`` checks the agreement).

    ``timer``: ``None`` or a callable ``timer(name)`` returning a context manager; each launch
    runs inside ``timer("conv_verify")``, ``timer("gdn_verify")``, ``timer("gdn_flush")``,
    ``timer("conv_flush")`` or ``timer("accept")``, so a caller can time the kernels of a step
    one by one (``pmll_lab.models.cache.StepTimer`` does, with CUDA events on a GPU).

    Arguments are checked on the host before any launch, ``ValueError`` naming the argument:
    ``slots`` (of ``begin``, ``flush``, ``reset``, ``verify``) are ints or a 1-D contiguous
    int32/int64 tensor of distinct slots in ``[0, S)``; ``accepted`` host ints in ``[0, K]``
    (floats refused) or an int tensor of ``B`` entries (its values checked with
    ``validate=True``); ``i`` a layer index in ``[0, L)``; ``inputs[i]`` a dict with exactly the
    keys its layer takes. ``verify`` checks every layer's inputs (shapes, dtypes, devices, rows)
    before its first launch, so a bad layer ``i`` leaves the whole stack untouched; the error
    then reads ``inputs[i]: <argument>: ...``.

    Aborting a step: when ``verify_layer`` fails part-way through a stack (or the caller gives
    up on a step), ``abort()`` (also called by ``reset``) puts every layer back in step, so the
    driver is usable again (see ``abort``). A layer is verified once per step: a second
    ``verify_layer(i)`` (a retry after an error in the caller's code) is refused, as it would
    fold the layer's pending rows a second time.

    Forks: ``copy_slots(src, dst)`` copies slots whole (states, conv windows, stashes and
    ``pend``), so a slot forked while it holds pending rows holds them too.
    """

    def __init__(self, layers: Sequence[CarryLayer], *, form: str = "exact",
                 lazy_min_seqs: int | None = GDN_CARRY_LAZY_MIN_SEQS,
                 eager_max_pending: int | None = GDN_CARRY_EAGER_MAX_PENDING,
                 scale: float | None = None, validate: bool = False,
                 timer: Callable[[str], contextlib.AbstractContextManager] | None = None):
        layers = check_stack(layers, form)
        if lazy_min_seqs is not None:
            _checks.positive_int("lazy_min_seqs", lazy_min_seqs)
        if eager_max_pending is not None:
            _checks.positive_int("eager_max_pending", eager_max_pending, minimum=0)
        self.layers = layers
        self.form = form
        self.lazy_min_seqs = lazy_min_seqs
        self.eager_max_pending = eager_max_pending
        self.scale = _checks.optional_float("scale", scale)   # as gdn_carry_verify takes it
        self.validate = _checks.flag("validate", validate)
        if timer is not None and not callable(timer):
            raise ValueError(f"timer: expected None or a callable, got {type(timer).__name__}")
        self.timer = timer
        self.cap = layers[0].carry.cap
        self.device = layers[0].state.device
        self._bound = torch.zeros(layers[0].state.shape[0], dtype=torch.int64)  # host, per slot
        self._slot_cache: dict[tuple, torch.Tensor] = {}
        self._cur = None       # (host slots [B] int64, device slot_tab, lazy)
        self._engaged: list[torch.Tensor | None] = [None] * len(layers)
        self._conv_engaged: list[torch.Tensor | None] = [None] * len(layers)
        self._rows: int | None = None
        self._cut: set[tuple[int, str]] = set()    # (layer, "conv"/"gdn"): launch stopped
        self._lost: set[int] = set()               # slots to set anew, then reset()
        self.stats = dict(steps=0, lazy_steps=0, eager_steps=0, flushes=0, flushed_slots=0,
                          host_syncs=0)

    def _section(self, name: str):
        """``self.timer(name)``, or a no-op context without a timer."""
        return contextlib.nullcontext() if self.timer is None else self.timer(name)

    # -- slots --------------------------------------------------------------------------------
    def _slots(self, slots):
        """``(host int64 [B], device slot_tab [B])``. ``slots``: ints or a 1-D contiguous
        int32/int64 tensor (a device tensor is used as the kernels' slot table as it is) of
        distinct slots in ``[0, S)``; ``ValueError`` naming ``slots`` otherwise."""
        S = self._bound.shape[0]
        if isinstance(slots, torch.Tensor):
            _checks.tensor("slots", slots, ndim=1, dtype=INDEX_DTYPES, contiguous=True)
        if isinstance(slots, torch.Tensor) and slots.device.type != "cpu":
            _checks.tensor("slots", slots, device=self.device)
            dev_tab = slots
            host = slots.to("cpu", torch.int64)           # a sync: pass host slots to avoid it
            self.stats["host_syncs"] += 1
            _checks.indices_values("slots", host, S)
            return host, dev_tab
        host = _checks.index_tensor("slots", slots, S, distinct=True)
        key = tuple(host.tolist())
        dev_tab = self._slot_cache.get(key)
        if dev_tab is None:
            if len(self._slot_cache) > 1024:
                self._slot_cache.clear()
            dev_tab = self._slot_cache[key] = host.to(torch.int32).to(self.device)
        return host, dev_tab

    def _clear_pend(self, host_slots: torch.Tensor, dev_tab: torch.Tensor) -> None:
        idx = dev_tab.long()
        for lay in self.layers:
            for c in lay.carries():
                c.pend.index_fill_(0, idx, 0)
        self._bound[host_slots] = 0

    def _check_kept(self, host: torch.Tensor, what: str) -> None:
        """``ValueError`` naming ``slots`` when one of ``host`` lost its state (``abort``)."""
        lost = sorted(self._lost & set(host.tolist()))
        if lost:
            raise ValueError(f"slots: slot(s) {lost} lost their state when a verify stopped "
                             f"part-way through its write-back ({what} refused): set their "
                             "states anew (a prefill) and reset() them first")

    @contextlib.contextmanager
    def _launch(self, i: int, kind: str, name: str):
        """A verify launch of layer ``i`` (``kind``: ``"conv"`` or ``"gdn"``) in the timer's
        section ``name``. A ``ValueError`` is an argument check (raised before the launch); any
        other exception (``KeyboardInterrupt`` in the interpreter, a CUDA error) may have
        stopped the kernel part-way, which ``abort`` must know."""
        try:
            with self._section(name):
                yield
        except ValueError:
            raise
        except BaseException:
            self._cut.add((i, kind))
            raise

    # -- the protocol -------------------------------------------------------------------------
    def reset(self, slots) -> None:
        """A slot starts a new sequence: ``pend = 0`` in every carry and the GDN verify's
        arrival counts zeroed (``GdnCarry.clear_arrivals``); its states are the caller's to set.
        A step in progress (begun, maybe partly verified, not accepted) is aborted first
        (``abort``), so the driver is usable again after a failed step; a slot ``abort`` found
        lost is usable again once reset."""
        host, dev_tab = self._slots(slots)
        self.abort()
        self._clear_pend(host, dev_tab)
        for lay in self.layers:
            lay.carry.clear_arrivals(dev_tab.long())
        self._lost.difference_update(host.tolist())

    def copy_slots(self, src, dst) -> None:
        """Fork slots: every layer's state, conv window, GDN stash, conv stash and ``pend`` of
        slots ``src`` copied to slots ``dst`` (ints or index tensors; ``dst`` distinct, none in
        ``src``), so a slot forked while its source holds pending rows (prefix caching, a
        forked request) continues as its source would, bitwise. Copying only the states would
        leave the pending rows behind (and the fork's own stale ones in place). ``ValueError``
        naming the argument, or while a step is in progress (accept or abort it first), or for
        a ``src`` slot ``abort`` found lost."""
        if self._cur is not None:
            raise ValueError("copy_slots: a step is in progress (accept() or abort() it first)")
        S = self._bound.shape[0]
        s_idx, d_idx = _checks.copy_indices(src, dst, S, "cpu")
        self._check_kept(s_idx, "copy_slots")
        s_dev, d_dev = s_idx.to(self.device), d_idx.to(self.device)
        for lay in self.layers:
            lay.state[d_dev] = lay.state[s_dev]
            lay.carry.copy_slots(s_dev, d_dev)
            if lay.has_conv:
                lay.conv_state[d_dev] = lay.conv_state[s_dev]
                lay.conv_carry.copy_slots(s_dev, d_dev)
        self._bound[d_idx] = self._bound[s_idx]
        self._lost.difference_update(d_idx.tolist())

    def abort(self) -> list[int]:
        """Abandon the step in progress (no-op without one), leaving every layer consistent;
        returns the slots whose state could not be kept (usually none, see below).

        Each carry already verified in this step (GDN or conv) accepts 0 rows with its own
        ``engaged``: after a write-back its state already holds the folded rows and ``pend``
        becomes 0; otherwise ``pend`` and the stash rows it counts are unchanged (the verify
        wrote only rows past them). If only part of the stack was verified, the layers now
        disagree on ``pend``, so the step's slots are then flushed in every layer
        (``flush``: all pending rows folded, ``pend = 0``). The verified rows' outputs are
        discarded; the next step starts from the states as if those rows were never drafted.

        A verify stopped part-way through its kernel (an exception other than an argument
        check's ``ValueError``: Ctrl-C in the interpreter, which the notebooks use on the CPU;
        a CUDA error) left some of its programs run and others not. Where that verify could
        not write back (lazy, ``pend + K <= CAP``) it wrote only stash rows past ``pend``, so
        the slot is kept as above. Where it could (eager with ``pend > 0``, or lazy with
        ``pend + K > CAP``), some blocks of the state may hold the folded rows and others not,
        and no record tells which: those slots are lost. They are reset in every carry and
        returned (one read of ``pend``, a sync); until the caller sets their states anew and
        calls ``reset`` for them, ``begin``, ``verify``, ``flush`` and ``copy_slots`` refuse
        them. The GDN verify's arrival counts of the step's slots are zeroed in every case
        (``GdnCarry.clear_arrivals``), so the next verify's shared stash rows are right.
        """
        if self._cur is None:
            return []
        host, dev_tab, lazy = self._cur
        idx = dev_tab.long()
        lost = torch.zeros_like(host, dtype=torch.bool)
        if self._cut:                            # which slots a stopped launch may have written
            p = self.layers[0].carry.pend[idx].to("cpu", torch.int64)
            self.stats["host_syncs"] += 1
            lost = p + self._rows > self.cap if lazy else p > 0
        verified, total = 0, 0
        zeros = None
        for i, lay in enumerate(self.layers):
            lay.carry.clear_arrivals(idx)
            pairs = [(lay.carry, self._engaged[i], (i, "gdn"))]
            if lay.has_conv:
                pairs.append((lay.conv_carry, self._conv_engaged[i], (i, "conv")))
            for carry, eng, key in pairs:
                total += 1
                verified += eng is not None or key in self._cut   # stopped: engaged 1 where kept
                if eng is None:
                    continue
                if zeros is None:
                    zeros = torch.zeros(eng.shape[0], dtype=torch.int32, device=eng.device)
                with self._section("accept"):
                    carry_accept(carry, dev_tab, eng, zeros, rows=self._rows)
        self._cur = None
        self._engaged = [None] * len(self.layers)
        self._conv_engaged = [None] * len(self.layers)
        self._cut = set()
        gone = host[lost]
        if gone.numel():
            for lay in self.layers:
                for c in lay.carries():
                    c.reset(gone.to(self.device))
            self._bound[gone] = 0
            self._lost.update(gone.tolist())
        kept = host[~lost]
        if 0 < verified < total:
            if kept.numel():
                self.flush(kept)                 # pend 0 for these slots in every carry
        elif verified and not lazy:
            self._bound[host] = 0                # eager: pend was 0 or written back
        return sorted(gone.tolist())

    def flush(self, slots) -> None:
        """Fold the pending rows of ``slots`` into every layer's state (GDN and conv, one launch
        each over all layers) and clear their ``pend``."""
        host, dev_tab = self._slots(slots)
        if host.numel() == 0:
            return
        self._check_kept(host, "flush")
        with self._section("gdn_flush"):
            gdn_carry_flush([lay.state for lay in self.layers],
                            [lay.carry for lay in self.layers], dev_tab, validate=self.validate,
                            state_layout=self.layers[0].state_layout)
        if self.layers[0].has_conv:
            with self._section("conv_flush"):
                conv_carry_flush([lay.conv_state for lay in self.layers],
                                 [lay.conv_carry for lay in self.layers], dev_tab,
                                 validate=self.validate)
        self._clear_pend(host, dev_tab)
        self.stats["flushes"] += 1
        self.stats["flushed_slots"] += int(host.numel())

    def _check_idle(self) -> None:
        if self._cur is not None and (self._cut or any(
                e is not None for e in self._engaged + self._conv_engaged)):
            raise ValueError("begin: the previous step was verified but not accepted "
                             "(accept it, or abort() / reset() to abandon it)")

    def _lazy(self, batch: int) -> bool:
        return self.lazy_min_seqs is not None and batch >= self.lazy_min_seqs

    def begin(self, slots, rows: int) -> dict:
        """Start a step of ``rows`` (K) draft rows for the sequences in ``slots``: choose the form
        and flush what an eager verify may not fold. Returns ``{"lazy", "flushed", "synced"}``."""
        self._check_idle()
        _checks.positive_int("rows", rows, maximum=self.cap)
        host, dev_tab = self._slots(slots)
        self._check_kept(host, "begin")
        return self._begin(host, dev_tab, rows)

    def _begin(self, host: torch.Tensor, dev_tab: torch.Tensor, rows: int) -> dict:
        B = int(host.numel())
        lazy = self._lazy(B)
        flushed, synced = 0, False
        lim = self.eager_max_pending
        if not lazy and lim is not None and B and int(self._bound[host].max()) > lim:
            # One sync: the true pending counts of this batch's slots (layer 0's GDN carry; every
            # carry of the stack received the same accepts).
            actual = self.layers[0].carry.pend[dev_tab.long()].to("cpu", torch.int64)
            self.stats["host_syncs"] += 1
            synced = True
            self._bound[host] = actual
            over = host[actual > lim]
            if over.numel():
                self.flush(over)
                flushed = int(over.numel())
        self._cur = (host, dev_tab, lazy)
        self._rows = rows
        self._engaged = [None] * len(self.layers)
        self._conv_engaged = [None] * len(self.layers)
        self.stats["steps"] += 1
        self.stats["lazy_steps" if lazy else "eager_steps"] += 1
        return {"lazy": lazy, "flushed": flushed, "synced": synced}

    def verify_layer(self, i: int, *, g=None, beta=None, q=None, k=None, v=None, x=None,
                     A_log=None, a=None, dt_bias=None, b=None):
        """Verify the current step's rows on layer ``i``. Without a conv: ``q, k [B, K, HK, kd]``,
        ``v [B, K, HV, vd]``; with one: ``x [B, K, dim]`` (the conv runs first, q, k, v are views
        of its output). ``g, beta [B, K, HV]`` fp32, or ``a, b [B, K, HV]`` with the gating
        computed in the kernel (``A_log``, ``dt_bias [HV]`` default to the layer's fields).
        Returns ``o [B, K, HV, vd]``. ``ValueError`` naming ``i`` for a layer already verified
        in this step, or whose verify failed part-way (its conv verified, or its launch
        stopped): a second verify would fold its pending rows again; ``abort()`` the step and
        begin again."""
        if self._cur is None:
            raise ValueError("verify_layer: call begin() first")
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < len(self.layers):
            raise ValueError(f"i: layer index must be an int in [0, {len(self.layers)}), got {i!r}")
        if self._engaged[i] is not None:
            raise ValueError(f"i: layer {i} was already verified in this step (a second verify "
                             "would fold its pending rows again); accept() the step, or "
                             "abort() it and begin again")
        if self._conv_engaged[i] is not None or {(i, "conv"), (i, "gdn")} & self._cut:
            raise ValueError(f"i: layer {i}'s verify failed part-way in this step (its conv "
                             "verified or a launch stopped); abort() the step and begin again")
        _, dev_tab, lazy = self._cur
        lay = self.layers[i]
        gates = layer_gates(lay, g, beta, A_log, a, dt_bias, b)
        split_gating(**gates)                  # the form's errors before the conv runs
        use_l2 = lay.use_qk_l2norm
        if lay.has_conv:
            if x is None or q is not None:
                raise ValueError("x: a conv layer takes x [B, K, dim], not q/k/v")
            kd = lay.carry.k_dim
            qk = 2 * lay.num_k_heads * kd
            with self._launch(i, "conv", "conv_verify"):
                y, eng_c = conv_carry_verify(
                    lay.conv_state, lay.conv_carry, x, lay.conv_weight, lay.conv_bias,
                    slot_tab=dev_tab, lazy=lazy, qk_channels=qk if lay.qk_l2norm_in_conv else 0,
                    head_dim=kd, validate=self.validate)
            self._conv_engaged[i] = eng_c            # verified: abort() must know it
            q, k, v = conv_qkv(lay, y)
            use_l2 = not lay.qk_l2norm_in_conv
        elif q is None or k is None or v is None:
            raise ValueError("q: a layer without conv takes q, k, v")
        if q.shape[1] != self._rows:
            raise ValueError(f"q: {q.shape[1]} rows, but begin() was told {self._rows}")
        with self._launch(i, "gdn", "gdn_verify"):
            o, eng = gdn_carry_verify(lay.state, lay.carry, q, k, v, **gates, slot_tab=dev_tab,
                                      form=self.form, lazy=lazy, scale=self.scale,
                                      use_qk_l2norm=use_l2, validate=self.validate,
                                      eager_max_pending=self.eager_max_pending,
                                      state_layout=lay.state_layout)
        if self.validate and lay.has_conv and not torch.equal(eng, eng_c):
            raise ValueError(f"layers[{i}]: conv and GDN engaged flags differ (pend out of step)")
        self._engaged[i] = eng
        return o

    @property
    def engaged(self) -> list:
        """The current step's ``engaged [B]`` int32 per layer (``None`` for a layer not yet
        verified); cleared by ``accept``."""
        return list(self._engaged)

    def verify(self, slots, inputs: Sequence[dict]) -> list[torch.Tensor]:
        """``begin`` + ``verify_layer`` for every layer; ``inputs[i]`` holds layer ``i``'s
        keyword arguments. Returns the outputs per layer."""
        check_input_keys(inputs, self.layers)
        first = inputs[0]
        lead = first["x"] if "x" in first else first["q"]
        if not isinstance(lead, torch.Tensor) or lead.dim() < 2:
            raise ValueError(f"inputs[0]: {'x' if 'x' in first else 'q'} must be a tensor "
                             "[B, K, ...]")
        rows = lead.shape[1]
        self._check_idle()
        _checks.positive_int("rows", rows, maximum=self.cap)
        host, dev_tab = self._slots(slots)
        self._check_kept(host, "verify")
        lazy = self._lazy(int(host.numel()))
        for i, inp in enumerate(inputs):        # every layer checked before the first launch
            try:
                check_layer_inputs(self.layers[i], dev_tab, lazy, rows, self.form, self.scale,
                                   self.validate, **inp)
            except ValueError as exc:
                raise ValueError(f"inputs[{i}]: {exc}") from None
        self._begin(host, dev_tab, rows)
        return [self.verify_layer(i, **inp) for i, inp in enumerate(inputs)]

    def accept(self, accepted) -> None:
        """Accept ``a`` of the ``K`` rows per sequence (``0 <= a <= K``; ``accepted [B]`` device
        int tensor or host ints) in every carry, one launch (``carry_accept``). Host counts
        outside ``[0, K]`` raise ``ValueError`` naming ``accepted`` (no sync; nothing changed);
        a device tensor's values are checked with ``validate=True``."""
        if self._cur is None or any(e is None for e in self._engaged):
            raise ValueError("accept: every layer of the step must be verified first")
        host, dev_tab, lazy = self._cur
        eng = self._engaged[0]
        if self.validate:
            for i, e in enumerate(self._engaged[1:], 1):
                if not torch.equal(e, eng):
                    raise ValueError(f"layers[{i}]: engaged differs from layer 0 (pend out of step)")
        on_host = not isinstance(accepted, torch.Tensor) or accepted.device.type == "cpu"
        if on_host:
            if isinstance(accepted, torch.Tensor):
                _checks.tensor("accepted", accepted, ndim=1, dtype=INDEX_DTYPES)
                acc_host = accepted.to(torch.int64)
            else:
                acc_host = torch.tensor(_checks.int_list("accepted", accepted), dtype=torch.int64)
            if acc_host.shape != host.shape:
                raise ValueError(f"accepted: expected shape {tuple(host.shape)}, got "
                                 f"{tuple(acc_host.shape)}")
            bad = acc_host[(acc_host < 0) | (acc_host > self._rows)]
            if bad.numel():               # host values: no sync (a device tensor: validate)
                raise ValueError(f"accepted: entries must lie in [0, K = {self._rows}], got "
                                 f"{int(bad[0])}")
            accepted = acc_host.to(torch.int32).to(self.device)
        carries = [c for lay in self.layers for c in lay.carries()]
        with self._section("accept"):
            carry_accept(carries, dev_tab, eng, accepted, rows=self._rows,
                         validate=self.validate)
        a = acc_host if on_host else torch.full_like(host, self._rows)
        if lazy:
            self._bound[host] = torch.clamp(self._bound[host] + a, max=self.cap)
        else:
            self._bound[host] = a
        self._cur = None
        self._engaged = [None] * len(self.layers)
        self._conv_engaged = [None] * len(self.layers)
