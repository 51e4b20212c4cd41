"""FlashInfer's ReplaySSM verify as a ``ServingCache`` form (``form="replayssm"``; GPU only).

The peer of our ring form (SPEC §3d), driven like it: per GDN layer FlashInfer's 32-row ring
(``ReplaySSMRing``: bf16 keys and corrections, fp32 cumulative log decays, indexed by slot) over
a bf16 V-major state pool, one verify launch per layer (``gated_delta_rule_mtp_ucache_flush``,
which folds a request's window into the state where ``hist_len >= flush_min``, FlashInfer's
default ``16 - K + 1``), and the caller-owned cursor commit (``replayssm_commit``). Every layer
receives the same accepts, so one pair of per-slot cursors (``len``, ``base``) serves all of
them; a verify gathers the step's sequences' cursors and the commit scatters them back.

What it takes (FlashInfer 0.7.2's kernels): ``kd = vd = 128``, ``K`` in {4, 8}, bf16 inputs:
the conv output ``q, k, v`` and the gating inputs ``a, b`` rounded to bf16, ``A_log`` and
``dt_bias`` cast to bf16 by FlashInfer, the gating computed in its kernel. So its tokens also
carry that input rounding, which our forms (fp32 inputs, fp32 gating) do not: a property of the
peer as serving engines call it. The conv keeps our exact conv carry (lazy), as in the ring form.
A plain decode step (no drafts) first folds the windows with our ring flush kernel
(``gdn_ring_flush``), whose ring layout (``NS = 32`` rows, ``R = 16``) is FlashInfer's.
"""

from __future__ import annotations

import torch

from pmll_lab import _checks
from pmll_lab.carry import ConvCarry, GdnRing, carry_accept, conv_carry_flush, conv_carry_verify
from pmll_lab.carry import gdn_ring_flush
from pmll_lab.peers import flashinfer_status
from pmll_lab.peers_replayssm import (REPLAYSSM_HEAD_DIM, REPLAYSSM_ROWS, REPLAYSSM_WINDOW,
                                      ReplaySSMRing, replayssm_available, replayssm_commit,
                                      replayssm_runner)


def why_not(dims, K: int | None, state_dtype, state_layout: str) -> str | None:
    """Why FlashInfer's ReplaySSM cannot run this configuration here (None: it can):
    FlashInfer missing or no GPU, a head size other than 128, ``K`` outside {4, 8}, a pool that
    is not bf16 or not V-major."""
    if not replayssm_available():
        return f"unsupported here: {flashinfer_status()}"
    if dims.k_dim != REPLAYSSM_HEAD_DIM or dims.v_dim != REPLAYSSM_HEAD_DIM:
        return (f"unsupported: FlashInfer's ReplaySSM takes kd = vd = {REPLAYSSM_HEAD_DIM}, the "
                f"model has kd = {dims.k_dim}, vd = {dims.v_dim}")
    if K is not None and int(K) not in REPLAYSSM_ROWS:
        return f"unsupported: FlashInfer's ReplaySSM takes K in {REPLAYSSM_ROWS}, got {K}"
    if state_dtype != torch.bfloat16:
        return f"unsupported: FlashInfer's ReplaySSM takes a bf16 pool, got {state_dtype}"
    if state_layout != "vk":
        return "unsupported: FlashInfer's ReplaySSM takes a V-major pool (state_layout='vk')"
    return None


def replayssm_why_not(model, p: dict) -> str | None:
    """``why_not`` for a tokens-sweep point ``p`` on ``model``."""
    from pmll_lab.models.qwen3_next import GdnDims, gdn_layers

    dims = GdnDims.of(gdn_layers(model)[0])
    return why_not(dims, p.get("K"), getattr(torch, p["state_dtype"]), p["state_layout"])


