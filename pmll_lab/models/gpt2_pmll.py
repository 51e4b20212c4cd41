"""GPT-2 run segment by segment through the PMLL ring (SPEC §1's equivalence on a real model).

Hugging Face's ``GPT2LMHeadModel`` computes each layer's attention through a function looked up
by name (``transformers.AttentionInterface``). This module registers one, ``"pmll_ring"``, that
hands the layer's ``q, k, v [B, H, T, D]`` to ``pmll_lab.pmll.pmll_step`` with that layer's
``RingMemory``: attention over the ring and the segment, then the segment written into the
ring. ``segmented_logits`` feeds a sequence segment by segment (positions continuing, no KV
cache), so each segment sees earlier tokens only through the rings. With ``gate=None`` and a
capacity at least the sequence length nothing is evicted and the logits equal the
whole-sequence forward (``full_logits``) up to rounding; with a smaller capacity the oldest
rows are overwritten and the logits drift; a gate ``g < 1`` blends each token into its slot
instead of replacing it (``slot = g*new + (1-g)*old``).

The model is built from a small seeded random ``GPT2Config`` (``tiny_gpt2``): no download, the
architecture (learned absolute positions, pre-LayerNorm blocks, ``D**-0.5`` scaling, tied
embeddings) is GPT-2's. Source: Radford et al. 2019 (GPT-2), as implemented in transformers.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch

from pmll_lab import _checks
from pmll_lab.backend import DEVICE
from pmll_lab.pmll import RingMemory, pmll_step

ATTN_NAME = "pmll_ring"
"""Name under which the PMLL attention function is registered in ``transformers``."""


@dataclass
class SegmentState:
    """What the registered attention function needs during one segment's forward: one ring
    per layer (None: memory off), the gate value (None: ``g = 1``; a float in ``(0, 1]``: every
    token blended with that weight) and ``impl`` for ``memory_attention``."""

    mems: list[RingMemory | None]
    gate: float | None = None
    impl: str | None = None
    calls: list[int] = field(default_factory=list)

    def gate_for(self, batch: int, tokens: int, device) -> torch.Tensor | None:
        if self.gate is None:
            return None
        return torch.full((batch, tokens), float(self.gate), dtype=torch.float32, device=device)


def _pmll_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                    pmll_state: SegmentState | None = None, **kwargs):
    """``transformers`` attention function: ``query, key, value [B, H, T, D]`` -> ``(o [B, T,
    H, D], None)`` through ``pmll_step`` with the layer's ring."""
    if pmll_state is None:
        raise ValueError("pmll_state: the pmll_ring attention needs a SegmentState "
                         "(call segmented_logits)")
    head_dim = query.shape[-1]
    if scaling is not None and abs(float(scaling) - head_dim ** -0.5) > 1e-12 * head_dim:
        raise ValueError(f"scaling: PMLL attention scales by D**-0.5, the layer asks {scaling}")
    if dropout:
        raise ValueError(f"dropout: must be 0 (model.eval()), got {dropout}")
    if attention_mask is not None:
        raise ValueError("attention_mask: padding is not supported; feed unpadded segments")
    layer = module.layer_idx
    mem = pmll_state.mems[layer]
    gate = None if mem is None else pmll_state.gate_for(query.shape[0], query.shape[2],
                                                        query.device)
    o = pmll_step(mem, query, key, value, gate, impl=pmll_state.impl)
    pmll_state.calls.append(layer)
    return o.transpose(1, 2), None


