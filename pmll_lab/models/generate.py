"""Greedy and speculative generation on a hybrid GDN model, through our kernels.

``greedy_generate`` decodes one token per sequence per step (``conv_update`` + ``gdn_decode``);
``speculative_generate`` verifies ``K`` rows per sequence per step (the last accepted token and
``K - 1`` draft tokens) with the carried state (``form="exact"``), the snapshot
chain (``"chain"``), the ring form (``"ring"``) or FlashInfer's ReplaySSM (``"replayssm"``, a
peer, GPU only), accepts the longest prefix of drafts that equals the target's greedy choice
plus the target's next token, as serving engines do (Leviathan et al. 2023, greedy case). Both
run continuous batching over a ``ServingCache`` (``pmll_lab.models.cache``).

Conventions (both functions):

- ``input_ids``: a list of 1-D LongTensors / lists of ints (one prompt each, any lengths), or a
  LongTensor ``[N, T]`` with an optional ``attention_mask [N, T]`` (1 = token, 0 = padding, left
  or right; a row's tokens must be contiguous). No padding ever reaches the model: each prompt is
  prefilled alone, in its own slot.
- ``batch_size``: sequences decoded together (slots; default ``N``). When a sequence ends (its
  ``max_new_tokens``: an int >= 1, or one int >= 1 per prompt; or an ``eos_token_id``) its slot is released and
  the next waiting prompt is prefilled into it.
- Output: LongTensor ``[N, max(max_new_tokens)]`` of generated tokens (the prompt excluded),
  ``pad_token_id`` (an int, default -1) after a sequence's end.
- ``K``: rows verified per step, ``2 <= K <= 8`` (the carry's CAP); ``K - 1`` draft tokens.
  A step emits ``a`` tokens, ``1 <= a <= K`` (the acceptance length). When no sequence of a
  step has a draft token the step is a plain decode (a form switch: slots holding carried rows
  are flushed first); a sequence with fewer than ``K - 1`` proposals is padded with its last
  token.
- Statistics: ``return_stats=True`` returns ``(tokens, GenerationStats)``; per step: kind,
  batch, K, form, lazy, acceptance, write-backs / restored snapshots, flushes, wall time, and
  with ``timing=True`` the time of every kernel section (``StepTimer``: CUDA events on a GPU,
  interpreter wall time on the CPU); ``output_logits=True`` keeps, per prompt, the logits row
  each generated token was chosen from.
"""

from __future__ import annotations

import numbers
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from pmll_lab import _checks
from pmll_lab.carry import (GDN_CARRY_CAP, GDN_CARRY_EAGER_MAX_PENDING, GDN_CARRY_LAZY_MIN_SEQS,
                            RING_DEFAULT_LENGTH, check_form)
from pmll_lab.models.cache import FORMS, ServingCache
from pmll_lab.models.common import vocab_size
from pmll_lab.models.timing import StepTimer
from pmll_lab.models.drafts import DraftContext, check_draft_args, make_draft
from pmll_lab.ops.gdn.recurrence import DEFAULT_STATE_LAYOUT


