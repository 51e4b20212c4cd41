"""What exactness buys: error drift over a long speculative decode (SPEC §3b, §3d).

All forms decode the same token stream: ``steps`` speculative steps of ``K`` rows, the accepted
counts of the acceptance process (``pmll_lab.step_bench.acceptance_counts``). The reference is
the exact carry on an fp32 state, which is bitwise equal to plain fp32-state decoding. Against
it, per step, the accepted outputs' rel L2 error, and at ``checkpoints`` steps the error of the
state each form stands for (its stored state with its pending rows or ring folded in):

- ``exact_lazy`` on a bf16 state: bitwise equal to plain bf16-state decoding (test_state_dtype),
  so its drift is the bf16 state's own;
- ``plain_decode`` on a bf16 state: ``gdn_decode`` once per accepted token (padding lanes for
  sequences that accepted fewer rows), the same numbers by that exactness, run here to show it;
- ``ring`` on a bf16 and on an fp32 state (the tolerance form);
- ``flashinfer_replayssm`` on a bf16 state where FlashInfer runs (``supports``);
- SGLang's forms where its kernels load (``pmll_lab.step_sglang``), on a bf16 and an fp32 state:
  ``sglang_replayssm`` (its ring, materialised from compact rows), ``sglang_replayssm_rawfold``
  (its ring with the exact fold of the raw rows at a flush: the stored state is the
  recurrence's own, rounded once per flush) and ``sglang_exact_fold`` (its fold-every-commit).

Each form runs on its own copy of the case's inputs, so adding or dropping a form leaves the
others' rows as they were.

Returns tidy rows (``form, state_dtype, step, tokens, metric, value``).
"""

from __future__ import annotations

import pandas as pd
import torch

from pmll_lab import _checks, step_sglang
from pmll_lab.bench import errors
from pmll_lab.gdn import gdn_decode
from pmll_lab.step_bench import StepCase, build_form, supports

DRIFT_FORMS = (("exact_lazy", torch.bfloat16), ("plain_decode", torch.bfloat16),
               ("ring", torch.bfloat16), ("ring", torch.float32),
               ("flashinfer_replayssm", torch.bfloat16),
               *((f, sd) for f in ("sglang_replayssm", "sglang_replayssm_rawfold",
                                   "sglang_exact_fold")
                 for sd in (torch.bfloat16, torch.float32)))


class _PlainDecode:
    """``gdn_decode`` per accepted row on its own copy of the state (V-major)."""

    def __init__(self, case: StepCase):
        self.case = case
        self.state = case.tensors["state"].clone()
        K, HV, d = case.rows, case.num_v_heads, case.head_dim
        self.o = torch.zeros(case.batch, K, HV, d, dtype=torch.bfloat16,
                             device=self.state.device)

    def step(self, i: int):
        c, t = self.case, self.case.tensors
        r = c.rows_of(i)
        acc = t["accepted"][i]
        self.o.zero_()
        for row in range(c.rows):
            slots = torch.where(acc > row, t["slots"], -1).to(torch.int32)
            o = gdn_decode(self.state, r["q"][:, row], r["k"][:, row], r["v"][:, row],
                           A_log=r["A_log"], a=r["a"][:, row], dt_bias=r["dt_bias"],
                           b=r["b"][:, row], state_indices=slots, state_layout="vk",
                           scale=c.scale)
            self.o[:, row] = o
        return self.o

    def effective_state(self, b: int) -> torch.Tensor:
        s = int(self.case.tensors["slots"][b])
        return self.state[s].double().transpose(-1, -2).cpu()


def _runner(form: str, state_dtype: torch.dtype, kw: dict):
    """The form's steps on a ``StepCase(state_dtype=state_dtype, **kw)``, or None where it does
    not run here (a shape or dtype it does not take; SGLang's kernels absent: no case drawn)."""
    if form in step_sglang.FORMS and not step_sglang.available():
        return None
    case = StepCase(state_dtype=state_dtype, **kw)
    if form == "plain_decode":
        return _PlainDecode(case)
    if form in step_sglang.FORMS:
        return step_sglang.build_form(form, case) if step_sglang.supports(form, case) else None
    return build_form(form, case) if supports(form, case) else None


def _masked_rel_l2(o, ref, acc) -> float:
    """rel L2 over the accepted rows (``t < a``) only."""
    m = (torch.arange(o.shape[1], device=o.device)[None, :] < acc[:, None])[..., None, None]
    return errors(o.float() * m, ref.float() * m)["rel_l2"]


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
    reference = build_form("exact_lazy", ref_case)
    runs = []
    for form, sd in forms:
        run = _runner(form, sd, kw)
        if run is not None:
            runs.append((form, sd, run))
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