def register() -> str:
    """Register the ``"pmll_ring"`` attention function with ``transformers`` (idempotent);
    returns its name."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_NAME, _pmll_attention)
    return ATTN_NAME


def tiny_gpt2(seed: int = 0, *, layers: int = 2, heads: int = 2, head_dim: int = 64,
              vocab: int = 256, positions: int = 256, dtype: torch.dtype = torch.float32,
              device=None):
    """A ``GPT2LMHeadModel`` with seeded random weights (transformers' GPT-2 initialisation,
    drawn under ``torch.manual_seed(seed)`` without disturbing the caller's RNG), dropout off,
    in eval mode, ``n_embd = heads * head_dim``, on ``device`` (default the kernels' device) in
    ``dtype``. Raises ``ValueError`` naming a bad size or dtype."""
    from transformers import GPT2Config, GPT2LMHeadModel

    for name, value in (("layers", layers), ("heads", heads), ("head_dim", head_dim),
                        ("vocab", vocab), ("positions", positions)):
        _checks.positive_int(name, value)
    _checks.choice("dtype", dtype, _checks.FLOAT_DTYPES)
    config = GPT2Config(vocab_size=vocab, n_positions=positions, n_embd=heads * head_dim,
                        n_layer=layers, n_head=heads, resid_pdrop=0.0, embd_pdrop=0.0,
                        attn_pdrop=0.0, use_cache=False, bos_token_id=vocab - 1,
                        eos_token_id=vocab - 1)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = GPT2LMHeadModel(config)
    model.set_attn_implementation("eager")
    return model.to(device=_checks.device("device", device, DEVICE), dtype=dtype).eval()


def token_ids(seed: int, batch: int, tokens: int, vocab: int, device=None) -> torch.Tensor:
    """``[B, T]`` int64 seeded uniform token ids on ``device`` (default the kernels' device)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, tokens), generator=gen)
    return ids.to(_checks.device("device", device, DEVICE))


@contextlib.contextmanager
def _attention(model, name: str):
    before = model.config._attn_implementation
    model.set_attn_implementation(name)
    try:
        yield model
    finally:
        model.set_attn_implementation(before)


@torch.no_grad()
def full_logits(model, ids: torch.Tensor, *, attn: str = "eager") -> torch.Tensor:
    """Logits ``[B, L, V]`` of the whole sequence ``ids [B, L]`` in one forward, with
    transformers' own attention ``attn`` ("eager" or "sdpa")."""
    with _attention(model, attn):
        return model(input_ids=ids, use_cache=False).logits


@torch.no_grad()
def segmented_logits(model, ids: torch.Tensor, *, segment: int, capacity: int,
                     gate: float | None = None, impl: str | None = None,
                     mem_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Logits ``[B, L, V]`` of ``ids [B, L]`` fed in segments of ``segment`` tokens (the last
    may be shorter), positions continuing, each layer's attention through ``pmll_step`` over a
    ring of ``capacity`` rows per head (0: memory off, each segment sees only itself).

    ``gate``: None (each token replaces its slot) or a float in ``(0, 1]`` applied to every
    token (``pmll_write``'s blend). ``impl``: ``memory_attention``'s (default
    ``MEMORY_ATTENTION_IMPL``). ``mem_dtype``: the rings' dtype, which must be the model's
    (attention takes one dtype; default the model's). Raises ``ValueError`` naming ``segment``,
    ``capacity``, ``gate`` (also a gate with ``capacity=0``: no ring to blend into),
    ``mem_dtype`` or ``ids`` (empty, token ids outside the vocabulary, longer than the
    positions)."""
    _checks.tensor("ids", ids, ndim=2, dtype=(torch.int64, torch.int32))
    if ids.shape[1] < 1:
        raise ValueError(f"ids: need at least one token, got shape {tuple(ids.shape)}")
    _checks.positive_int("segment", segment)
    _checks.positive_int("capacity", capacity, minimum=0)
    if gate is not None and (isinstance(gate, bool) or not isinstance(gate, (int, float))
                             or not 0.0 < float(gate) <= 1.0):
        raise ValueError(f"gate: must be None or a float in (0, 1], got {gate!r}")
    if gate is not None and capacity == 0:
        raise ValueError("gate: capacity=0 keeps no ring for the gate to blend into; pass "
                         "gate=None")
    cfg = model.config
    batch, total = ids.shape
    if total > cfg.n_positions:
        raise ValueError(f"ids: {total} tokens, but the model has {cfg.n_positions} positions")
    if int(ids.min()) < 0 or int(ids.max()) >= cfg.vocab_size:
        raise ValueError(f"ids: token ids must lie in [0, {cfg.vocab_size}), got "
                         f"{int(ids.min())}..{int(ids.max())}")
    heads, head_dim = cfg.n_head, cfg.n_embd // cfg.n_head
    dtype = next(model.parameters()).dtype
    if mem_dtype is not None and mem_dtype != dtype:
        raise ValueError(f"mem_dtype: must be the model's dtype {dtype} (attention takes one "
                         f"dtype), got {mem_dtype}")
    mems = [None if capacity == 0 else
            RingMemory.empty(batch, heads, capacity, head_dim, dtype=dtype, device=ids.device)
            for _ in range(cfg.n_layer)]
    state = SegmentState(mems, gate, impl)
    outs = []
    with _attention(model, register()):
        for start in range(0, total, segment):
            stop = min(start + segment, total)
            pos = torch.arange(start, stop, device=ids.device)[None].expand(batch, -1)
            outs.append(model(input_ids=ids[:, start:stop], position_ids=pos, use_cache=False,
                              pmll_state=state).logits)
    if len(state.calls) != cfg.n_layer * len(outs):
        raise RuntimeError(f"pmll_ring attention ran {len(state.calls)} times, expected "
                           f"{cfg.n_layer * len(outs)}: the model did not route through it")
    return torch.cat(outs, dim=1)
