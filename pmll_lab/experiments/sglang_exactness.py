"""SGLang's bitwise claim, checked: its fold-every-commit against its own decode, over a grid.

SGLang 0.5.23 documents its exact fold (``gdn_replayssm_exact_fold_kernel``) as equal, bit for
bit, to its recurrent kernel's update. Per configuration (head size ``kd = vd``, pool dtype, input
dtype, ``K``; V-major pools, SGLang's only layout), ``steps`` steps of ``B`` sequences on
``S = B + B // 4 + 1`` slots with seeded rows and acceptance counts in ``1..K`` (the bonus token
always accepted): the verify (``peers_sglang.fold_verify``) and the fold of the accepted prefix
(``fold_commit``) on one pool, and SGLang's recurrent kernel one token at a time with the state
written (``recurrent_decode``) on another. Every accepted output row and, after every step,
the whole pool are compared bitwise; the first differing state element is recorded. A bf16 pool
is folded and rounded once per commit where the decode rounds it per token, so the claim is
expected to hold for fp32 pools only: the grid says where it does on the device it ran on.
Records carry the keys of ``pmll_lab.experiments.exactness`` (its ``summary_line`` prints them).
``python -m pmll_lab.experiments.sglang_exactness --out sglang_exactness.jsonl``: exit 1 when a
configuration differs or fails, 2 when SGLang's kernels do not load.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time

import numpy as np
import torch

from pmll_lab.backend import DEVICE
from pmll_lab.experiments.acceptance import accept_counts
from pmll_lab.experiments import exactness as EX
from pmll_lab.experiments.exactness import (HEAD_DIMS, INPUT_DTYPES, MAX_DETAILS, ROWS,
                                            config_name, first_element, int_list, name_list,
                                            rows_differ, summary_line)
from pmll_lab.peers_sglang import (STATE_DTYPES, SglangFoldWindow, fold_commit, fold_verify,
                                   recurrent_decode, require, sglang_status, sglang_version)
from pmll_lab.harness import step_sglang as SG

FORM = SG.EXACT_FOLD


def configs(head_dims=HEAD_DIMS, state_dtypes=STATE_DTYPES, input_dtypes=INPUT_DTYPES,
            rows=ROWS) -> list[dict]:
    """``exactness.configs`` with ``layout = "vk"`` (SGLang's only layout)."""
    return EX.configs(head_dims, ("vk",), state_dtypes, input_dtypes, rows)


def _inputs(gen, B, K, HK, HV, d, dtype):
    """Seeded rows ``q, k [B, K, HK, d]``, ``v [B, K, HV, d]``, ``a, b [B, K, HV]`` in
    ``dtype`` on the device (drawn on the CPU)."""
    x = dict(q=torch.randn(B, K, HK, d, generator=gen), k=torch.randn(B, K, HK, d, generator=gen),
             v=torch.randn(B, K, HV, d, generator=gen), a=torch.randn(B, K, HV, generator=gen),
             b=torch.randn(B, K, HV, generator=gen))
    return {n: t.to(dtype).to(DEVICE) for n, t in x.items()}


def run_config(cfg: dict, *, B: int = 32, steps: int = 12, seed: int = 0, heads=(1, 2),
               alpha: float = 0.75, use_qk_l2norm: bool = True) -> dict:
    """One configuration (module docstring). Returns the config, ``status`` (``"bitwise"``,
    ``"differs"``, ``"unavailable"`` where SGLang's kernels do not load, ``"error"``),
    ``rows_compared``, ``rows_differing``, ``states_differing`` (steps after which the pools
    differ), ``max_abs_state_diff``, ``first_state_diff``, ``details`` (first differing
    output rows), ``peer_version``, ``seconds``. ``use_qk_l2norm=False`` is a diagnostic (SGLang
    always normalises q and k)."""
    t0 = time.perf_counter()
    rec = dict(config=config_name(cfg), **cfg, B=B, steps=steps, seed=seed, heads=list(heads),
               form=FORM, use_qk_l2norm=use_qk_l2norm, peer_version=sglang_version(),
               rows_compared=0, rows_differing=0, states_differing=0, max_abs_state_diff=0.0,
               details=[])
    try:
        kern = require()
    except RuntimeError as exc:
        return dict(rec, status="unavailable", error=str(exc), bitwise=False, seconds=0.0)
    try:
        _run(kern, cfg, rec, B=B, steps=steps, seed=seed, heads=heads, alpha=alpha,
             use_qk_l2norm=use_qk_l2norm)
        ok = rec["rows_differing"] == 0 and rec["states_differing"] == 0
        rec["status"] = "bitwise" if ok else "differs"
    except Exception as exc:  # noqa: BLE001 - one configuration's failure is its record
        rec.update(status="error", error=f"{type(exc).__name__}: {exc}")
    rec.update(bitwise=rec["status"] == "bitwise", seconds=round(time.perf_counter() - t0, 3))
    return rec


def _run(kern, cfg, rec, *, B, steps, seed, heads, alpha, use_qk_l2norm):
    HK, HV = heads
    d, K = cfg["kd"], cfg["K"]
    sdt, idt = getattr(torch, cfg["state_dtype"]), getattr(torch, cfg["input_dtype"])
    S = B + B // 4 + 1
    gen = torch.Generator().manual_seed(int(seed))
    pool = (torch.randn(S, HV, d, d, generator=gen) * 0.1).to(sdt).to(DEVICE)
    A_log = (torch.rand(HV, generator=gen) * 2 - 1).to(DEVICE)
    dt_bias = (torch.randn(HV, generator=gen) * 0.1).to(DEVICE)
    folded, plain = pool.clone(), pool.clone()
    window = SglangFoldWindow.empty(S, HK, HV, d, d, K, idt)
    rng, pyrng = np.random.default_rng(seed), random.Random(seed)
    qsl = torch.arange(0, B * K + 1, K, dtype=torch.int32, device=DEVICE)
    kw = dict(scale=d ** -0.5, use_qk_l2norm=use_qk_l2norm)
    for n in range(steps):
        slots = torch.tensor(pyrng.sample(range(S), B), dtype=torch.int32, device=DEVICE)
        x = _inputs(gen, B, K, HK, HV, d, idt)
        o = fold_verify(kern, folded, slots, window, **x, A_log=A_log, dt_bias=dt_bias,
                        query_start_loc=qsl, **kw)
        acc = accept_counts(rng, B, K, alpha)
        acc_t = torch.tensor(acc, dtype=torch.int32, device=DEVICE)
        fold_commit(kern, folded, window, slots, acc_t, use_qk_l2norm=use_qk_l2norm)
        for t in range(K):
            live = torch.where(acc_t > t, slots, -1).to(torch.int32)
            want = recurrent_decode(kern, plain, live, *(x[c][:, t] for c in "qkvab"), A_log,
                                    dt_bias, **kw)
            sel = [b for b in range(B) if acc[b] > t]
            if not sel:
                break
            idx = torch.tensor(sel, device=DEVICE)
            bad = rows_differ(o[idx, t], want[idx])
            rec["rows_compared"] += len(sel)
            rec["rows_differing"] += int(bad.sum())
            for i in bad.nonzero().flatten().tolist()[:max(0, MAX_DETAILS - len(rec["details"]))]:
                b = sel[i]
                rec["details"].append(dict(what="output", step=n, b=b, slot=int(slots[b]), t=t,
                                           **first_element(o[b, t], want[b])))
        diff = float((folded.double() - plain.double()).abs().max())
        rec["max_abs_state_diff"] = max(rec["max_abs_state_diff"], diff)
        if not torch.equal(folded, plain):
            rec["states_differing"] += 1
            if "first_state_diff" not in rec:
                e = first_element(folded, plain)
                rec["first_state_diff"] = dict(step=n, slot=e["element"][0], **e)


def run_grid(cfgs, *, B: int, steps: int, seed: int, heads=(1, 2), out=None,
             echo=print) -> list[dict]:
    """``exactness.run_grid`` of ``run_config``: a summary line per configuration (and its
    first state difference) through ``echo``, each record appended to ``out``."""
    return EX.run_grid(cfgs, B=B, steps=steps, seed=seed, heads=heads, out=out, echo=echo,
                       run=run_config, lines=lambda r: [
                           summary_line(r) + f"  states differ {r['states_differing']}"] + (
                           [f"    first state diff: {json.dumps(r['first_state_diff'])}"]
                           if r.get("first_state_diff") else []))


def main(argv=None) -> int:
    """The command line (``--help``); exit 0 when every configuration is bitwise, 1 when one
    differs or fails, 2 when SGLang's kernels do not load."""
    ap = argparse.ArgumentParser(prog="python -m pmll_lab.experiments.sglang_exactness",
                                 description="SGLang's fold-every-commit against its own "
                                             "recurrent decode, bitwise, over a grid.")
    ap.add_argument("--head-dims", type=int_list, default=HEAD_DIMS, help="kd = vd values")
    ap.add_argument("--state-dtypes", type=name_list(STATE_DTYPES), default=STATE_DTYPES)
    ap.add_argument("--input-dtypes", type=name_list(INPUT_DTYPES), default=INPUT_DTYPES)
    ap.add_argument("--rows", type=int_list, default=ROWS, help="K values")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--heads", type=int_list, default=(1, 2), help="HK,HV (default 1,2)")
    ap.add_argument("--out", default=None, help="JSON-lines file (appended)")
    args = ap.parse_args(argv)
    if args.batch < 1 or args.steps < 1 or len(args.heads) != 2:
        ap.error("--batch and --steps must be >= 1, --heads two ints HK,HV")
    print(f"{sglang_status()}; device={DEVICE}", flush=True)
    try:
        require()
    except RuntimeError as exc:
        print(exc, flush=True)
        return 2
    cfgs = configs(args.head_dims, args.state_dtypes, args.input_dtypes, args.rows)
    recs = run_grid(cfgs, B=args.batch, steps=args.steps, seed=args.seed, heads=args.heads,
                    out=args.out, echo=lambda s: print(s, flush=True))
    counts = {s: sum(r["status"] == s for r in recs) for s in ("bitwise", "differs", "error")}
    print("summary: " + ", ".join(f"{v} {k}" for k, v in counts.items()), flush=True)
    return 1 if counts["differs"] or counts["error"] else 0


if __name__ == "__main__":
    sys.exit(main())