@dataclass
class GenerationStats:
    """What a generation did. ``steps``: one dict per decode / verify step (keys: ``step``,
    ``kind`` "decode"|"verify", ``batch``, ``rows`` (K; 1 for decode), ``form``, ``lazy``
    (carried forms; else None), ``emitted`` (tokens kept), ``accepted`` (sum of the acceptance
    lengths ``a``), ``write_backs``, ``restored``, ``flushes``, ``flushed_slots``, ``step_ms``
    (wall), ``draft_ms``, and ``<section>_ms`` per kernel section with ``timing=True``).
    ``prefills``: one dict per prompt (``index``, ``slot``, ``tokens``, ``ms``).
    ``accept_lengths``: every sequence's ``a`` of every verify step. ``seq_steps``: one
    ``(prompt index, rows, drafted, a, emitted)`` per sequence and step (``rows``: K, 1 for a
    decode step; ``drafted``: draft tokens proposed before padding to ``K - 1``; ``a``: rows
    accepted; ``emitted``: tokens kept, fewer than ``a`` where the budget ended). ``logits``: per prompt a
    ``[n_i, V]`` tensor (``output_logits=True``), else None. ``gdn_io``: with
    ``record_gdn_io=True`` every GDN layer's kernel input and output per accepted token,
    ``{(prompt index, layer, position): (x, o)}`` (``ServingCache``'s ``record``), else None.
    ``device``: where it ran."""

    steps: list = field(default_factory=list)
    prefills: list = field(default_factory=list)
    accept_lengths: list = field(default_factory=list)
    seq_steps: list = field(default_factory=list)
    logits: list | None = None
    gdn_io: dict | None = None
    device: str = ""

    def frame(self):
        """``steps`` as a pandas DataFrame."""
        import pandas as pd

        return pd.DataFrame(self.steps)

    def summary(self) -> dict:
        """Totals: ``tokens`` (by decode/verify steps), ``steps``, ``verify_steps``,
        ``mean_accept`` (mean acceptance length over sequence-steps of verifies),
        ``decode_ms`` (wall time of all steps), ``tokens_per_s`` (over that time),
        ``prefill_ms``, ``write_backs``, ``restored``, ``flushes``, ``flushed_slots``."""
        st = self.steps
        ms = sum(r["step_ms"] for r in st)
        toks = sum(r["emitted"] for r in st)
        acc = self.accept_lengths
        return dict(
            tokens=toks, steps=len(st), verify_steps=sum(r["kind"] == "verify" for r in st),
            mean_accept=(sum(acc) / len(acc)) if acc else float("nan"), decode_ms=ms,
            tokens_per_s=(toks / ms * 1e3) if ms else float("nan"),
            prefill_ms=sum(p["ms"] for p in self.prefills),
            **{k: sum(r[k] for r in st) for k in ("write_backs", "restored", "flushes",
                                                  "flushed_slots")})


def _pad(pad_token_id) -> int:
    if isinstance(pad_token_id, bool) or not isinstance(pad_token_id, numbers.Integral):
        raise TypeError(f"pad_token_id: expected an int (the id written after a sequence's "
                        f"end; default -1), got {pad_token_id!r}")
    return int(pad_token_id)


def check_prompts(input_ids, attention_mask, vocab: int | None = None) -> list[torch.Tensor]:
    """1-D int64 CPU tensors, one per prompt (module docstring: the convention); with
    ``vocab``, every token id must lie in ``[0, vocab)``."""
    out = _prompt_rows(input_ids, attention_mask)
    if vocab is not None:
        for i, p in enumerate(out):
            lo, hi = int(p.min()), int(p.max())
            if lo < 0 or hi >= vocab:
                raise ValueError(f"input_ids: prompt {i} has token ids {lo}..{hi}, outside the "
                                 f"model's vocabulary [0, {vocab})")
    return out


def _prompt_rows(input_ids, attention_mask) -> list[torch.Tensor]:
    if isinstance(input_ids, torch.Tensor):
        if input_ids.dim() != 2 or input_ids.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"input_ids: expected a LongTensor [N, T] or a list of prompts, "
                             f"got {input_ids.dtype} of shape {tuple(input_ids.shape)}")
        rows = input_ids.cpu().long()
        if attention_mask is None:
            return [r for r in rows]
        m = torch.as_tensor(attention_mask).cpu()
        if m.shape != rows.shape:
            raise ValueError(f"attention_mask: expected shape {tuple(rows.shape)}, got "
                             f"{tuple(m.shape)}")
        out = []
        for i, (r, mi) in enumerate(zip(rows, m.bool())):
            idx = mi.nonzero().flatten()
            if idx.numel() == 0 or idx[-1] - idx[0] + 1 != idx.numel():
                raise ValueError(f"attention_mask: row {i} must mark one contiguous, non-empty "
                                 "run of tokens (left or right padding)")
            out.append(r[idx])
        return out
    if attention_mask is not None:
        raise ValueError("attention_mask: only with a 2-D input_ids tensor")
    if not isinstance(input_ids, (list, tuple)) or not input_ids:
        raise ValueError("input_ids: expected a LongTensor [N, T] or a non-empty list of prompts")
    out = []
    for i, p in enumerate(input_ids):
        t = torch.as_tensor(p).cpu()
        if t.dim() != 1 or t.numel() == 0 or t.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"input_ids: prompt {i} must be a non-empty 1-D int sequence")
        out.append(t.long())
    return out


