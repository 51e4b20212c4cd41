"""``ServingCache``: every recurrent and attention state of a hybrid GDN model, held in slots.

One object holds, for ``S`` slots (sequences decoded together), what a serving engine keeps per
sequence: per GDN layer the conv window ``[S, conv_dim, d_conv]`` (the conv's input columns,
oldest first, as transformers' cache holds them), the recurrent state (``state_dtype``,
``[S, HV, vd, kd]`` with ``state_layout="vk"``, the default, or ``[S, HV, kd, vd]`` with
``"kv"``), the carried-state stashes (``GdnCarry``, ``ConvCarry``), the ring form's rings or the
snapshot buffers of the chain; per attention layer the keys
and values ``[S, H_kv, max_len, head_dim]``. It is passed to the transformers model as its
``cache``: the attention layers store keys/values through ``update`` (their code unchanged), the
GDN layers (redirected by ``pmll_lab.models.qwen3_next.patch_model``) call ``gdn_forward``.

A step is one of:

- ``prefill(slot, ids)``: one new sequence, its prompt through the model; GDN layers run
  transformers' own torch path (chunked delta rule, torch conv) and leave their final state and
  conv window in the slot.
- ``decode(slots, tokens)``: one token per sequence: ``conv_update`` + ``gdn_decode`` (SPEC §2).
  A slot that holds carried (pending) rows is flushed first: a sequence switching form.
- ``verify(slots, rows)`` then ``accept(accepted)``: ``K`` rows per sequence; the form is
  ``"exact"`` (carried state, ``pmll_lab.carry.SpecDecodeStep``: lazy from
  ``lazy_min_seqs`` sequences, eager below, a slot over ``eager_max_pending`` flushed before an
  eager verify), ``"chain"`` (``conv_chain`` + ``gdn_chain`` with snapshots, the snapshot of
  row ``a-1`` copied back for a sequence that accepts ``a < K`` rows) or ``"ring"`` (the ring
  form, SPEC §3d, a tolerance form: ``pmll_lab.serving.ring_step.RingStep``, V-major states
  only; the conv keeps the exact conv carry, lazy from ``lazy_min_seqs`` sequences).
- ``release(slot)``: the sequence ended; its carries are reset and the slot is free for the next
  prompt (its states are overwritten by that prompt's prefill).

Misuse is refused with ``ValueError`` before any kernel runs (nothing changes): ``decode`` /
``verify`` of a slot that holds no sequence (never prefilled, or released); token ids outside the
model's vocabulary; ``tokens`` / ``rows`` not one entry / row per slot; ``accept`` with no verify
waiting; and any step but ``accept`` while a verify waits (a rejected ``accept`` leaves the verify
waiting: accept it with valid counts). A verify stopped part-way (Ctrl-C in the interpreter)
is abandoned; a slot whose state it may have half written back (``SpecDecodeStep.abort``) then
holds no sequence until its next prefill.

Attention: keys of slot ``s`` sit at positions ``0 .. length[s]-1``; a step's queries see
positions up to their own through an additive mask over all ``max_len`` positions, so rejected
draft rows need no rollback (they are masked, then overwritten), and every step reduces over the
same key length.

Positions and lengths are host-side ints (the loop knows them); no step syncs with the device
except where stated (``accept`` reads the verify's ``engaged`` flags to count write-backs).

Here: the cache and its steps (``ServingCache``, the verify forms ``FORMS``). One GDN layer's
buffers and the kernels a step runs on them, and ``state_bytes_per_sequence``, live in
``pmll_lab.models.cache_layer``; the checks of a step's inputs in ``pmll_lab.models.cache_checks``
(both reachable from here).
"""

from __future__ import annotations

from collections import defaultdict

import torch
from torch import nn

from pmll_lab import _checks
from pmll_lab.carry import (GDN_CARRY_CAP, GDN_CARRY_EAGER_MAX_PENDING, GDN_CARRY_LAZY_MIN_SEQS,
                            RING_DEFAULT_LENGTH, RING_LENGTHS, CarryLayer, ConvCarry, GdnCarry,
                            SpecDecodeStep, check_form)
from pmll_lab.models.cache_checks import StepChecks
from pmll_lab.models.cache_layer import (  # noqa: F401  (state_bytes_per_sequence: re-exported)
    GdnLayer, ring_stack, state_bytes_per_sequence)
