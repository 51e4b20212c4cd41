"""The roofline's own providers, checked, then timed: ``K`` decode launches (``point_decodes``),
the snapshot chain (``point_chain``) and the carried-state verify in its exact / WY form, eager
or lazy (``point_carry``; the lazy form timed without and with a write-back and amortised).

Each takes a ``roofline_case._Case`` and returns the provider's tidy rows, as
``roofline.gdn_point`` documents (checks, bytes and timers: ``roofline``'s module docstring).
Our launchers are called as attributes of ``roofline`` (``E.gdn_chain``), so that a test that
replaces one there (to break a check, or a launch plan) replaces it here too.
"""

from __future__ import annotations

import numpy as np
import torch

from pmll_lab.backend import DEVICE
from pmll_lab.bench import bitwise_equal, error_rows
from pmll_lab.gdn import chain_bytes, decodes_bytes
from pmll_lab.experiments import roofline as E
from pmll_lab.experiments.roofline import (
    PLAN_MAX_B, PLAN_SUFFIX, WY_TOL, _flag, _mix, _require, _speed_rows, _time, carry_bytes,
)
from pmll_lab.experiments.roofline_case import _Case, clone_carry


def point_decodes(c: _Case) -> list[dict]:
    o_dec, st_sel, _ = c.decoded()
    name = "decodes"
    rows = (error_rows(name, o_dec[:c.n], c.o_ref, tol=c.otol, what="o")
            + error_rows(name, st_sel[:c.n], c.to_layout(c.s_ref[:c.n]), tol=c.stol,
                         what="state"))
    plans = None
    if c.B <= PLAN_MAX_B:
        # the same K decodes through launch plans (lean host path): checked bitwise on their
        # second call, the first that skips Triton's launcher on a GPU
        st_p = c.state0.clone()
        plans = [E.gdn_decode_plan(st_p, *c.row_args[r], state_indices=c.sel, **c.lay)
                 for r in range(c.K)]
        for _ in range(2):
            st_p.copy_(c.state0)
            o_p = torch.stack([p().clone() for p in plans], 1)
        rows.append(_flag(f"{name}{PLAN_SUFFIX}", "bitwise_vs_decode",
                          bitwise_equal(o_p, o_dec) and bitwise_equal(st_p[c.lsel], st_sel),
                          "o and state"))
    _require(rows)
    st = c.state0.clone()

    def run():
        for r in range(c.K):
            E.gdn_decode(st, *c.row_args[r], state_indices=c.sel, **c.lay)

    nbytes = decodes_bytes(c.B, c.K, **c.io())
    rows += _speed_rows(name, _time(run), nbytes, variant="")
    if plans is not None:
        def run_plans():
            for p in plans:
                p()

        rows += _speed_rows(f"{name}{PLAN_SUFFIX}", _time(run_plans, graph=False), nbytes,
                            variant="launch plan")
    return rows


def point_chain(c: _Case) -> list[dict]:
    name = "chain_snapshots"
    st = c.state0.clone()
    inter = torch.empty(c.B, c.K - 1, c.HV, c.D, c.D, dtype=c.sdt, device=DEVICE)
    o = E.gdn_chain(st, *c.args, state_indices=c.sel, intermediate=inter, validate=True, **c.lay)
    rows = (error_rows(name, o[:c.n], c.o_ref, tol=c.otol, what="o")
            + error_rows(name, st[c.lsel[:c.n]], c.to_layout(c.s_ref), tol=c.stol,
                         what="state")
            + error_rows(name, inter[:c.n], c.to_layout(c.i_ref), tol=c.stol,
                         what="snapshots"))
    o_dec, st_dec, snaps = c.decoded()
    rows += [_flag(name, "bitwise_vs_decode", bitwise_equal(o, o_dec), "o"),
             _flag(name, "bitwise_vs_decode", bitwise_equal(st[c.lsel], st_dec), "state"),
             _flag(name, "bitwise_vs_decode",
                   all(bitwise_equal(inter[:, t], snaps[t]) for t in range(c.K - 1)), "snapshots")]
    _require(rows)

    def run():
        E.gdn_chain(st, *c.args, state_indices=c.sel, intermediate=inter, **c.lay)

    return rows + _speed_rows(name, _time(run), chain_bytes(c.B, c.K, **c.io()), variant="")


VARIANT_NAMES = {"eager": "eager", "nowb": "no write-back", "wb": "write-back"}


