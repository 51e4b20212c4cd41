"""The spec_decode notebook: speculative decoding end to end on a random-weight Qwen3-Next
model through our kernels: greedy, or ``K`` rows per step verified by the carry (eager, lazy) or
the snapshot chain, drafts ``noisy`` (greedy's token with probability ``p``) or ``ngram``.
"""

from __future__ import annotations

import functools
import math

import torch

from pmll_lab import _checks
from pmll_lab.backend import DEVICE
from pmll_lab.carry import GDN_CARRY_CAP
from pmll_lab.experiments import protocol as P
from pmll_lab.sweep import CheckFailed
from pmll_lab.harness import step_forms as SF
from pmll_lab.models.cache import FORMS as CACHE_FORMS
from pmll_lab.models.drafts import DRAFTS

ARCHS = ("tiny", "qwen3_next_sized")
"""``tiny_config("qwen3_next")`` / ``qwen3_next_sized_config()`` (``pmll_lab.models``)."""

SECTIONS = ("conv_verify", "gdn_verify", "accept", "gdn_flush", "conv_flush", "conv_chain",
            "gdn_chain", "snapshot_restore", "conv_update", "gdn_decode")
"""Kernel sections a step is split into (``StepTimer`` names; summed over the GDN layers)."""

LABELS = {"plain": "plain decoding", SF.EXACT_LAZY.name: "carry exact, lazy",
          SF.EXACT_EAGER.name: "carry exact, eager", "chain": "snapshot chain"}
DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}


def _plain(p: dict) -> dict:
    if p.get("mode") == "plain":
        for k in ("form", "lazy", "K", "draft", "p"):
            p.pop(k, None)
    return p


def _k(name: str, k) -> None:
    """``K``: the draft rows a verify takes, 2 to the carry's capacity."""
    _checks.positive_int(name, k, minimum=2, maximum=GDN_CARRY_CAP)


def _forms(name: str, forms) -> None:
    """``ValueError`` naming ``name`` for a form the speculative generation does not have
    (``models.cache.FORMS``), before any point runs."""
    for f in forms:
        if f not in CACHE_FORMS:
            raise ValueError(f"{name}: {f!r} is not one of {', '.join(CACHE_FORMS)}")


AXES = ("B", "K", "arch", "draft", "dtype", "form", "forms", "lazy", "lazy_min_seqs", "mode",
        "new_tokens", "p", "prompt_len", "state_layout", "seed")
"""The spec_decode sweep's axes (``protocol.grid_points``; ``dtype`` takes the model dtypes of
``DTYPES``, float64 the oracle's; ``mode`` is "plain" or "spec"; ``arch`` one of ``ARCHS``)."""


def points(grids: list[dict], seed: int = 0) -> list[dict]:
    """The grids' points (``seed`` unless a grid has its own; ``mode="plain"`` points drop the
    speculative axes), duplicates dropped."""
    for g in grids if isinstance(grids, (list, tuple)) else ():
        if isinstance(g, dict) and isinstance(g.get("form"), (list, tuple)):
            _forms("grids: axis form", g["form"])
        if isinstance(g, dict) and isinstance(g.get("K"), (list, tuple)):
            for k in g["K"]:
                _k("grids: axis K", k)
    return P.grid_points(grids, {"seed": [seed]}, _plain, axes=AXES,
                         choices={"dtype": tuple(DTYPES), "mode": ("plain", "spec"),
                                  "arch": ARCHS, "draft": DRAFTS})


def kernel_name(p: dict) -> str:
    """``plain``, ``chain`` or ``<form>_<lazy|eager>``."""
    if p.get("mode") == "plain":
        return "plain"
    if p["form"] == "chain":
        return "chain"
    return f"{p['form']}_{'lazy' if p['lazy'] else 'eager'}"


# ---- the model and the workload -----------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def model_for(arch: str, dtype: str, seed: int):
    """The random model of ``arch`` in ``dtype`` on ``DEVICE`` (one kept per process)."""
    from pmll_lab.models.qwen3_next import build_model, qwen3_next_sized_config, tiny_config

    if arch not in ARCHS:
        raise ValueError(f"arch: expected one of {ARCHS}, got {arch!r}")
    cfg = tiny_config("qwen3_next") if arch == "tiny" else qwen3_next_sized_config()
    return build_model(cfg, seed=seed, dtype=DTYPES[dtype], device=DEVICE)


def prompts_for(seed: int, B: int, prompt_len: int, vocab: int) -> list[torch.Tensor]:
    """``B`` random prompts of ``prompt_len`` tokens (CPU, seeded)."""
    g = torch.Generator().manual_seed(10_000 + seed)
    return [torch.randint(0, vocab, (prompt_len,), generator=g) for _ in range(B)]