from pmll_lab.models.common import GdnCache, vocab_size
from pmll_lab.models.qwen3_next import GdnDims, finish, gating, patch_model, project
from pmll_lab.models.timing import StepTimer
from pmll_lab.ops.gdn.recurrence import DEFAULT_STATE_LAYOUT, STATE_LAYOUTS

FORMS = ("exact", "chain", "ring", "replayssm")
"""Verify forms: the carried state's exact form (SPEC §3b), the snapshot chain (§3a), the
ring form (§3d), and FlashInfer's ReplaySSM as a peer (GPU only,
``pmll_lab.models.replayssm_stack``)."""


class ServingCache(StepChecks, GdnCache):
    """Conv windows, GDN states, carry stashes / snapshots and attention KV of ``slots``
    sequences of one model (module docstring: the steps).

    Args:
        model: a transformers causal LM with Qwen3-Next / Qwen3.5 GDN layers (patched here with
            ``patch_model``); its parameters' dtype and device are used (bf16 models get a bf16
            conv window and stash, others fp32).
        state_dtype: the GDN state pool's dtype (fp32, bf16 or fp16; SPEC §2 "State dtype"),
            also the chain's snapshots' and the ring's rows'.
        slots: sequences held at once (``S``). max_len: positions per slot (prompt + generated +
            draft rows); a step past it raises ``ValueError``.
        state_layout: ``"vk"`` (default, as every GDN launcher's) or ``"kv"`` for every GDN
            state, snapshot, stash and kernel; recorded (``self.layout``), and the Hugging
            Face cache's K-major states are transposed into it when loaded.
        form: verify form, ``"exact"``, ``"chain"``, ``"ring"`` (needs ``state_layout="vk"``
            and head sizes the ring kernels take) or ``"replayssm"`` (FlashInfer's peer: a GPU,
            ``kd = vd = 128``, a bf16 V-major pool). rows: the largest ``K`` verify will be
            given (sizes the chain's snapshot buffers). ring_length: the ring form's ``R``.
        lazy_min_seqs: carried forms run lazy from this many sequences in a step (``None``:
            always eager); eager_max_pending: as in ``SpecDecodeStep``. cap: stash rows (CAP).
        timer: a ``StepTimer`` (default: a disabled one).
        record: keep every GDN layer's kernel input and output of every accepted row in
            ``self.gdn_io``: ``{(tag, layer, position): (x [conv_dim], o [HV, vd])}`` (CPU
            copies; ``tag`` as given to ``prefill``). For exactness checks; costs a copy per row.

    Raises ``ValueError``/``TypeError`` naming the argument (module docstring: what each step
    refuses).
    """

    def __init__(self, model: nn.Module, *, slots: int, max_len: int,
                 state_layout: str = DEFAULT_STATE_LAYOUT,
                 form: str = "exact", rows: int = 1,
                 lazy_min_seqs: int | None = GDN_CARRY_LAZY_MIN_SEQS,
                 eager_max_pending: int | None = GDN_CARRY_EAGER_MAX_PENDING,
                 cap: int = GDN_CARRY_CAP, timer: StepTimer | None = None,
                 record: bool = False, state_dtype: torch.dtype = torch.float32,
                 ring_length: int = RING_DEFAULT_LENGTH):
        _checks.positive_int("slots", slots)
        _checks.positive_int("max_len", max_len)
        _checks.choice("state_layout", state_layout, STATE_LAYOUTS)
        check_form("form", form, FORMS)
        _checks.positive_int("rows", rows, maximum=cap)
        _checks.choice("state_dtype", state_dtype, _checks.FLOAT_DTYPES)
        _checks.choice("ring_length", ring_length, RING_LENGTHS)
        if form == "ring" and state_layout != "vk":
            raise ValueError(f"state_layout: the ring form runs on V-major states ('vk'), got "
                             f"{state_layout!r}")
        self.model = model
        modules = patch_model(model)
        param = next(model.parameters())
        self.dtype, self.device = param.dtype, param.device
        self.conv_dtype = torch.bfloat16 if self.dtype == torch.bfloat16 else torch.float32
        self.slots, self.max_len, self.layout, self.form, self.cap = slots, max_len, \
            state_layout, form, cap
        self.lazy_min_seqs, self.eager_max_pending = lazy_min_seqs, eager_max_pending
        self.state_dtype, self.ring_length = state_dtype, ring_length
        self.gdn = [GdnLayer(m, GdnDims.of(m), slots, state_layout, self.conv_dtype, self.device,
                              state_dtype) for m in modules]
        self._index = {id(m): i for i, m in enumerate(modules)}
        cfg = model.config.get_text_config()
        gdn_idx = {lay.dims.layer_idx for lay in self.gdn}
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.kv = {i: tuple(torch.zeros(slots, cfg.num_key_value_heads, max_len, head_dim,
                                        dtype=self.dtype, device=self.device) for _ in range(2))
                   for i in range(cfg.num_hidden_layers) if i not in gdn_idx}
        self.lengths = [0] * slots
        self._live: set[int] = set()         # slots holding a sequence (prefilled, not released)
        self._waiting: list[int] | None = None   # slots of a verify not yet accepted
        self.vocab = vocab_size(model)
        self.timer = timer or StepTimer(self.device, enabled=False)
        self._spec = None
        self._dirty: set[int] = set()        # slots that may hold carried (pending) rows
        self._mode = None
        self._rows = 0
        self._counts = defaultdict(int)      # write_backs, restored
        self.gdn_io: dict | None = {} if record else None
        self._tags: dict[int, object] = {}
        self._io_step: list = []
        if form == "chain" and rows > 1:
            for lay in self.gdn:
                lay.inter = torch.zeros(slots, rows - 1, *lay.state.shape[1:],
                                        dtype=state_dtype, device=self.device)
                lay.conv_inter = torch.zeros(slots, rows - 1, *lay.conv_state.shape[1:],
                                             dtype=self.conv_dtype, device=self.device)
        elif form != "chain":
            self._make_carries()

    # -- set-up ---------------------------------------------------------------------------------
    def _make_carries(self):
        if self.form == "ring":
            self._spec = ring_stack(self)
            return
        if self.form == "replayssm":
            from pmll_lab.models.replayssm_stack import ReplaySSMStep

            self._spec = ReplaySSMStep(self)
            return
        layers = []
        for lay in self.gdn:
            d = lay.dims
            lay.carry = GdnCarry.empty(self.slots, d.num_v_heads, d.k_dim, d.v_dim, cap=self.cap,
                                       device=self.device, state_layout=self.layout)
            lay.conv_carry = ConvCarry.empty(self.slots, d.conv_dim, cap=self.cap,
                                             dtype=self.conv_dtype, device=self.device)
            layers.append(CarryLayer(lay.state, lay.carry, lay.conv_state, lay.conv_carry,
                                     lay.conv_weight, lay.conv_bias, num_k_heads=d.num_k_heads,
                                     qk_l2norm_in_conv=False, use_qk_l2norm=True,
                                     state_layout=self.layout))
        self._spec = SpecDecodeStep(layers, form=self.form, lazy_min_seqs=self.lazy_min_seqs,
                                    eager_max_pending=self.eager_max_pending, timer=self.timer)

    # -- what transformers calls ----------------------------------------------------------------
    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        """Attention layers: store the step's keys/values ``[B, H_kv, T, D]`` at the step's
        positions of its slots; return every slot's full ``[B, H_kv, max_len, D]``."""
        kc, vc = self.kv[layer_idx]
        sl = self._slot_long[:, None]
        kc[sl, :, self._pos] = key_states.transpose(1, 2).to(kc.dtype)
        vc[sl, :, self._pos] = value_states.transpose(1, 2).to(vc.dtype)
        return kc[self._slot_long], vc[self._slot_long]

    def gdn_forward(self, module: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
        """A GDN layer's forward on this cache (called by the patched layer): its own
        projections, gating, norm and output projection around our conv and delta-rule kernels
        (transformers' torch path in a prefill step)."""
        i = self._index[id(module)]
        lay = self.gdn[i]
        mixed, z, b, a = project(module, hidden_states)
        g, beta = gating(module, a, b)
        if self._mode == "prefill":
            core = lay.prefill(mixed, g, beta, self._slot0)
        else:
            x = mixed.to(self.conv_dtype)
            if self._mode == "decode":
                core = lay.decode(x[:, 0], g[:, 0], beta[:, 0], self._slot_tab,
                                  self.timer)[:, None]
            elif self.form == "chain":
                core = lay.chain(x, g, beta, self._slot_tab, self.timer)
            elif getattr(self._spec, "raw_gating", False):     # the peer gates in its kernel
                core = self._spec.verify_layer(i, x=x, a=a, b=b)
            else:
                core = self._spec.verify_layer(i, x=x, g=g, beta=beta)
            if self.gdn_io is not None:
                self._io_step.append((i, x.detach().cpu().clone(), core.detach().cpu().clone()))
        return finish(module, core, z, hidden_states.dtype)

    def _commit_io(self, accepted: list[int]) -> None:
        """Keep the recorded rows ``t < accepted[b]`` of the step (``record=True``)."""
        if self.gdn_io is None:
            return
        pos = self._pos.cpu()
        for i, x, o in self._io_step:
            for b, s in enumerate(self._slots_host):
                for t in range(accepted[b]):
                    self.gdn_io[(self._tags.get(s), i, int(pos[b, t]))] = (x[b, t], o[b, t])
        self._io_step = []

    # -- steps ----------------------------------------------------------------------------------
    def _bind(self, slots, T):
        """Host slots and positions of a step of ``T`` rows; device slot tables and positions."""
        slots = self._check_slots(slots)
        end = max(self.lengths[s] for s in slots) + T
        if end > self.max_len:
            raise ValueError(f"max_len: a step needs {end} positions, the cache holds "
                             f"{self.max_len}")
        self._slots_host = list(slots)
        st = torch.tensor(slots, dtype=torch.int32)
        self._slot_tab = st.to(self.device)
        self._slot_long = self._slot_tab.long()
        pos = torch.tensor([self.lengths[s] for s in slots])[:, None] + torch.arange(T)
        self._pos = pos.to(self.device)
        return self._pos

    def _forward(self, ids: torch.Tensor, keep: int = 0) -> torch.Tensor:
        pos = self._pos
        j = torch.arange(self.max_len, device=self.device)
        allowed = j[None, None, None, :] <= pos[:, None, :, None]
        mask = torch.zeros(allowed.shape, dtype=self.dtype, device=self.device)
        mask.masked_fill_(~allowed, torch.finfo(self.dtype).min)
        out = self.model(input_ids=ids, attention_mask={"full_attention": mask,
                                                        "linear_attention": None},
                         position_ids=pos, cache=self, use_cache=True, logits_to_keep=keep)
        return out.logits

    @torch.no_grad()
    def prefill(self, slot: int, ids: torch.Tensor, tag=None) -> torch.Tensor:
        """Start sequence ``ids [T]`` (LongTensor, ``T >= 1``) in ``slot``: the prompt through
        the model; returns the last position's logits ``[V]``. ``tag`` names the sequence in
        ``gdn_io``. ``ValueError`` naming ``ids`` for ids outside the vocabulary, ``slot`` out of
        range, ``max_len`` for a prompt longer than the cache's positions, and while a verify
        waits for its ``accept``; a refused prefill leaves the cache as it was (a sequence
        live in ``slot`` goes on)."""
        self._check_idle("prefill")
        if not isinstance(ids, torch.Tensor) or ids.dim() != 1 or ids.numel() < 1:
            raise ValueError(f"ids: expected a non-empty 1-D LongTensor, got "
                             f"{tuple(ids.shape) if isinstance(ids, torch.Tensor) else ids!r}")
        self._check_ids("ids", ids, (None,), "[T]")
        if ids.numel() > self.max_len:          # before the slot is reset: a refusal keeps it
            raise ValueError(f"max_len: a step needs {ids.numel()} positions, the cache holds "
                             f"{self.max_len}")
        self._reset_slot(slot)
        self._tags[slot] = tag
        self._bind([slot], ids.numel())
        self._slot0 = slot
        self._mode = "prefill"
        try:
            logits = self._forward(ids[None].to(self.device), keep=1)
        finally:
            self._mode = None
        self.lengths[slot] = ids.numel()
        self._live.add(slot)
        return logits[0, -1]

    @torch.no_grad()
    def decode(self, slots: list[int], tokens: torch.Tensor) -> torch.Tensor:
        """One token per sequence: ``tokens [B]`` at the next position of each slot; returns
        logits ``[B, V]``. Slots holding carried rows are flushed first (all layers, one launch
        per kernel). ``ValueError`` (nothing run): ``slots`` not distinct, out of range or
        holding no sequence; ``tokens`` not ``[len(slots)]`` or outside the vocabulary; a verify
        waiting for its ``accept``."""
        self._check_idle("decode")
        slots = self._check_slots(slots)
        self._check_live(slots)
        self._check_ids("tokens", tokens, (len(slots),), f"[len(slots)] = ({len(slots)},)")
        self.flush([s for s in slots if s in self._dirty])
        self._bind(slots, 1)
        self._mode = "decode"
        try:
            logits = self._forward(tokens.reshape(-1, 1).to(self.device))
        finally:
            self._mode = None
        self._commit_io([1] * len(slots))
        for s in slots:
            self.lengths[s] += 1
        return logits[:, 0]

    @torch.no_grad()
    def verify(self, slots: list[int], rows: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """Verify ``rows [B, K]`` (the last accepted token, then ``K-1`` drafts) of each
        sequence; returns ``(logits [B, K, V], info)``, ``info`` with ``lazy`` (carried forms)
        and ``flushed`` (slots flushed before an eager verify). Call ``accept`` next; until then
        every other step raises ``ValueError``. ``ValueError`` (nothing run): ``slots`` not
        distinct, out of range or holding no sequence; ``rows`` not ``[len(slots), K]`` or
        outside the vocabulary; a previous verify not accepted."""
        self._check_idle("verify")
        slots = self._check_slots(slots)
        self._check_live(slots)
        self._check_ids("rows", rows, (len(slots), None), f"[len(slots), K] = ({len(slots)}, K)")
        B, K = rows.shape
        if K < 1:
            raise ValueError(f"rows: expected K >= 1 rows per sequence, got shape "
                             f"{tuple(rows.shape)}")
        if self.form == "chain" and K > 1 and (self.gdn[0].inter is None
                                               or K - 1 > self.gdn[0].inter.shape[1]):
            raise ValueError(f"rows: K = {K} exceeds the rows this cache was built for")
        info = {"lazy": None, "flushed": 0}
        if self.form == "chain":
            self.flush([s for s in slots if s in self._dirty])
        self._bind(slots, K)
        if self.form != "chain":
            info.update(self._spec.begin(slots, K))
            self._dirty.update(slots)
        self._mode, self._rows = "verify", K
        try:
            logits = self._forward(rows.to(self.device))
        except BaseException:
            if self._spec is not None:      # the carried step is abandoned, not left half-open
                for s in self._spec.abort():    # a slot whose state a stopped verify lost:
                    self._live.discard(s)       # no sequence until its next prefill
                    self._dirty.discard(s)
                    self.lengths[s] = 0
            raise
        finally:
            self._mode = None
        self._waiting = list(slots)
        return logits, info

    @torch.no_grad()
    def accept(self, accepted: list[int]) -> dict:
        """Accept ``a`` rows (``1 <= a <= K``) per sequence of the last verify: the carry's
        pending counts (one launch), or the chain's snapshot of row ``a-1`` copied back where
        ``a < K``; positions advance by ``a``. Returns ``{"write_backs"}`` (carried forms: the
        sequences whose verify wrote the state back, read from ``engaged``: one sync) or
        ``{"restored"}`` (chain). ``ValueError`` (nothing changed): no verify waiting (each
        verify is accepted once), or ``accepted`` not ``len(slots)`` ints in ``[1, K]`` (the
        verify then still waits)."""
        if self._waiting is None:
            raise ValueError("accept: no verify is waiting to be accepted (call verify(slots, "
                             "rows) first; each verify is accepted once)")
        slots, K = self._slots_host, self._rows
        acc = _checks.int_list("accepted", accepted)
        if len(acc) != len(slots) or not all(1 <= a <= K for a in acc):
            raise ValueError(f"accepted: expected {len(slots)} ints in [1, {K}], got {acc}")
        self._waiting = None
        if self.form == "chain":
            sel = [b for b, a in enumerate(acc) if a < K]
            if sel:
                bs = torch.tensor(sel, device=self.device)
                rows = torch.tensor([acc[b] - 1 for b in sel], device=self.device)
                dst = self._slot_long[bs]
                with self.timer("snapshot_restore"):
                    for lay in self.gdn:
                        lay.state[dst] = lay.inter[bs, rows]
                        lay.conv_state[dst] = lay.conv_inter[bs, rows]
            out = {"restored": len(sel)}
        else:
            wb = int((self._spec.engaged[0] == 2).sum())
            self._spec.accept(acc)
            out = {"write_backs": wb}
        self._commit_io(acc)
        for s, a in zip(slots, acc):
            self.lengths[s] += a
        for k, v in out.items():
            self._counts[k] += v
        return out

    def flush(self, slots: list[int]) -> None:
        """Fold the carried rows of ``slots`` into their states (every GDN layer and conv, one
        launch each); a no-op for an empty list."""
        if not slots or self._spec is None:
            return
        self._spec.flush(slots)
        self._dirty.difference_update(slots)

    def _reset_slot(self, slot: int) -> None:
        if not 0 <= slot < self.slots:
            raise ValueError(f"slot: expected an int in [0, {self.slots}), got {slot}")
        self.lengths[slot] = 0
        self._live.discard(slot)
        if self._spec is not None:
            self._spec.reset([slot])
        self._dirty.discard(slot)

    def release(self, slot: int) -> None:
        """The sequence in ``slot`` ended: forget its carried rows and length; the slot is free
        for the next prefill (``decode`` / ``verify`` refuse it until then). ``ValueError`` while a
        verify waits for its ``accept``."""
        self._check_idle("release")
        self._reset_slot(slot)

    # -- inspection -----------------------------------------------------------------------------
    @property
    def counts(self) -> dict:
        """Totals so far: ``write_backs`` (carried verifies that wrote the state back),
        ``restored`` (chain: snapshots copied back), ``flushes`` / ``flushed_slots`` (flush
        launches and the slots they folded: form switches and eager verifies after lazy ones),
        ``host_syncs`` (``SpecDecodeStep``'s pending-count reads)."""
        out = dict(write_backs=self._counts["write_backs"], restored=self._counts["restored"],
                   flushes=0, flushed_slots=0, host_syncs=0)
        if self._spec is not None:
            for k in ("flushes", "flushed_slots", "host_syncs"):
                out[k] = self._spec.stats[k]
        return out

    @torch.no_grad()
    def load_state(self, layer: int, slots: list[int], conv_window: torch.Tensor,
                   state: torch.Tensor) -> None:
        """Set GDN layer ``layer``'s conv windows ``[B, conv_dim, d_conv]`` and K-major states
        ``[B, HV, kd, vd]`` of ``slots`` (e.g. from transformers' cache, to test a layer from
        the same starting point); carried rows of those slots are forgotten, and they hold no
        sequence for ``decode`` / ``verify`` (for ``layer_decode``)."""
        self._check_idle("load_state")
        lay = self.gdn[layer]
        idx = torch.tensor(slots, device=self.device)
        lay.conv_state[idx] = conv_window.to(lay.conv_state.dtype)
        st = state.to(torch.float32)
        lay.state[idx] = st if self.layout == "kv" else st.transpose(-1, -2)
        for s in slots:
            self._reset_slot(s)

    @torch.no_grad()
    def layer_decode(self, module: nn.Module, hidden_states: torch.Tensor,
                     slots: list[int]) -> torch.Tensor:
        """One GDN layer alone, one decode token: ``hidden_states [B, 1, hidden]`` of the
        sequences in ``slots`` through ``module``'s projections, our ``conv_update`` +
        ``gdn_decode`` and its output path; returns ``[B, 1, hidden]`` (positions are not
        advanced: the attention layers are not involved)."""
        self._check_idle("layer_decode")
        self._bind(slots, 1)
        self._mode = "decode"
        try:
            return self.gdn_forward(module, hidden_states)
        finally:
            self._mode = None
            self._io_step = []

    def states(self, slot: int, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(conv_window [conv_dim, d_conv], state [HV, kd, vd])`` of ``slot`` in GDN layer
        ``layer`` (K-major whatever the layout; pending carried rows are not folded: flush
        first)."""
        lay = self.gdn[layer]
        st = lay.state[slot]
        return lay.conv_state[slot], st if self.layout == "kv" else st.transpose(-1, -2)
