"""The exactness grid: the exact carried state and the K-row chain against plain decoding,
bitwise, over head sizes x layouts x state dtypes x input dtypes x K (SPEC §2, §3a, §3b).

Per configuration, ``steps`` steps of ``B`` sequences from ``S = B + B // 4 + 1`` slots with
seeded rows and acceptance counts in ``0..K``: the carry through ``SpecDecodeStep`` ``eager``,
``lazy`` and ``policy`` (widths ``B`` and ``B // 2`` across ``lazy_min_seqs = B``; every slot
flushed at mid-run and at the end), the lazy carry with the speculative store (``spec``: one
layer, each sequence's live slot moving within its pair of slots as full acceptances swap
them; V-major only: ``n/a`` on a K-major state, not run), and the chain with snapshots +
restore. Every accepted
output row and the final state are compared bitwise with ``gdn_decode`` one token at a time;
the carry's state with its pending rows folded (on clones) is compared every step, so the first
differing step, slot and element are recorded. A launcher's refusal before any launch is
``unsupported``, not a difference. Why a grid: a bitwise defect may sit in one corner only.
``python -m pmll_lab.experiments.exactness --out exactness.jsonl``: exit 1 when one differs.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import random
import sys
import time

import numpy as np
import torch

from pmll_lab.backend import DEVICE
from pmll_lab.bench import bitwise_equal
from pmll_lab.carry import (CarryLayer, GdnCarry, SpecDecodeStep, carry_accept_spec,
                            gdn_carry_flush, gdn_carry_verify)
from pmll_lab.experiments.acceptance import accept_counts
from pmll_lab.gdn import gdn_chain, gdn_decode
from pmll_lab.inputs import gdn_inputs
from pmll_lab.ops import settings
from pmll_lab.ops.gdn.restore import gdn_snapshot_restore

HEAD_DIMS = (16, 32, 64, 128, 256)
LAYOUTS = ("kv", "vk")
STATE_DTYPES = tuple(settings.STATE_DTYPES)
INPUT_DTYPES = ("bfloat16", "float32")
ROWS = (2, 3, 4, 8)
MODES = ("eager", "lazy", "policy")
FORMS = tuple(f"carry_{m}" for m in MODES) + ("carry_spec", "chain")
FORM_LAYOUTS = {"carry_spec": ("vk",)}
"""The layouts a form takes where not all (the speculative store is V-major): elsewhere it is
``n/a`` and not run."""
MAX_DETAILS = 8
"""Differing rows recorded per run (the count is always complete)."""


def configs(head_dims=HEAD_DIMS, layouts=LAYOUTS, state_dtypes=STATE_DTYPES,
            input_dtypes=INPUT_DTYPES, rows=ROWS) -> list[dict]:
    """The grid's configurations, the product of the axes, as dicts
    ``{kd, layout, state_dtype, input_dtype, K}`` (``kd = vd``)."""
    return [dict(kd=d, layout=lay, state_dtype=sd, input_dtype=i, K=K)
            for d, lay, sd, i, K in itertools.product(head_dims, layouts, state_dtypes,
                                                      input_dtypes, rows)]


def config_name(cfg: dict) -> str:
    """``kd16-kv-state_bfloat16-in_bfloat16-K4``."""
    return (f"kd{cfg['kd']}-{cfg['layout']}-state_{cfg['state_dtype']}-in_{cfg['input_dtype']}"
            f"-K{cfg['K']}")


def _bits_differ(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """Elementwise: whether two equal-dtype (2- or 4-byte) tensors differ in any bit."""
    size = {2: torch.int16, 4: torch.int32}[got.element_size()]
    return got.contiguous().view(size) != want.contiguous().view(size)


def rows_differ(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """``[n]`` bool on the host: which rows (first dim) of two equal-dtype tensors differ in
    any bit."""
    return _bits_differ(got, want).flatten(1).any(1).cpu()


def first_element(got: torch.Tensor, want: torch.Tensor) -> dict:
    """Index (as a list), count and values of the first differing element of two tensors."""
    ne = _bits_differ(got, want).cpu()
    idx = ne.nonzero()
    first = idx[0].tolist()
    return {"element": first, "elements_differing": int(ne.sum()),
            "got": float(got.cpu()[tuple(first)]), "want": float(want.cpu()[tuple(first)])}


def _state_diff(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want.double()).abs().max()) if got.numel() else 0.0


class _Run:
    """One form's tallies: rows compared / differing, the worst state difference, details."""

    def __init__(self, form: str):
        self.form = form
        self.rows = 0
        self.differ = 0
        self.state_max = 0.0
        self.state_bitwise = True
        self.details: list[dict] = []
        self.first_state_diff: dict | None = None
        self.protocol_mismatches = 0

    def rows_check(self, step, t, got, want, sel, slots, extra):
        """Compare output rows ``got[i] == want[i]`` for the sequences ``sel`` at row ``t``."""
        bad = rows_differ(got, want)
        self.rows += len(sel)
        self.differ += int(bad.sum())
        for i in bad.nonzero().flatten().tolist():
            if len(self.details) < MAX_DETAILS:
                b = sel[i]
                self.details.append(dict(what="output", step=step, b=b, slot=int(slots[b]),
                                         t=t, **{k: v[b] for k, v in extra.items()},
                                         **first_element(got[i], want[i])))

    def accepted(self, step, acc, o, pst, x, slot_t, layout, slots, extra):
        """Decode each row ``t`` of the sequences that accepted it on the plain state ``pst``
        (``gdn_decode``) and compare it with ``o[:, t]``, row after row."""
        for t in range(o.shape[1]):
            sel = [b for b in range(len(acc)) if acc[b] > t]
            if not sel:
                break
            self.rows_check(step, t, o[sel][:, t], _plain_rows(pst, x, t, sel, slot_t, layout),
                            sel, slots, extra)

    def mismatch(self, step, what: str, count: int, **info):
        """A protocol event that differs from what the acceptance counts imply (a swap that
        did or did not happen): counted, recorded, and the form is not bitwise."""
        self.protocol_mismatches += count
        if len(self.details) < MAX_DETAILS:
            self.details.append(dict(what=what, step=step, count=count, **info))

    def state_check(self, step, got, want, final=False):
        """Compare whole state pools (``[S, HV, ., .]``); the first difference is kept."""
        d = _state_diff(got, want)
        self.state_max = max(self.state_max, d)
        if not bitwise_equal(got, want):
            self.state_bitwise = False
            if self.first_state_diff is None:
                e = first_element(got, want)
                self.first_state_diff = dict(what="final state" if final else "folded state",
                                             step=step, slot=e["element"][0], **e)

    def result(self) -> dict:
        ok = self.differ == 0 and self.state_bitwise and self.protocol_mismatches == 0
        out = dict(form=self.form, rows_compared=self.rows, rows_differing=self.differ,
                   max_abs_state_diff=self.state_max, state_bitwise=self.state_bitwise,
                   protocol_mismatches=self.protocol_mismatches, bitwise=ok,
                   details=self.details)
        if self.first_state_diff is not None:
            out["first_state_diff"] = self.first_state_diff
        return out


