"""The tokens notebook: what exactness buys, in tokens (SPEC §4 "Tokens").

A trained Qwen3-Next-style model (``pmll_lab.models.tiny_gdn``) decodes held-out prompts of the
Python standard library greedily, plainly and speculatively with each carried-state form, with
prompt-lookup drafts (``pmll_lab.models.drafts.NgramDraft``), through ``ServingCache``:

==================  =================================================================
``plain``           ``greedy_generate``: one token per step (the references)
``exact_eager``     the exact carry, eager write-back on every verify with pending rows
``exact_lazy``      the exact carry, lazy: write-back only when the stash would overflow
``exact_policy``    the exact carry under the serving policy: lazy from 8 sequences in a
                    step, eager below, a slot over 4 pending rows flushed first
``chain_restore``   the chain with snapshots, the accepted row's snapshot copied back
``ring``            the ring form (SPEC §3d; a tolerance form)
``flashinfer_replayssm``  FlashInfer's ReplaySSM (GPU, bf16 pool; ``replayssm_stack``)
==================  =================================================================

Per (form, pool dtype, prompt, draft setting) the rows hold ``first_divergent_token`` (the
index of the first generated token that differs from plain greedy decoding with the same pool
dtype; -1 when none did within ``tokens``), ``first_divergent_token_fp32`` (the same against
fp32-pool plain decoding), ``accept_rate`` (draft rows accepted over the ``K - 1`` draft rows of
each verify) and ``tokens_per_step`` (tokens emitted per step the sequence took part in, the
prefill's token excluded); per point ``tokens_per_s`` (``prompt = -1``: all sequences, wall
time of the decode steps). ``forced_reject``: every verify accepts one row whatever the drafts
(the state rolled back on every step). The exact forms' first divergence must be -1 on every
prompt (``passed``; ``CheckFailed`` otherwise).

The dense layers run in float64 (``dtype``) with float64 norms, so that a row gets the same bits,
to the fp32 kernel inputs' last bit, in a verify of ``B*K`` rows as in a decode of ``B``: every
divergence is then the GDN state form's, not the dense path's (``docs/models.md``).
Tables and plots: ``pmll_lab.experiments.tokens_report``.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

import torch

from pmll_lab import _checks
from pmll_lab.backend import DEVICE
from pmll_lab.carry import GDN_CARRY_EAGER_MAX_PENDING, GDN_CARRY_LAZY_MIN_SEQS
from pmll_lab.experiments import protocol as P
from pmll_lab.sweep import CheckFailed
from pmll_lab.harness import step_forms as SF
from pmll_lab.ops.carry.ring import RING_LENGTHS
from pmll_lab.ops.carry.stash import GDN_CARRY_CAP

FORMS = ("plain", SF.EXACT_EAGER.name, SF.EXACT_LAZY.name, "exact_policy", SF.CHAIN_RESTORE.name,
         SF.RING.name, SF.REPLAYSSM.name)
"""The forms compared (module docstring)."""
EXACT_FORMS = (SF.EXACT_EAGER.name, SF.EXACT_LAZY.name, "exact_policy", SF.CHAIN_RESTORE.name)
"""Forms bitwise equal to plain decoding: their first divergence must be -1."""
_SPEC = {  # form -> (ServingCache form, speculative_generate keywords)
    SF.EXACT_EAGER.name: ("exact", dict(lazy=False)),
    SF.EXACT_LAZY.name: ("exact", dict(lazy=True, lazy_min_seqs=1)),
    "exact_policy": ("exact", dict(lazy=True, lazy_min_seqs=GDN_CARRY_LAZY_MIN_SEQS,
                                   eager_max_pending=GDN_CARRY_EAGER_MAX_PENDING)),
    SF.CHAIN_RESTORE.name: ("chain", {}),
    SF.RING.name: ("ring", {}),
    SF.REPLAYSSM.name: ("replayssm", {}),
}
DRAFTERS = ("ngram",)
"""Draft sources: ``ngram`` is prompt lookup over the prompt and the tokens generated so far."""
METRICS = ("first_divergent_token", "first_divergent_token_fp32", "accept_rate",
           "tokens_per_step")
"""Per-prompt metrics (the results schema); ``tokens_per_s`` is per point."""
MODEL_DTYPES = {"float64": torch.float64, "float32": torch.float32}
"""Dtypes of the dense layers (float64: module docstring)."""

AXES = ("model", "dtype", "B", "prompt_len", "tokens", "seed", "state_layout", "form",
        "state_dtype", "K", "drafter", "forced_reject", "ring_length")
"""The tokens sweep's axes: ``model`` a committed checkpoint's size (``"cpu"``, ``"gpu"``) or
a checkpoint directory; ``B`` held-out prompts decoded together; ``tokens`` generated per
prompt; the draft setting ``K``, ``drafter``, ``forced_reject`` (plain points drop them)."""
_SPEC_AXES = ("K", "drafter", "forced_reject", "ring_length")


def _each(p: dict) -> dict | None:
    """Plain points drop the speculative axes; ``ring_length`` belongs to the ring form."""
    if p["form"] == "plain":
        for k in _SPEC_AXES:
            p.pop(k, None)
    elif p["form"] != SF.RING.name:
        p.pop("ring_length", None)
    if p.get("forced_reject") is not None and not isinstance(p["forced_reject"], bool):
        raise ValueError(f"grids: axis forced_reject: expected True or False, got "
                         f"{p['forced_reject']!r}")
    if p["form"] != "plain":
        if "forced_reject" not in p:
            raise ValueError("grids: speculative forms need the axis forced_reject (True or "
                             "False)")
        if "K" in p:
            _checks.positive_int("grids: axis K", p["K"], minimum=2, maximum=GDN_CARRY_CAP)
        if "ring_length" in p:
            _checks.choice("grids: axis ring_length", p["ring_length"], RING_LENGTHS)
    return p


def points(grids: list[dict], seed: int = 0) -> list[dict]:
    """The grids' points (``seed`` unless a grid has its own), duplicates dropped; axes,
    forms, drafters, model dtypes and checkpoints checked before any point runs
    (``ValueError`` naming the axis)."""
    from pmll_lab.models.tiny_gdn import SIZES

    out = P.grid_points(grids, {"seed": [seed], "state_layout": ["vk"]}, _each, axes=AXES,
                        choices={"form": FORMS, "drafter": DRAFTERS,
                                 "dtype": tuple(MODEL_DTYPES)})
    for p in out:
        m = p.get("model")
        if m is None:
            raise ValueError("grids: axis model is missing (a checkpoint size or directory)")
        if m not in SIZES and not (Path(str(m)) / "provenance.json").is_file():
            raise ValueError(f"grids: axis model: {m!r} is neither a size ({', '.join(SIZES)})"
                             " nor a checkpoint directory")
        for name in ("B", "prompt_len", "tokens"):
            if name not in p:
                raise ValueError(f"grids: axis {name} is missing")
        if p["form"] != "plain" and ("K" not in p or "drafter" not in p):
            raise ValueError("grids: speculative forms need the axes K and drafter")
    return out


# ---- the model, the prompts and the references ------------------------------------------------

@functools.lru_cache(maxsize=2)
def model_for(model: str, dtype: str):
    """The checkpoint ``model`` (``tiny_gdn.load_model``) in ``dtype`` on ``DEVICE``.
    transformers' notice that a prompt's prefill takes its torch path (FLA not on this device)
    is silenced: the torch path is the one ``ServingCache`` asks for."""
    import logging

    from pmll_lab.models.tiny_gdn import load_model

    logging.getLogger("transformers.integrations.hub_kernels").setLevel(logging.ERROR)
    return load_model(model, dtype=MODEL_DTYPES[dtype], device=DEVICE)


@functools.lru_cache(maxsize=1)
def _corpus():
    from pmll_lab.models.stdlib_corpus import load_corpus

    return load_corpus()


@functools.lru_cache(maxsize=4)
def prompts_for(B: int, prompt_len: int, seed: int) -> tuple:
    """``B`` held-out prompts of ``prompt_len`` tokens (``stdlib_corpus.heldout_prompts``)."""
    from pmll_lab.models.stdlib_corpus import heldout_prompts

    return tuple(tuple(p) for p in heldout_prompts(_corpus(), B, prompt_len, seed))


def _key(p: dict) -> tuple:
    return (p["model"], p["dtype"], int(p["B"]), int(p["prompt_len"]), int(p["tokens"]),
            int(p["seed"]), p["state_layout"])


@functools.lru_cache(maxsize=4)
def plain_run(model, dtype, B, prompt_len, tokens, seed, state_layout, state_dtype):
    """``(tokens [B, tokens], stats)`` of plain greedy decoding with a ``state_dtype`` pool."""
    from pmll_lab.models.generate import greedy_generate

    return greedy_generate(model_for(model, dtype), [list(q) for q in
                                                     prompts_for(B, prompt_len, seed)],
                           max_new_tokens=tokens, state_layout=state_layout,
                           state_dtype=getattr(torch, state_dtype), return_stats=True)


def first_divergence(tokens, reference) -> int:
    """Index of the first position where ``tokens`` and ``reference`` differ (padding < 0
    dropped), or where one ends before the other; -1 when they are equal."""
    a = [int(t) for t in tokens if int(t) >= 0]
    b = [int(t) for t in reference if int(t) >= 0]
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return -1 if len(a) == len(b) else min(len(a), len(b))


def per_prompt(stats, n: int) -> list[dict]:
    """Per prompt ``accept_rate`` (accepted draft rows over the ``K - 1`` draft rows of its
    verify steps; NaN without any) and ``tokens_per_step`` (tokens emitted per step it took
    part in), from ``GenerationStats.seq_steps``."""
    acc = [[0, 0, 0, 0] for _ in range(n)]     # accepted drafts, draft rows, emitted, steps
    for i, rows, _drafted, a, emitted in stats.seq_steps:
        s = acc[i]
        if rows > 1:
            s[0] += a - 1
            s[1] += rows - 1
        s[2] += emitted
        s[3] += 1
    return [dict(accept_rate=s[0] / s[1] if s[1] else math.nan,
                 tokens_per_step=s[2] / s[3] if s[3] else math.nan) for s in acc]


# ---- one point --------------------------------------------------------------------------------

def _generate(p: dict, prompts: list, tokens: int):
    """``(tokens, stats)`` of point ``p``'s form on ``prompts``."""
    from pmll_lab.models.generate import greedy_generate, speculative_generate

    model = model_for(p["model"], p["dtype"])
    sd = getattr(torch, p["state_dtype"])
    if p["form"] == "plain":
        return greedy_generate(model, prompts, max_new_tokens=tokens,
                               state_layout=p["state_layout"], state_dtype=sd,
                               return_stats=True)
    form, kw = _SPEC[p["form"]]
    if form == "ring":                       # ServingCache's form
        kw = dict(kw, ring_length=int(p.get("ring_length", 16)))
    return speculative_generate(model, prompts, max_new_tokens=tokens, draft=p["drafter"],
                                K=int(p["K"]), form=form, state_layout=p["state_layout"],
                                state_dtype=sd, forced_reject=bool(p["forced_reject"]),
                                return_stats=True, **kw)