class ReplaySSMStep:
    """``SpecDecodeStep``'s interface (``begin``, ``verify_layer``, ``engaged``, ``accept``,
    ``flush``, ``reset``, ``abort``, ``stats``) over FlashInfer's ReplaySSM (module docstring),
    built by ``replayssm_stack``. ``verify_layer(i, x=, a=, b=)`` takes the raw gating inputs
    ``a, b [B, K, HV]`` (the kernel computes the gating)."""

    raw_gating = True

    def __init__(self, cache):
        lay0 = cache.gdn[0]
        why = why_not(lay0.dims, None, lay0.state.dtype, cache.layout)
        if why is not None:
            raise ValueError(f"form: 'replayssm' {why}")
        S, dev = cache.slots, cache.device
        self.cache, self.device, self.slots = cache, dev, S
        self.len = torch.zeros(S, dtype=torch.int32, device=dev)     # per-slot cursors
        self.base = torch.zeros(S, dtype=torch.int32, device=dev)
        self.layers = []
        for lay in cache.gdn:
            d = lay.dims
            ring = ReplaySSMRing.empty(S, 1, d.num_k_heads, d.num_v_heads, d.k_dim, d.v_dim, dev)
            lay.conv_carry = ConvCarry.empty(S, d.conv_dim, cap=cache.cap,
                                             dtype=cache.conv_dtype, device=dev)
            m = lay.module
            self.layers.append((lay, ring, m.A_log.detach().float().contiguous(),
                                m.dt_bias.detach().float().contiguous()))
        self.timer = cache.timer
        self._cur = None
        self._engaged = [None] * len(self.layers)
        self._conv_engaged = [None] * len(self.layers)
        self.stats = dict(steps=0, flushes=0, flushed_slots=0, host_syncs=0)

    def _slots(self, slots):
        host = _checks.index_tensor("slots", slots, self.slots, distinct=True)
        return host, host.to(torch.int32).to(self.device)

    def begin(self, slots, rows: int) -> dict:
        if rows not in REPLAYSSM_ROWS:
            raise ValueError(f"rows: FlashInfer's ReplaySSM takes K in {REPLAYSSM_ROWS}, got "
                             f"{rows}")
        host, dev = self._slots(slots)
        idx = dev.long()
        flush_min = REPLAYSSM_WINDOW - rows + 1
        hist, base = self.len[idx].contiguous(), self.base[idx].contiguous()
        self._cur = (host, dev, rows, flush_min, hist, base)
        self._engaged = [(hist >= flush_min).to(torch.int32) + 1] * len(self.layers)
        self._verified = [False] * len(self.layers)
        self._conv_engaged = [None] * len(self.layers)
        self.stats["steps"] += 1
        return {"lazy": True, "flushed": 0, "synced": False}

    def verify_layer(self, i: int, *, x, a, b):
        host, dev, rows, flush_min, hist, base = self._cur
        lay, ring, A_log, dt_bias = self.layers[i]
        with self.timer("conv_verify"):
            y, eng_c = conv_carry_verify(lay.conv_state, lay.conv_carry, x, lay.conv_weight,
                                         lay.conv_bias, slot_tab=dev, lazy=True,
                                         head_dim=lay.dims.k_dim)
        self._conv_engaged[i] = eng_c
        q, k, v = (t.to(torch.bfloat16).contiguous() for t in lay.qkv(y))
        step_ring = ReplaySSMRing(k=ring.k, u=ring.u, g=ring.g, hist_len=hist, cache_base=base)
        run, o = replayssm_runner(q, k, v, A_log, a.to(torch.bfloat16), dt_bias,
                                  b.to(torch.bfloat16), lay.state, dev, step_ring,
                                  scale=lay.dims.k_dim ** -0.5, flush_min=flush_min)
        with self.timer("gdn_verify"):
            run()
        self._verified[i] = True
        return o

    @property
    def engaged(self) -> list:
        return list(self._engaged)

    def accept(self, accepted) -> None:
        host, dev, rows, flush_min, hist, base = self._cur
        acc = _checks.int_list("accepted", accepted)
        if len(acc) != host.numel() or not all(0 <= a <= rows for a in acc):
            raise ValueError(f"accepted: expected {host.numel()} ints in [0, {rows}], got {acc}")
        a = torch.tensor(acc, dtype=torch.int32).to(self.device)
        with self.timer("accept"):
            carry_accept([lay.conv_carry for lay, *_ in self.layers], dev,
                         self._conv_engaged[0], a, rows=rows)
            cur = ReplaySSMRing(k=self.layers[0][1].k, u=self.layers[0][1].u,
                                g=self.layers[0][1].g, hist_len=hist, cache_base=base)
            replayssm_commit(cur, a, flush_min)
            idx = dev.long()
            self.len[idx] = hist
            self.base[idx] = base
        self._cur = None

    def abort(self) -> None:
        """Abandon the step in progress. Layers verified in it may have folded their windows
        while the shared cursors were not committed: the step's slots hold no consistent state
        afterwards and must be released (``ServingCache`` aborts only when a verify raised)."""
        self._cur = None

    def flush(self, slots) -> None:
        host, dev = self._slots(slots)
        if host.numel() == 0:
            return
        idx = dev.long()
        rings = [GdnRing(k=ring.k, u=ring.u, G=ring.g, len=self.len, base=self.base,
                         length=REPLAYSSM_WINDOW) for _, ring, *_ in self.layers]
        with self.timer("gdn_flush"):
            gdn_ring_flush([lay.state for lay, *_ in self.layers], rings, dev)
        with self.timer("conv_flush"):
            conv_carry_flush([lay.conv_state for lay, *_ in self.layers],
                             [lay.conv_carry for lay, *_ in self.layers], dev)
        self.len[idx] = 0
        for lay, *_ in self.layers:
            lay.conv_carry.pend.index_fill_(0, idx, 0)
        self.stats["flushes"] += 1
        self.stats["flushed_slots"] += int(host.numel())

    def reset(self, slots) -> None:
        self.abort()
        host, dev = self._slots(slots)
        idx = dev.long()
        self.len[idx] = 0
        self.base[idx] = 0
        for lay, ring, *_ in self.layers:
            lay.conv_carry.reset(host)
            for t in (ring.k, ring.u, ring.g):
                t.index_fill_(0, idx, 0)