def _runs() -> int:
    return 2 if DEVICE.type == "cuda" else 1


@functools.lru_cache(maxsize=16)
def greedy_run(arch, dtype, seed, B, prompt_len, new_tokens, state_layout, timed=True):
    """``(tokens, stats)`` of greedy decoding (``timed``: the second run on a GPU)."""
    from pmll_lab.models.generate import greedy_generate

    model = model_for(arch, dtype, seed)
    prompts = prompts_for(seed, B, prompt_len, model.config.vocab_size)
    for _ in range(_runs() if timed else 1):
        out = greedy_generate(model, prompts, max_new_tokens=new_tokens, state_layout=state_layout,
                              timing=timed, return_stats=True)
    return out


def agreement(tokens: torch.Tensor, ref: torch.Tensor) -> float:
    """Mean over sequences of the fraction of ``ref``'s tokens matched before the first
    difference (1.0: identical)."""
    fr = []
    for a, b in zip(tokens.tolist(), ref.tolist()):
        b = [t for t in b if t >= 0]
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        fr.append(n / max(len(b), 1))
    return sum(fr) / len(fr)


def _rows(p: dict, stats, extra: dict) -> list[dict]:
    st = stats.frame()
    kind = "decode" if p.get("mode") == "plain" else "verify"
    steps = st[st.kind == kind]
    s = stats.summary()
    timer = "cuda_events" if DEVICE.type == "cuda" else "interpreter-wall"
    rows = dict(tokens_per_s=s["tokens_per_s"], decode_ms=s["decode_ms"], tokens=s["tokens"],
                steps=s["steps"], step_ms=float(steps.step_ms.mean()) if len(steps) else math.nan,
                step_ms_median=float(steps.step_ms.median()) if len(steps) else math.nan,
                decode_steps=int((st.kind == "decode").sum()),
                verify_steps=int((st.kind == "verify").sum()),
                mean_accept=s["mean_accept"], write_backs=s["write_backs"],
                flushes=s["flushes"], flushed_slots=s["flushed_slots"], restored=s["restored"],
                lazy_steps=int(steps.lazy.eq(True).sum()) if len(steps) else 0, **extra)
    known = 0.0
    for sec in SECTIONS:
        col = f"{sec}_ms"
        if col in steps and len(steps):
            v = float(steps[col].fillna(0).mean())
            rows[col] = v
            known += v
    if len(steps):
        rows["draft_ms"] = float(steps.draft_ms.mean())
        rows["rest_of_model_ms"] = rows["step_ms"] - known - rows["draft_ms"]
    rows["step_us"] = rows["step_ms"] * 1e3
    k = kernel_name(p)
    return [dict(kernel=k, metric=m, value=float(v), timer=timer) for m, v in rows.items()]


def generation_point(point: dict) -> list[dict]:
    """One generation (module docstring). Point keys: ``arch``, ``dtype``, ``seed``, ``B``,
    ``prompt_len``, ``new_tokens``, ``state_layout``, ``mode`` ("plain"/"spec"); speculative points
    also ``form``, ``lazy``, ``K``, ``draft`` ("noisy"/"ngram"), ``p`` (noisy) and
    ``lazy_min_seqs``. Exact and chain forms on a float64 model must return greedy's tokens
    (``CheckFailed`` otherwise); elsewhere the agreement is measured (batched dense layers
    round differently at ``B*K`` rows)."""
    from pmll_lab.models.generate import speculative_generate

    P.one_cpu_thread()
    p = point
    key = (p["arch"], p["dtype"], p["seed"], p["B"], p["prompt_len"], p["new_tokens"],
           p["state_layout"])
    ref, ref_stats = greedy_run(*key)
    if p["mode"] == "plain":
        return _rows(p, ref_stats, {})
    model = model_for(p["arch"], p["dtype"], p["seed"])
    prompts = prompts_for(p["seed"], p["B"], p["prompt_len"], model.config.vocab_size)
    draft_ref = None
    if p["draft"] == "noisy":
        # the greedy continuation CAP tokens past the budget, so that a sequence's last steps
        # still get K-1 proposals (acceptance not cut short at the end of the reference)
        draft_ref = greedy_run(*key[:5], p["new_tokens"] + GDN_CARRY_CAP, p["state_layout"],
                               timed=False)[0]
    for _ in range(_runs()):
        toks, stats = speculative_generate(
            model, prompts, max_new_tokens=p["new_tokens"], draft=p["draft"], K=p["K"],
            form=p["form"], lazy=bool(p["lazy"]), state_layout=p["state_layout"],
            draft_accept=p.get("p") if p["draft"] == "noisy" else None, reference=draft_ref,
            draft_seed=p["seed"], lazy_min_seqs=p.get("lazy_min_seqs", 8), timing=True,
            return_stats=True)
    agree = agreement(toks, ref)
    rows = _rows(p, stats, dict(agreement_with_greedy=agree,
                                plain_tokens_per_s=ref_stats.summary()["tokens_per_s"]))
    held = p["form"] in ("exact", "chain") and p["dtype"] == "float64"
    for r in rows:                  # a check where the tokens must be greedy's
        if held and r["metric"] == "agreement_with_greedy":
            r.update(passed=agree == 1.0, what="tokens == greedy's")
    if held and agree != 1.0:
        raise CheckFailed(f"{p['form']} form: tokens differ from greedy decoding "
                          f"(agreement {agree:.3f})", rows)
    return rows