def _budgets(max_new_tokens, n: int) -> list[int]:
    vals = _checks.int_list("max_new_tokens", max_new_tokens)
    if len(vals) == 1:
        vals = vals * n
    if len(vals) != n or min(vals) < 1:
        raise ValueError(f"max_new_tokens: expected an int >= 1, or one int >= 1 per prompt "
                         f"({n}), got {max_new_tokens!r}")
    return vals


def _eos(model, eos_token_id) -> set[int]:
    if eos_token_id is None:
        gc = getattr(model, "generation_config", None)
        eos_token_id = getattr(gc, "eos_token_id", None)
    if eos_token_id is None:
        return set()
    return set(_checks.int_list("eos_token_id", eos_token_id))


class _Run:
    """Continuous batching shared by both loops: slots, the prompt queue, emission, stats."""

    def __init__(self, model, prompts, budgets, *, batch_size, eos, cache, timer,
                 output_logits):
        self.model, self.prompts, self.budgets, self.eos = model, prompts, budgets, eos
        self.cache, self.timer = cache, timer
        n = len(prompts)
        self.out: list[list[int]] = [[] for _ in range(n)]
        self.rows: list[list] | None = [[] for _ in range(n)] if output_logits else None
        self.queue = deque(range(n))
        self.free = list(range(batch_size))[::-1]
        self.active: dict[int, int] = {}      # slot -> prompt index
        self.stats = GenerationStats(device=str(cache.device))

    def done(self, i: int) -> bool:
        o = self.out[i]
        return len(o) >= self.budgets[i] or (bool(o) and o[-1] in self.eos)

    def emit(self, i: int, tokens: Sequence[int], logits=None) -> None:
        for j, t in enumerate(tokens):
            if self.done(i):
                break
            self.out[i].append(int(t))
            if self.rows is not None:
                self.rows[i].append(logits[j].detach().float().cpu())

    def admit(self) -> None:
        while self.free and self.queue:
            i, slot = self.queue.popleft(), self.free.pop()
            t0 = time.perf_counter()
            lg = self.cache.prefill(slot, self.prompts[i], tag=i)
            tok = int(lg.argmax())
            self.stats.prefills.append(dict(index=i, slot=slot, tokens=len(self.prompts[i]),
                                            ms=(time.perf_counter() - t0) * 1e3))
            self.emit(i, [tok], lg[None])
            if self.done(i):
                self.cache.release(slot)
                self.free.append(slot)
            else:
                self.active[slot] = i
        self.timer.collect()          # prefill sections are not a step's

    def retire(self) -> None:
        for slot, i in list(self.active.items()):
            if self.done(i):
                del self.active[slot]
                self.cache.release(slot)
                self.free.append(slot)

    def record(self, row: dict, t0: float, counts0: dict) -> None:
        row["step_ms"] = (time.perf_counter() - t0) * 1e3
        c = self.cache.counts
        for k in ("flushes", "flushed_slots"):
            row[k] = c[k] - counts0[k]
        row.update({f"{k}_ms": v for k, v in self.timer.collect().items()})
        row["step"] = len(self.stats.steps)
        self.stats.steps.append(row)

    def result(self, pad: int, return_stats: bool):
        width = max(self.budgets)
        toks = torch.full((len(self.out), width), pad, dtype=torch.long)
        for i, o in enumerate(self.out):
            toks[i, :len(o)] = torch.tensor(o, dtype=torch.long)
        if self.rows is not None:
            self.stats.logits = [torch.stack(r) for r in self.rows]
        self.stats.gdn_io = self.cache.gdn_io
        return (toks, self.stats) if return_stats else toks

    # -- one decode step over the active sequences ------------------------------------------------
    def decode_step(self, slots: list[int], t0: float, draft_ms: float = 0.0) -> None:
        counts0 = self.cache.counts
        idx = [self.active[s] for s in slots]
        last = torch.tensor([self.out[i][-1] for i in idx])
        logits = self.cache.decode(slots, last)
        nxt = logits.argmax(-1).tolist()
        for b, i in enumerate(idx):
            n0 = len(self.out[i])
            self.emit(i, [nxt[b]], logits[b:b + 1])
            self.stats.seq_steps.append((i, 1, 0, 1, len(self.out[i]) - n0))
        self.record(dict(kind="decode", batch=len(slots), rows=1, form=None, lazy=None,
                         emitted=len(slots), accepted=0, write_backs=0, restored=0,
                         draft_ms=draft_ms), t0, counts0)