def _unsupported(p: dict) -> str | None:
    """Why point ``p`` cannot run here (None: it can)."""
    if p["form"] == SF.REPLAYSSM.name:
        from pmll_lab.models.replayssm_stack import replayssm_why_not

        return replayssm_why_not(model_for(p["model"], p["dtype"]), p)
    return None


def token_point(p: dict) -> list[dict]:
    """One form on ``B`` held-out prompts (module docstring): rows of ``METRICS`` per prompt,
    ``tokens_per_s`` per point; one ``unsupported`` row where the form cannot run here. On a
    GPU a short warm-up run (two prompts, 8 tokens) compiles the kernels first. A plain point's
    run is the reference itself (cached per process: the first point of a pool dtype computes
    it). Raises ``CheckFailed`` (rows kept) when an exact form leaves plain decoding."""
    P.one_cpu_thread()
    base = dict(kernel=p["form"], state_layout=p["state_layout"])
    why = _unsupported(p)
    if why is not None:
        return [dict(base, metric="unsupported", value=1.0, status="unsupported", error=why)]
    key = _key(p)
    prompts = [list(q) for q in prompts_for(*key[2:4], key[5])]
    if DEVICE.type == "cuda":                # compile this form's kernels before any timing
        _generate(p, prompts[:2], 8)
        torch.cuda.synchronize()
    ref = plain_run(*key, p["state_dtype"])[0]
    ref32 = plain_run(*key, "float32")[0]
    if p["form"] == "plain":
        toks, stats = plain_run(*key, p["state_dtype"])     # the reference run itself
    else:
        toks, stats = _generate(p, prompts, int(p["tokens"]))
    timer = "step-wall" if DEVICE.type == "cuda" else "interpreter-wall"
    rows = []
    exact = p["form"] in EXACT_FORMS or p["form"] == "plain"
    for i, (got, pp) in enumerate(zip(toks.tolist(), per_prompt(stats, len(prompts)))):
        fd = first_divergence(got, ref[i].tolist())
        row = dict(base, prompt=i, tokens=int(p["tokens"]))
        check = dict(passed=fd == -1, what="tokens == plain decoding's") if exact else {}
        rows.append(dict(row, metric="first_divergent_token", value=float(fd), **check))
        rows.append(dict(row, metric="first_divergent_token_fp32",
                         value=float(first_divergence(got, ref32[i].tolist()))))
        for m in ("accept_rate", "tokens_per_step"):
            rows.append(dict(row, metric=m, value=float(pp[m])))
    s = stats.summary()
    rows.append(dict(base, prompt=-1, tokens=int(p["tokens"]), metric="tokens_per_s",
                     value=float(s["tokens_per_s"]), timer=timer))
    bad = [r["prompt"] for r in rows if r.get("passed") is False]
    if bad:
        raise CheckFailed(f"{p['form']} ({p['state_dtype']} pool): tokens leave plain "
                          f"decoding's on prompt(s) {bad}", rows)
    return rows