def _draw(seed, n, B, HK, HV, d, K, dtype):
    return gdn_inputs(seed + 1000 + n, B, HK, HV, d, d, rows=K, dtype=dtype, state_layout="kv")


def _plain_rows(pst, x, t, sel, slot_t, layout):
    """``gdn_decode`` of row ``t`` of the sequences ``sel`` on the plain state ``pst``."""
    sel_t = torch.tensor(sel, device=pst.device)
    return gdn_decode(pst, x["q"][sel_t, t], x["k"][sel_t, t], x["v"][sel_t, t],
                      x["g"][sel_t, t], x["beta"][sel_t, t], state_indices=slot_t[sel_t],
                      state_layout=layout)


def _setup(cfg, *, B, seed, heads, progress):
    """One configuration's start, as ``(progress, HK, HV, d, K, layout, state dtype, input
    dtype, S, state, numpy rng, python rng)``: ``d = kd = vd``, ``S = B + B // 4 + 1`` slots,
    the seeded initial state ``[S, HV, d, d]`` in the layout and state dtype, and both
    generators seeded by ``seed`` (one place, so the carry and the chain start alike)."""
    HK, HV = heads
    d, K, layout = cfg["kd"], cfg["K"], cfg["layout"]
    sdt, idt = getattr(torch, cfg["state_dtype"]), getattr(torch, cfg["input_dtype"])
    S = B + B // 4 + 1
    st = gdn_inputs(seed + 7, 1, HK, HV, d, d, slots=S, dtype=torch.float32,
                    state_layout="kv")["state"]
    if layout == "vk":
        st = st.transpose(-1, -2).contiguous()
    return ({} if progress is None else progress, HK, HV, d, K, layout, sdt, idt, S,
            st.to(sdt), np.random.default_rng(seed), random.Random(seed))