def make_cache(model, prompts, budgets, rows, batch_size, state_layout, form, lazy_min_seqs,
                eager_max_pending, timing, record=False, state_dtype=torch.float32,
                ring_length=RING_DEFAULT_LENGTH):
    param = next(model.parameters())
    timer = StepTimer(param.device, enabled=timing)
    max_len = max(len(p) for p in prompts) + max(budgets) + rows + 1
    cache = ServingCache(model, slots=batch_size, max_len=max_len, state_layout=state_layout,
                         form=form, rows=rows, lazy_min_seqs=lazy_min_seqs,
                         eager_max_pending=eager_max_pending, timer=timer, record=record,
                         state_dtype=state_dtype, ring_length=ring_length)
    return cache, timer


def _batch(batch_size, n):
    if batch_size is None:
        return n
    return _checks.positive_int("batch_size", batch_size)


@torch.no_grad()
def greedy_generate(model: nn.Module, input_ids, *, max_new_tokens,
                    state_layout: str = DEFAULT_STATE_LAYOUT,
                    attention_mask=None, batch_size: int | None = None, eos_token_id=None,
                    pad_token_id: int = -1, timing: bool = False, output_logits: bool = False,
                    record_gdn_io: bool = False, return_stats: bool = False,
                    state_dtype: torch.dtype = torch.float32):
    """Greedy decoding, one token per sequence per step through ``conv_update`` +
    ``gdn_decode`` (SPEC §2) in every GDN layer; the model's attention, MLP and norms as they are.

    Args (module docstring: the conventions): ``model`` a transformers Qwen3-Next / Qwen3.5
    causal LM (random or a checkpoint; patched by ``patch_model``); ``input_ids``,
    ``attention_mask``, ``max_new_tokens``, ``batch_size``, ``eos_token_id`` (default: the
    model's ``generation_config``), ``pad_token_id``; ``state_layout`` ``"vk"`` (default, as
    every GDN launcher's) or ``"kv"``; ``state_dtype`` the GDN state pool's dtype (fp32, bf16,
    fp16); ``timing`` times each kernel section; ``output_logits`` keeps the logits rows;
    ``record_gdn_io`` keeps every GDN kernel input/output row; ``return_stats`` returns
    ``(tokens, GenerationStats)``.

    Returns LongTensor ``[N, max(max_new_tokens)]``. Raises ``ValueError``/``TypeError`` naming
    the argument, before any step: ``model`` not a causal LM (``TypeError``) or without GDN
    layers, ``max_new_tokens`` not an int >= 1 (or one per prompt), ``pad_token_id`` not an int
    (``TypeError``), bad prompts, mask, layout or batch. Prompts are prefilled with transformers' own torch path.
    """
    prompts = check_prompts(input_ids, attention_mask, vocab_size(model))
    budgets = _budgets(max_new_tokens, len(prompts))
    bs = _batch(batch_size, len(prompts))
    pad = _pad(pad_token_id)
    cache, timer = make_cache(model, prompts, budgets, 1, bs, state_layout, "exact", None, None,
                               timing, record_gdn_io, state_dtype)
    run = _Run(model, prompts, budgets, batch_size=bs, eos=_eos(model, eos_token_id),
               cache=cache, timer=timer, output_logits=output_logits)
    run.admit()
    while run.active:
        run.decode_step(sorted(run.active), time.perf_counter())
        run.retire()
        run.admit()
    return run.result(pad, return_stats)


