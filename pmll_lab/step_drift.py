"""What exactness buys: error drift over a long speculative decode (SPEC §3b, §3d).

All forms decode the same token stream: ``steps`` speculative steps of ``K`` rows, the accepted
counts of the acceptance process (``pmll_lab.harness.step.acceptance_counts``). The reference is
the exact carry on an fp32 state, which is bitwise equal to plain fp32-state decoding. Against
it, per step, the accepted outputs' rel L2 error, and at ``checkpoints`` steps the error of the
state each form stands for (its stored state with its pending rows or ring folded in):

- ``exact_lazy`` on a bf16 state: bitwise equal to plain bf16-state decoding (test_state_dtype),
  so its drift is the bf16 state's own;
- ``plain_decode`` on a bf16 state: ``gdn_decode`` once per accepted token (padding lanes for
  sequences that accepted fewer rows), the same numbers by that exactness, run here to show it;
- ``ring`` on a bf16 and on an fp32 state (the tolerance form), and ``ring_exact_fold`` (its
  window folded by decoding the raw rows: the stored state is plain decoding's);
- ``flashinfer_replayssm`` on a bf16 state where FlashInfer runs;
- SGLang's forms where its kernels load (``pmll_lab.harness.step_sglang``), on a bf16 and an
  fp32 state: ``sglang_replayssm`` (its ring, materialised from compact rows),
  ``sglang_replayssm_rawfold`` (its ring with the exact fold of the raw rows at a flush: the
  stored state is the recurrence's own, rounded once per flush) and ``sglang_exact_fold`` (its
  fold-every-commit).

Each form runs on its own copy of the case's inputs, so adding or dropping a form leaves the
others' rows as they were.

Returns tidy rows (``form, state_dtype, step, tokens, metric, value``).
"""

from __future__ import annotations

import warnings

import pandas as pd
import torch

from pmll_lab import _checks
from pmll_lab.bench import errors
from pmll_lab.harness import registry
from pmll_lab.harness.step import StepCase
from pmll_lab.harness.step_forms import EXACT_LAZY

DRIFT_FORMS = tuple((name, getattr(torch, sd)) for name in registry.names("gdn_step")
                    for sd in registry.get(name).drift)
"""``(implementation, state dtype)`` pairs the study runs where registered, available here and
taking the case: each ``gdn_step`` implementation at the state dtypes of its registration's
``drift`` (``pmll_lab.harness.registry``), in registration order."""


def _masked_rel_l2(o, ref, acc) -> float:
    """rel L2 over the accepted rows (``t < a``) only."""
    m = (torch.arange(o.shape[1], device=o.device)[None, :] < acc[:, None])[..., None, None]
    return errors(o.float() * m, ref.float() * m)["rel_l2"]


def _left_out(form, sd, what: str, exc: Exception) -> None:
    warnings.warn(f"drift: {form} ({sd}) left out: its {what} raised {type(exc).__name__}: {exc}",
                  stacklevel=3)


def drift_study(*, batch: int = 4, steps: int = 1390, rows: int = 4, num_k_heads: int = 16,
                num_v_heads: int = 32, head_dim: int = 128, alpha: float = 0.8,
                checkpoints: int = 8, seed: int = 0, forms=DRIFT_FORMS,
                ring_length: int = 16) -> pd.DataFrame:
    """Run every form of ``forms`` (``(form, state dtype)`` pairs) and the fp32 exact
    reference through the same ``steps`` speculative steps (1390 steps of ``K = 4`` at
    ``alpha = 0.8`` accept about 4096 tokens). ``ValueError`` naming a bad argument."""
    for name, val in (("batch", batch), ("steps", steps), ("checkpoints", checkpoints)):
        _checks.positive_int(name, val)
    kw = dict(batch=batch, rows=rows, num_k_heads=num_k_heads, num_v_heads=num_v_heads,
              head_dim=head_dim, steps=steps, alpha=alpha, seed=seed, ring_length=ring_length)
    ref_case = StepCase(state_dtype=torch.float32, **kw)
    reference = EXACT_LAZY.build(ref_case)
    runs = []
    for form, sd in forms:
        if form not in registry.names("gdn_step"):
            continue
        impl = registry.get(form)
        try:
            why = impl.unavailable()               # not here (SGLang absent): no case drawn
        except Exception as exc:  # noqa: BLE001 - its available at fault: said, skipped
            _left_out(form, sd, "available", exc)
            continue
        if why is not None:
            continue
        case = StepCase(state_dtype=sd, **kw)      # a bad forms entry is the caller's error
        try:
            why = impl.unsupported(case)
        except Exception as exc:  # noqa: BLE001 - its supports at fault: said, skipped
            _left_out(form, sd, "supports", exc)
            continue
        if why is None:
            runs.append((form, sd, impl.build(case)))
    marks = {int(round(steps * (j + 1) / checkpoints)) - 1 for j in range(checkpoints)}
    acc_all = ref_case.tensors["accepted"]
    tokens = torch.cumsum(acc_all.float().mean(1), 0).tolist()
    rows_out = []
    for i in range(steps):
        ref_o = reference.step(i).clone()
        for form, sd, run in runs:
            o = run.step(i)
            row = dict(form=form, state_dtype=str(sd).split(".")[1], step=i + 1,
                       tokens=tokens[i])
            rows_out.append({**row, "metric": "o_rel_l2",
                             "value": _masked_rel_l2(o, ref_o, acc_all[i])})
            if i in marks:
                err = max(errors(run.effective_state(b), reference.effective_state(b))["rel_l2"]
                          for b in range(batch))
                rows_out.append({**row, "metric": "state_rel_l2", "value": err})
    return pd.DataFrame(rows_out)