def run_carry(cfg: dict, mode: str, *, B: int, steps: int, seed: int, heads=(1, 2),
              alpha: float = 0.75, p_zero: float = 0.15, progress: dict | None = None) -> dict:
    """One carried-state run (``mode`` in ``MODES``) against plain decoding; see the module
    docstring. Returns ``_Run.result()`` plus the driver's ``stats``. ``progress["launched"]``
    is set once the first verify has run."""
    progress, HK, HV, d, K, layout, sdt, idt, S, st, rng, pyrng = _setup(
        cfg, B=B, seed=seed, heads=heads, progress=progress)
    lay = CarryLayer(st.clone(), GdnCarry.empty(S, HV, d, d, state_layout=layout),
                     state_layout=layout)
    pst = st.clone()
    lazy_min = {"eager": None, "lazy": 1, "policy": B}[mode]
    step = SpecDecodeStep([lay], form="exact", lazy_min_seqs=lazy_min, validate=True)
    widths = [B, max(1, B // 2)] if mode == "policy" else [B]
    run = _Run(f"carry_{mode}")
    every = torch.arange(S, dtype=torch.int32, device=st.device)
    for n in range(steps):
        if n == steps // 2:
            step.flush(list(range(S)))               # the serving side's flush (e.g. preemption)
        Bn = widths[n % len(widths)]
        slots = pyrng.sample(range(S), Bn)
        slot_t = torch.tensor(slots, dtype=torch.int32, device=st.device)
        x = _draw(seed, n, Bn, HK, HV, d, K, idt)
        plan = step.begin(slots, K)
        pend = lay.carry.pend[slot_t.long()].cpu().tolist()
        o = step.verify_layer(0, q=x["q"], k=x["k"], v=x["v"], g=x["g"], beta=x["beta"])
        progress["launched"] = True
        wb = (step.engaged[0].cpu() == 2).tolist()
        acc = accept_counts(rng, Bn, K, alpha, p_zero)
        step.accept(acc.tolist())
        extra = dict(pend=pend, write_back=wb, lazy=[plan["lazy"]] * Bn,
                     flushed_this_step=[plan["flushed"]] * Bn)
        run.accepted(n, acc, o, pst, x, slot_t, layout, slots, extra)
        # the carry's state with every pending row folded, on clones (the run is untouched)
        if run.first_state_diff is None:
            c = dataclasses.replace(lay.carry, buf=lay.carry.buf.clone(),
                                    pend=lay.carry.pend.clone())
            folded = lay.state.clone()
            gdn_carry_flush([folded], [c], every, state_layout=layout)
            run.state_check(n, folded, pst)
    step.flush(list(range(S)))
    run.state_check(steps, lay.state, pst, final=True)
    return dict(run.result(), stats=dict(step.stats))


def _flush_all(state, carry, live, layout) -> None:
    """Fold every live slot's pending rows into ``state`` and clear their ``pend``."""
    gdn_carry_flush([state], [carry], live, state_layout=layout, validate=True)
    carry.pend.index_fill_(0, live.long(), 0)


def run_spec(cfg: dict, *, B: int, steps: int, seed: int, heads=(1, 2), alpha: float = 0.75,
             p_zero: float = 0.15, progress: dict | None = None) -> dict:
    """The lazy carry with the speculative store against plain decoding (one layer:
    ``gdn_carry_verify(..., spec_slot_tab=...)`` + ``carry_accept_spec``). Sequence ``s`` owns
    slots ``s`` and ``s + S`` of a ``2 S`` pool; a commit accepting all ``K`` rows swaps them,
    so its live slot moves (read back from the updated ``slot_tab``); a lane that moved without
    accepting all ``K`` rows, or accepted them all and did not move, is a protocol mismatch.
    Every slot flushed at mid-run and at the end, the folded state compared every step, as in
    ``run_carry``; a differing row's ``slot`` is the pool slot its verify read, a state
    difference's is the sequence. Returns ``_Run.result()`` plus ``stats`` (``steps``,
    ``swaps``: lanes the commits moved to their spare slot)."""
    progress, HK, HV, d, K, layout, sdt, idt, S, st, rng, pyrng = _setup(
        cfg, B=B, seed=seed, heads=heads, progress=progress)
    state = torch.cat([st, st]).contiguous()
    carry = GdnCarry.empty(2 * S, HV, d, d, state_layout=layout)
    live = torch.arange(S, dtype=torch.int32, device=st.device)   # sequence -> its live slot
    pst = st.clone()
    run = _Run("carry_spec")
    swaps = 0
    for n in range(steps):
        if n == steps // 2:
            _flush_all(state, carry, live, layout)
        seqs = pyrng.sample(range(S), B)
        seq_t = torch.tensor(seqs, dtype=torch.int32, device=st.device)
        slot_tab = live[seq_t.long()].contiguous()
        spare = torch.where(slot_tab < S, slot_tab + S, slot_tab - S).contiguous()
        x = _draw(seed, n, B, HK, HV, d, K, idt)
        pend = carry.pend[slot_tab.long()].cpu().tolist()
        o, eng = gdn_carry_verify(state, carry, x["q"], x["k"], x["v"], x["g"], x["beta"],
                                  slot_tab=slot_tab, lazy=True, state_layout=layout,
                                  validate=True, spec_slot_tab=spare)
        progress["launched"] = True
        acc = accept_counts(rng, B, K, alpha, p_zero)
        extra = dict(pend=pend, write_back=(eng.cpu() == 2).tolist(), lazy=[True] * B,
                     flushed_this_step=[int(n == steps // 2)] * B)
        before = slot_tab.tolist()
        carry_accept_spec(carry, slot_tab, spare, eng, acc.tolist(), rows=K, validate=True)
        moved = torch.tensor([a != b for a, b in zip(slot_tab.tolist(), before)])
        wrong = moved != torch.from_numpy(acc == K)
        if wrong.any():
            run.mismatch(n, "swap", int(wrong.sum()), lanes=wrong.nonzero().flatten().tolist())
        live[seq_t.long()] = slot_tab                 # the commit swapped full acceptances
        swaps += int(moved.sum())
        run.accepted(n, acc, o, pst, x, seq_t, layout, before, extra)
        if run.first_state_diff is None:
            c = dataclasses.replace(carry, buf=carry.buf.clone(), pend=carry.pend.clone())
            folded = state.clone()
            gdn_carry_flush([folded], [c], live, state_layout=layout)
            run.state_check(n, folded[live.long()], pst)
    _flush_all(state, carry, live, layout)
    run.state_check(steps, state[live.long()], pst, final=True)
    return dict(run.result(), stats=dict(steps=steps, swaps=swaps))


def run_chain(cfg: dict, *, B: int, steps: int, seed: int, heads=(1, 2), alpha: float = 0.75,
              p_zero: float = 0.15, progress: dict | None = None) -> dict:
    """The chain with ``K-1`` snapshots and the restore against plain decoding, state
    compared after every step (``progress`` as in ``run_carry``)."""
    progress, HK, HV, d, K, layout, sdt, idt, S, st, rng, pyrng = _setup(
        cfg, B=B, seed=seed, heads=heads, progress=progress)
    cst, pst = st.clone(), st.clone()
    run = _Run("chain")
    inter = torch.empty(B, K - 1, *st.shape[1:], dtype=sdt, device=st.device)
    for n in range(steps):
        slots = pyrng.sample(range(S), B)
        slot_t = torch.tensor(slots, dtype=torch.int32, device=st.device)
        x = _draw(seed, n, B, HK, HV, d, K, idt)
        before = cst[slot_t.long()].clone()
        o = gdn_chain(cst, x["q"], x["k"], x["v"], x["g"], x["beta"], state_indices=slot_t,
                      intermediate=inter, state_layout=layout)
        progress["launched"] = True
        acc = accept_counts(rng, B, K, alpha, p_zero)
        acc_t = torch.tensor(acc, dtype=torch.int32, device=st.device)
        gdn_snapshot_restore(cst, inter, slot_t, acc_t, last_in_place=True)
        zero = torch.tensor([b for b in range(B) if acc[b] == 0], dtype=torch.long,
                            device=st.device)
        if zero.numel():
            cst[slot_t.long()[zero]] = before[zero]
        extra = dict(pend=[0] * B, write_back=[False] * B, lazy=[False] * B,
                     flushed_this_step=[0] * B)
        run.accepted(n, acc, o, pst, x, slot_t, layout, slots, extra)
        run.state_check(n, cst, pst, final=n == steps - 1)
    return run.result()


def run_config(cfg: dict, *, B: int = 32, steps: int = 12, seed: int = 0, heads=(1, 2),
               forms=FORMS) -> dict:
    """Every form of ``forms`` at one configuration: the config, ``status`` (``"bitwise"``,
    ``"differs"``, ``"unsupported"`` (refused before any launch), ``"n/a"`` (no form of
    ``forms`` takes it) or ``"error"``), the totals
    over the forms that ran (``rows_compared``, ``rows_differing``, ``max_abs_state_diff``,
    ``bitwise``), per-form results (a form ``FORM_LAYOUTS`` rules out as ``{form, status:
    "n/a", reason}``, not run) and the seconds taken."""
    t0 = time.perf_counter()
    rec = dict(config=config_name(cfg), **cfg, B=B, steps=steps, seed=seed, heads=list(heads))
    results = []
    size = dict(B=B, steps=steps, seed=seed, heads=heads)
    progress = {"launched": False}
    try:
        for form in forms:
            if cfg["layout"] not in FORM_LAYOUTS.get(form, LAYOUTS):
                results.append(dict(form=form, status="n/a", reason=(
                    f"{form} takes state_layout {', '.join(FORM_LAYOUTS[form])} only")))
            elif form == "chain":
                results.append(run_chain(cfg, **size, progress=progress))
            elif form == "carry_spec":
                results.append(run_spec(cfg, **size, progress=progress))
            else:
                results.append(run_carry(cfg, form.removeprefix("carry_"), **size,
                                         progress=progress))
    except ValueError as exc:
        # a launcher's documented refusal comes before its first launch; a ValueError later
        # (validate=True finding a bad pend, say) is a failure
        status = "error" if progress["launched"] else "unsupported"
        rec.update(status=status, error=f"{type(exc).__name__}: {exc}")
    except Exception as exc:             # anything else is a failure of the grid
        rec.update(status="error", error=f"{type(exc).__name__}: {exc}")
    ran = [r for r in results if r.get("status") != "n/a"]
    if "status" not in rec:
        rec.update(status="n/a" if not ran else
                   "bitwise" if all(r["bitwise"] for r in ran) else "differs")
    rec.update(rows_compared=sum(r["rows_compared"] for r in ran),
               rows_differing=sum(r["rows_differing"] for r in ran),
               max_abs_state_diff=max([r["max_abs_state_diff"] for r in ran], default=0.0),
               bitwise=rec["status"] == "bitwise", forms=results,
               seconds=round(time.perf_counter() - t0, 3))
    return rec


def summary_line(rec: dict) -> str:
    """One line: config, rows compared, rows differing, max abs state difference, bitwise."""
    line = (f"{rec['config']:<44} rows {rec['rows_compared']:>6}  differ {rec['rows_differing']:>4}"
            f"  state_max_abs {rec['max_abs_state_diff']:.3e}  bitwise "
            f"{'yes' if rec['bitwise'] else 'no'}  [{rec['status']}, {rec['seconds']:.1f} s]")
    n_a = [r["form"] for r in rec.get("forms", []) if r.get("status") == "n/a"]
    if n_a:
        line += f"  n/a: {', '.join(n_a)}"
    if rec.get("error"):
        line += f"  {rec['error']}"
    return line


def detail_lines(rec: dict) -> list[str]:
    """For a configuration that differs: per form that differs, its counts, the first step
    where its folded state leaves plain decoding, and its first differing rows."""
    out = []
    for r in rec["forms"]:
        if r.get("status") == "n/a" or r["bitwise"]:
            continue
        out.append(f"    {r['form']}: rows differ {r['rows_differing']} of {r['rows_compared']},"
                   f" state bitwise {r['state_bitwise']}, max abs {r['max_abs_state_diff']:.3e}"
                   + (f", protocol mismatches {r['protocol_mismatches']}"
                      if r.get("protocol_mismatches") else ""))
        if r.get("first_state_diff"):
            out.append(f"      first state diff: {json.dumps(r['first_state_diff'])}")
        out += [f"      row: {json.dumps(d)}" for d in r["details"]]
    return out


def run_grid(cfgs, *, B: int, steps: int, seed: int, heads=(1, 2), forms=FORMS, out=None,
             echo=print, run=None, lines=None) -> list[dict]:
    """``run`` (``run_config``) for every configuration, its ``lines`` (a summary line and the
    detail lines of a differing one) through ``echo``; each record appended to the JSON-lines
    file ``out`` as it completes. Returns the records."""
    recs = []
    kw = dict(forms=forms) if run is None else {}
    run = run_config if run is None else run
    with open(out, "a") if out else contextlib.nullcontext() as fh:
        for cfg in cfgs:
            rec = run(cfg, B=B, steps=steps, seed=seed, heads=heads, **kw)
            recs.append(rec)
            for line in (lines or (lambda r: [summary_line(r), *detail_lines(r)]))(rec):
                echo(line)
            if fh:
                fh.write(json.dumps(rec) + "\n")
                fh.flush()
    return recs


def int_list(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(","))


def name_list(allowed):
    def parse(text: str) -> tuple[str, ...]:
        names = tuple(text.split(","))
        bad = [n for n in names if n not in allowed]
        if bad:
            raise argparse.ArgumentTypeError(f"{bad} not in {allowed}")
        return names
    return parse


def main(argv=None) -> int:
    """The command line (``--help``); exit 0 when every configuration run is bitwise or
    unsupported, 1 otherwise."""
    ap = argparse.ArgumentParser(prog="python -m pmll_lab.experiments.exactness",
                                 description="The exact carry (eager, lazy, serving policy, "
                                             "speculative store) and the chain against plain GDN decoding, bitwise, "
                                             "over a grid of configurations.")
    ap.add_argument("--head-dims", type=int_list, default=HEAD_DIMS, help="kd = vd values")
    ap.add_argument("--layouts", type=name_list(LAYOUTS), default=LAYOUTS)
    ap.add_argument("--state-dtypes", type=name_list(STATE_DTYPES), default=STATE_DTYPES)
    ap.add_argument("--input-dtypes", type=name_list(INPUT_DTYPES), default=INPUT_DTYPES)
    ap.add_argument("--rows", type=int_list, default=ROWS, help="K values")
    ap.add_argument("--forms", type=name_list(FORMS), default=FORMS)
    ap.add_argument("--batch", type=int, default=32, help="B, sequences per step")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--heads", type=int_list, default=(1, 2), help="HK,HV (default 1,2)")
    ap.add_argument("--out", default=None, help="JSON-lines file, one record per configuration "
                                                 "(appended)")
    args = ap.parse_args(argv)
    if args.batch < 1 or args.steps < 1 or len(args.heads) != 2:
        ap.error("--batch and --steps must be >= 1, --heads two ints HK,HV")
    cfgs = configs(args.head_dims, args.layouts, args.state_dtypes, args.input_dtypes,
                   args.rows)
    print(f"exactness grid: {len(cfgs)} configurations, B={args.batch}, steps={args.steps}, "
          f"heads={args.heads}, seed={args.seed}, device={DEVICE}", flush=True)
    recs = run_grid(cfgs, B=args.batch, steps=args.steps, seed=args.seed, heads=args.heads,
                    forms=args.forms, out=args.out, echo=lambda s: print(s, flush=True))
    counts = {s: sum(r["status"] == s for r in recs)
              for s in ("bitwise", "differs", "unsupported", "n/a", "error")}
    print("summary: " + ", ".join(f"{v} {k}" for k, v in counts.items()), flush=True)
    return 1 if counts["differs"] or counts["error"] else 0


if __name__ == "__main__":
    sys.exit(main())