@torch.no_grad()
def speculative_generate(model: nn.Module, input_ids, *, max_new_tokens, draft, K: int,
                         form: str = "exact", lazy: bool = True,
                         state_layout: str = DEFAULT_STATE_LAYOUT,
                         draft_accept: float | None = None, reference=None, draft_seed: int = 0,
                         lazy_min_seqs: int = GDN_CARRY_LAZY_MIN_SEQS,
                         eager_max_pending: int | None = GDN_CARRY_EAGER_MAX_PENDING,
                         attention_mask=None, batch_size: int | None = None, eos_token_id=None,
                         pad_token_id: int = -1, timing: bool = False,
                         output_logits: bool = False, record_gdn_io: bool = False,
                         return_stats: bool = False, state_dtype: torch.dtype = torch.float32,
                         ring_length: int = RING_DEFAULT_LENGTH, forced_reject: bool = False):
    """Speculative decoding with a greedy target: per step ``K`` rows per sequence verified in
    every GDN layer, the longest agreeing draft prefix accepted (module docstring).

    Args (beyond ``greedy_generate``'s):
        draft: ``"ngram"`` (prompt lookup), ``"noisy"`` (the target's own greedy continuation,
            each token wrong with probability ``1 - draft_accept``) or a callable
            ``draft(contexts, n) -> list[list[int]]`` (``pmll_lab.models.drafts``).
        K: rows per verify, ``2 <= K <= 8``.
        form: ``"exact"`` (carried state, bitwise equal to decoding: the same tokens as
            ``greedy_generate``), ``"chain"`` (snapshot chain, bitwise equal to decoding) or
            ``"ring"`` (the ring form of ``ring_length`` rows, a tolerance form; needs
            ``state_layout="vk"``) or ``"replayssm"`` (FlashInfer's ReplaySSM, a peer:
            ``pmll_lab.models.replayssm_stack``).
        state_dtype: the GDN state pool's dtype (fp32, bf16, fp16).
        forced_reject: every verify accepts one row (the target's own next token) whatever
            the drafts: the state is rolled back on every step (SGLang's rollback test).
        lazy: carried forms: lazy write-back from ``lazy_min_seqs`` sequences in a step, eager
            below (``False``: always eager); ``eager_max_pending`` as in ``SpecDecodeStep``.
        draft_accept, reference, draft_seed: the noisy draft's ``p``, the greedy tokens it
            perturbs (``[N, T]`` or lists; default: computed here by ``greedy_generate`` with
            the same model, layout and batch, which costs a full greedy run) and its seed;
            ``draft_accept`` and ``reference`` only with ``draft="noisy"`` (``ValueError``).

    Returns LongTensor ``[N, max(max_new_tokens)]`` (or ``(tokens, GenerationStats)``). Raises
    ``ValueError``/``TypeError`` naming the argument.
    """
    prompts = check_prompts(input_ids, attention_mask, vocab_size(model))
    budgets = _budgets(max_new_tokens, len(prompts))
    bs = _batch(batch_size, len(prompts))
    pad = _pad(pad_token_id)
    check_draft_args(draft, draft_accept, reference)
    _checks.positive_int("K", K, minimum=2, maximum=GDN_CARRY_CAP)
    check_form("form", form, FORMS)
    _checks.flag("lazy", lazy)
    _checks.flag("forced_reject", forced_reject)
    vocab = vocab_size(model)
    if reference is not None and len(reference) < len(prompts):
        raise ValueError(f"reference: {len(reference)} continuation(s) for {len(prompts)} "
                         f"prompts; give one per prompt")
    if draft == "noisy" and reference is None and draft_accept is not None:
        reference = greedy_generate(model, prompts, max_new_tokens=budgets,
                                    state_layout=state_layout, batch_size=bs,
                                    eos_token_id=eos_token_id)
    drafter = make_draft(draft, draft_accept=draft_accept, reference=reference,
                         vocab_size=vocab, seed=draft_seed)
    cache, timer = make_cache(model, prompts, budgets, K, bs, state_layout, form,
                               lazy_min_seqs if lazy else None, eager_max_pending, timing,
                               record_gdn_io, state_dtype, ring_length)
    run = _Run(model, prompts, budgets, batch_size=bs, eos=_eos(model, eos_token_id),
               cache=cache, timer=timer, output_logits=output_logits)
    run.admit()
    while run.active:
        slots = sorted(run.active)
        t0 = time.perf_counter()
        idx = [run.active[s] for s in slots]
        ctx = [DraftContext(i, run.prompts[i].tolist(), run.out[i]) for i in idx]
        props = _proposals(drafter(ctx, K - 1), len(slots), K - 1, vocab)
        draft_ms = (time.perf_counter() - t0) * 1e3
        if not any(props):
            run.decode_step(slots, t0, draft_ms)
        else:
            _verify_step(run, slots, idx, props, K, form, t0, draft_ms, forced_reject)
        run.retire()
        run.admit()
    return run.result(pad, return_stats)


