"""transformers as the oracle: its own greedy generation, and where our tokens may differ from it.

``hf_greedy`` runs ``model.generate(do_sample=False)`` one prompt at a time (no padding) on
transformers' pure-PyTorch GDN path (``hf_torch_path``), keeping the logits of every step.
``compare_to_hf`` walks our tokens and transformers' side by side. While the two sequences agree
both models saw the same prefix, so their logits at that step are comparable: the largest
absolute difference over all such steps is the measured logit error ``eps`` (our GDN kernels
against transformers' torch delta rule; the rest of the model is the same code). At the first
step where the tokens differ, the divergence is explained by rounding only if transformers'
top-2 margin there is at most ``2 * eps`` (if every logit moves by at most ``eps``, the argmax
can change only when the top two are within ``2 * eps``). Every divergence at a larger margin is
a failure; the tokens after a divergence are not comparable (different prefixes) and are
counted, not compared.
"""

from __future__ import annotations

import torch
from torch import nn

from pmll_lab.models.qwen3_next import hf_torch_path


@torch.no_grad()
def hf_greedy(model: nn.Module, prompts, max_new_tokens) -> tuple[list, list]:
    """transformers' greedy generation per prompt on its torch path: ``(tokens, logits)``, per
    prompt a list of generated ids and a ``[n, V]`` float32 tensor of the logits each was chosen
    from. ``max_new_tokens``: an int or one per prompt. No EOS stop (``eos_token_id`` unset), so
    every prompt gets its full budget, as in our loops with ``eos_token_id=None`` on a model
    without one."""
    budgets = list(max_new_tokens) if isinstance(max_new_tokens, (list, tuple)) \
        else [int(max_new_tokens)] * len(prompts)
    dev = next(model.parameters()).device
    toks, logits = [], []
    with hf_torch_path(model):
        for p, n in zip(prompts, budgets):
            ids = torch.as_tensor(p, dtype=torch.long, device=dev)[None]
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                                 min_new_tokens=n, do_sample=False, output_logits=True,
                                 return_dict_in_generate=True, pad_token_id=0,
                                 eos_token_id=None)
            toks.append(out.sequences[0, ids.shape[1]:].tolist())
            logits.append(torch.stack([lg[0].float().cpu() for lg in out.logits]))
    return toks, logits


def _margin(row: torch.Tensor) -> float:
    top = torch.topk(row.double(), 2).values
    return float(top[0] - top[1])


def compare_to_hf(ours_tokens, ours_logits, hf_tokens, hf_logits) -> dict:
    """Compare per prompt our tokens/logits with transformers' (module docstring).

    ``ours_tokens``: LongTensor ``[N, T]`` (padding < 0) or lists; ``ours_logits``: per prompt
    ``[n, V]``; ``hf_*`` from ``hf_greedy``. Returns ``{"eps", "compared", "agreeing",
    "divergences": [{"prompt", "step", "margin", "bound"}], "unexplained", "not_compared",
    "min_margin"}``: ``eps`` the largest logit difference over agreeing steps, ``compared`` the
    token positions compared (up to and including each first divergence), ``agreeing`` those
    equal, ``unexplained`` the divergences whose margin exceeds ``2 * eps`` (0 when ours
    matches transformers wherever rounding cannot explain a difference), ``not_compared`` the
    positions after a divergence, ``min_margin`` the smallest margin over agreeing steps."""
    rows = []
    eps, compared, agreeing, not_compared = 0.0, 0, 0, 0
    min_margin = float("inf")
    for p, (ot, ol, ht, hl) in enumerate(zip(ours_tokens, ours_logits, hf_tokens, hf_logits)):
        ot = [int(t) for t in ot if int(t) >= 0]
        n = min(len(ot), len(ht))
        for s in range(n):
            compared += 1
            if ot[s] != ht[s]:
                rows.append(dict(prompt=p, step=s, margin=_margin(hl[s]),
                                 ours=ot[s], hf=ht[s]))
                not_compared += n - s - 1
                break
            agreeing += 1
            eps = max(eps, float((ol[s].double() - hl[s].double()).abs().max()))
            min_margin = min(min_margin, _margin(hl[s]))
    for r in rows:
        r["bound"] = 2 * eps
    return dict(eps=eps, compared=compared, agreeing=agreeing, divergences=rows,
                unexplained=sum(r["margin"] > 2 * eps for r in rows), not_compared=not_compared,
                min_margin=min_margin)