def _oracle_p(name: str, v) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
        raise ValueError(f"{name} must be the noisy draft's probability in [0, 1], got {v!r}")


def _oracle_forms(name: str, forms) -> None:
    if isinstance(forms, (str, bytes)) or not isinstance(forms, (list, tuple)) or not forms:
        raise ValueError(f"{name} must be a non-empty list of forms, got {forms!r}")
    _forms(name, forms)


def check_main(points: list[dict], main_K: int, main_p: float) -> None:
    """The notebook's ``main_K`` and ``main_p`` (the cut its tables show) must be a ``K`` and a
    noisy draft's ``p`` of the speculative points: ``ValueError`` naming them otherwise (the
    tables would show plain decoding only)."""
    spec = [p for p in points if p.get("mode") != "plain"]
    ks = sorted({p["K"] for p in spec if "K" in p})
    if spec and main_K not in ks:
        raise ValueError(f"main_K: {main_K!r} is not a K of the grids' speculative points {ks}")
    ps = sorted({p["p"] for p in spec if p.get("K") == main_K and p.get("draft") == "noisy"
                 and "p" in p})
    if ps and main_p not in ps:
        raise ValueError(f"main_p: {main_p!r} is not a noisy draft's p of the grids' points at "
                         f"K = {main_K} {ps}")


ORACLE_KEYS = {"arch": ARCHS, "dtype": tuple(DTYPES), "B": 1, "prompt_len": 1, "new_tokens": 1,
               "state_layout": P.LAYOUTS, "K": _k, "p": _oracle_p, "forms": _oracle_forms}
"""An oracle run's keys and their rules (``protocol.check_points``); the notebook adds
``seed``."""


def oracle_point(point: dict) -> list[dict]:
    """Greedy and speculative tokens (forms ``point["forms"]``, ``K``, noisy draft ``p``)
    against transformers' ``generate`` on its torch path and against our greedy tokens: per
    kernel ``agreeing`` / ``compared`` tokens, ``eps`` (largest logit difference while they
    agree), ``divergences``, ``unexplained`` (divergences at a top-2 margin above ``2*eps``:
    must be 0, else ``CheckFailed``), ``not_compared``; ``equal_to_greedy`` (1/0)."""
    from pmll_lab.models.generate import greedy_generate, speculative_generate
    from pmll_lab.models.oracle import compare_to_hf, hf_greedy

    P.one_cpu_thread()
    p = point
    model = model_for(p["arch"], p["dtype"], p["seed"])
    prompts = prompts_for(p["seed"] + 1, p["B"], p["prompt_len"], model.config.vocab_size)
    hf_t, hf_l = hf_greedy(model, prompts, p["new_tokens"])
    ref, gst = greedy_generate(model, prompts, max_new_tokens=p["new_tokens"],
                               state_layout=p["state_layout"], output_logits=True,
                               return_stats=True)
    runs = {"plain": (ref, gst)}
    for form in p["forms"]:
        runs[form] = speculative_generate(
            model, prompts, max_new_tokens=p["new_tokens"], draft="noisy", K=p["K"], form=form,
            state_layout=p["state_layout"], draft_accept=p["p"], reference=ref, output_logits=True,
            return_stats=True)
    rows, bad = [], []
    for name, (toks, st) in runs.items():
        c = compare_to_hf(toks, st.logits, hf_t, hf_l)
        vals = dict(agreeing=c["agreeing"], compared=c["compared"], eps=c["eps"],
                    divergences=len(c["divergences"]), unexplained=c["unexplained"],
                    not_compared=c["not_compared"], min_margin=c["min_margin"],
                    equal_to_greedy=float(torch.equal(toks, ref)))
        rows += [dict(kernel=name, metric=m, value=float(v)) for m, v in vals.items()]
        rows[-len(vals) + list(vals).index("unexplained")].update(
            passed=not c["unexplained"], what="divergences beyond 2 eps")
        if c["unexplained"]:
            bad.append(name)
    if bad:
        raise CheckFailed(f"tokens differ from transformers' at a margin above 2*eps: {bad}", rows)
    return rows