def point_carry(c: _Case, form: str, lazy: bool) -> list[dict]:
    name = f"carry_{form}_{'lazy' if lazy else 'eager'}"
    variants = ("nowb", "wb") if lazy else ("eager",)
    rows: list[dict] = []
    ready = []
    for var in variants:
        cc = c.carry_case(var)
        tag = "" if var == "eager" else f" ({VARIANT_NAMES[var]})"
        st, carry = c.state0.clone(), clone_carry(cc["carry"])
        o, eng = E.gdn_carry_verify(st, carry, *c.args, slot_tab=c.sel, form=form, lazy=lazy,
                                    validate=True, eager_max_pending=None, **c.lay)
        wb = cc["wb"]
        want_eng = torch.as_tensor(np.where(wb, 2, 1), dtype=torch.int32)
        rows.append(_flag(name, "engaged_as_protocol", torch.equal(eng.cpu(), want_eng),
                          "engaged" + tag))
        otol = c.otol if form == "exact" else max(c.otol, WY_TOL)
        s = c.lsel[:c.n]
        rows += error_rows(name, o[:c.n], cc["o_ref"], tol=otol, what="o" + tag)
        rows += error_rows(name, st[s], c.to_layout(cc["state_ref"]), tol=c.stol,
                           what="state" + tag)
        rows += error_rows(name, carry.u[s], cc["u_ref"],
                           tol=c.stol if form == "exact" else WY_TOL, what="stash u" + tag)
        # Over all B sequences: sequences that do not write back leave the state as it was;
        # those that do store the state with their pending rows folded (flagged only where
        # such sequences exist, so that no flag passes vacuously).
        wbm = torch.as_tensor(wb, device=DEVICE)
        st_b = st[c.lsel]
        if not wb.all():
            rows.append(_flag(name, "bitwise_vs_decode",
                              bitwise_equal(st_b[~wbm], c.state0[c.lsel][~wbm]),
                              "state untouched without write-back" + tag))
        if form == "exact":
            rows.append(_flag(name, "bitwise_vs_decode", bitwise_equal(o, cc["o_dec"]), "o" + tag))
            if wb.any():
                rows.append(_flag(name, "bitwise_vs_decode",
                                  bitwise_equal(st_b[wbm], cc["folded"][wbm]),
                                  "written-back state" + tag))
        else:
            rows += error_rows(name, o, cc["o_dec"], tol=otol, what="o vs decode" + tag)
            if wb.any():
                rows += error_rows(name, st_b[wbm], cc["folded"][wbm], tol=c.stol,
                                        what="written-back state" + tag)
        del st_b
        plan = None
        if c.B <= PLAN_MAX_B:
            # the same verify through a launch plan (lean host path), checked bitwise against
            # the launch above on its second call (the first that skips Triton's launcher)
            st_p, carry_p = c.state0.clone(), clone_carry(cc["carry"])
            plan = E.gdn_carry_verify_plan(st_p, carry_p, *c.args, slot_tab=c.sel, form=form,
                                           lazy=lazy, **c.lay)
            for _ in range(2):
                st_p.copy_(c.state0)
                carry_p.buf.copy_(cc["carry"].buf)
                o_p, e_p = plan()
            rows.append(_flag(f"{name}{PLAN_SUFFIX}", "bitwise_vs_launcher",
                              bitwise_equal(o_p, o) and bitwise_equal(e_p, eng)
                              and bitwise_equal(st_p, st) and bitwise_equal(carry_p.buf, carry.buf),
                              "o, engaged, state, stash" + tag))
        nbytes = carry_bytes(cc["pend"], wb, c.K, c.HK, c.HV, c.D, c.dtype, c.sdt)
        ready.append((var, st, carry, nbytes, float(np.mean(cc["pend"])), float(np.mean(wb)),
                      plan))
    _require(rows)

    timed = {}
    for var, st, carry, nbytes, mean_pend, wb_frac, plan in ready:
        def run(st=st, carry=carry):
            E.gdn_carry_verify(st, carry, *c.args, slot_tab=c.sel, form=form, lazy=lazy, **c.lay)

        t = _time(run)
        timed[var] = (t, nbytes)
        kname = name if var == "eager" else f"{name}:{var}"
        rows += _speed_rows(kname, t, nbytes, variant=VARIANT_NAMES[var],
                            mean_pend=mean_pend, wb_frac=wb_frac)
        if plan is not None:
            rows += _speed_rows(f"{kname}{PLAN_SUFFIX}", _time(plan, graph=False), nbytes,
                                variant=f"{VARIANT_NAMES[var]}, launch plan",
                                mean_pend=mean_pend, wb_frac=wb_frac)
    if lazy:
        f = float(c.acc["lazy_wb"])
        (t0, b0), (t1, b1) = timed["nowb"], timed["wb"]
        rows += _speed_rows(name, _mix(t0, t1, f), round((1 - f) * b0 + f * b1),
                            variant="amortised", wb_frac=f,
                            mean_pend=float(c.acc["lazy_mean_pend"]))
    return rows