def _proposals(props, B: int, n: int, vocab: int) -> list[list[int]]:
    if not isinstance(props, (list, tuple)) or len(props) != B:
        raise ValueError(f"draft: must return one list of proposed tokens per sequence ({B}), "
                         f"got {type(props).__name__}")
    out = []
    for b, p in enumerate(props):
        if isinstance(p, (str, bytes, torch.Tensor)) or not isinstance(p, Iterable):
            raise ValueError(f"draft: sequence {b}'s proposals must be a list of token ids "
                             f"(possibly empty), got {type(p).__name__}")
        p = _checks.int_list("draft", list(p))[:n]
        if any(not 0 <= t < vocab for t in p):
            raise ValueError(f"draft: proposed token ids must lie in [0, {vocab}), got {p}")
        out.append(p)
    return out


def _verify_step(run: _Run, slots, idx, props, K, form, t0, draft_ms,
                 forced_reject=False) -> None:
    counts0 = run.cache.counts
    rows = torch.tensor([[run.out[i][-1]] + p + [run.out[i][-1]] * (K - 1 - len(p))
                         for i, p in zip(idx, props)])
    logits, info = run.cache.verify(slots, rows)
    pred = logits.argmax(-1).tolist()
    rows_l = rows.tolist()
    acc = []
    for b in range(len(slots)):
        a = 1
        while a < K and rows_l[b][a] == pred[b][a - 1] and not forced_reject:
            a += 1
        acc.append(a)
    res = run.cache.accept(acc)
    before = [len(run.out[i]) for i in idx]
    emitted = 0
    for b, (i, a) in enumerate(zip(idx, acc)):
        n0 = len(run.out[i])
        run.emit(i, rows_l[b][1:a] + [pred[b][a - 1]], logits[b])
        emitted += len(run.out[i]) - n0
    run.stats.accept_lengths.extend(acc)
    run.stats.seq_steps.extend((i, K, len(p), a, len(run.out[i]) - n0)
                               for i, a, p, n0 in zip(idx, acc, props, before))
    run.record(dict(kind="verify", batch=len(slots), rows=K, form=form, lazy=info["lazy"],
                    emitted=emitted, accepted=sum(acc), write_backs=res.get("write_backs", 0),
                    restored=res.get("restored", 0), draft_ms=draft_ms), t0, counts0)
