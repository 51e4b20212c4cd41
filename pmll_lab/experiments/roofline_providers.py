"""The roofline's providers, each checked, then timed, on a ``roofline_case._Case``; ours
bitwise against the decodes, peers (GPU only, ``RuntimeError`` otherwise) against float64 on
``N_REF`` sequences and our decodes within the tolerances; a frozen verify must leave the pool
as it was. Launchers are called through ``roofline_case`` (a test replaces them there).
"""

from __future__ import annotations

import numpy as np
import torch

from pmll_lab import peers
from pmll_lab.backend import DEVICE
from pmll_lab.bench import bitwise_equal, error_rows
from pmll_lab.experiments import protocol as P
from pmll_lab.experiments import roofline_case as C
from pmll_lab.experiments.gdn import carry_bytes, clone_carry, fla_bytes, frozen_bytes
from pmll_lab.gdn import chain_bytes, decode_bytes, decodes_bytes

PLAN = P.PLAN_SUFFIX
VARIANT_NAMES = {"eager": "eager", "nowb": "no write-back", "wb": "write-back"}


def _time(fn, graph: bool = True) -> list[dict]:
    return P.timings(fn, graph=graph, **C.TIMING)


def point_decodes(c: C._Case) -> list[dict]:
    o_dec, st_sel, _ = c.decoded()
    name = "decodes"
    rows = (error_rows(name, o_dec[:c.n], c.o_ref, tol=c.otol, what="o")
            + error_rows(name, st_sel[:c.n], c.to_layout(c.s_ref[:c.n]), tol=c.stol,
                         what="state"))
    plans = None
    if c.B <= C.PLAN_MAX_B:
        # the same decodes through launch plans, checked bitwise on their second call (the
        # first that skips Triton's launcher on a GPU)
        st_p = c.state0.clone()
        plans = [C.gdn_decode_plan(st_p, *c.row_args[r], state_indices=c.sel, **c.lay)
                 for r in range(c.K)]
        for _ in range(2):
            st_p.copy_(c.state0)
            o_p = torch.stack([p().clone() for p in plans], 1)
        rows.append(P.flag(name + PLAN, "bitwise_vs_decode",
                           bitwise_equal(o_p, o_dec) and bitwise_equal(st_p[c.lsel], st_sel),
                           "o and state"))
    P.require(rows)
    st = c.state0.clone()

    def run():
        for r in range(c.K):
            C.gdn_decode(st, *c.row_args[r], state_indices=c.sel, **c.lay)

    nbytes = decodes_bytes(c.B, c.K, **c.io())
    rows += P.speed_rows(name, _time(run), nbytes, variant="")
    if plans is not None:
        def run_plans():
            for p in plans:
                p()

        rows += P.speed_rows(name + PLAN, _time(run_plans, graph=False), nbytes,
                             variant="launch plan")
    return rows


def point_decodes_cuda(c: C._Case) -> list[dict]:
    """``K`` launches of the decode's CUDA C++ twin (``gdn_decode(impl="cuda")``, V-major),
    checked against the float64 chain (not bitwise against Triton: another order of sums)."""
    name = "decodes_cuda"
    st = c.state0.clone()
    o = torch.stack([C.gdn_decode(st, *c.row_args[r], state_indices=c.sel, impl="cuda",
                                  **c.lay) for r in range(c.K)], 1)
    rows = (error_rows(name, o[:c.n], c.o_ref, tol=c.otol, what="o")
            + error_rows(name, st[c.lsel[:c.n]], c.to_layout(c.s_ref[:c.n]), tol=c.stol,
                         what="state"))
    P.require(rows)
    st = c.state0.clone()

    def run():
        for r in range(c.K):
            C.gdn_decode(st, *c.row_args[r], state_indices=c.sel, impl="cuda", **c.lay)

    return rows + P.speed_rows(name, _time(run), decodes_bytes(c.B, c.K, **c.io()), variant="")


def point_chain(c: C._Case, impl: str = "triton") -> list[dict]:
    """The chain with its ``K-1`` snapshots against the float64 chain; the Triton one also
    bitwise against the decodes (the CUDA twin sums in another order: bitwise only within its
    family, which its own tests check)."""
    name = "chain_snapshots" + ("_cuda" if impl == "cuda" else "")
    kw = dict(c.lay, **({"impl": "cuda"} if impl == "cuda" else {}))
    st = c.state0.clone()
    inter = torch.empty(c.B, c.K - 1, c.HV, c.D, c.D, dtype=c.sdt, device=DEVICE)
    o = C.gdn_chain(st, *c.args, state_indices=c.sel, intermediate=inter,
                    **({} if impl == "cuda" else {"validate": True}), **kw)
    rows = (error_rows(name, o[:c.n], c.o_ref, tol=c.otol, what="o")
            + error_rows(name, st[c.lsel[:c.n]], c.to_layout(c.s_ref), tol=c.stol, what="state")
            + error_rows(name, inter[:c.n], c.to_layout(c.i_ref), tol=c.stol, what="snapshots"))
    if impl == "triton":
        o_dec, st_dec, snaps = c.decoded()
        rows += [P.flag(name, "bitwise_vs_decode", bitwise_equal(o, o_dec), "o"),
                 P.flag(name, "bitwise_vs_decode", bitwise_equal(st[c.lsel], st_dec), "state"),
                 P.flag(name, "bitwise_vs_decode",
                        all(bitwise_equal(inter[:, t], snaps[t]) for t in range(c.K - 1)),
                        "snapshots")]
    P.require(rows)

    def run():
        C.gdn_chain(st, *c.args, state_indices=c.sel, intermediate=inter, **kw)

    return rows + P.speed_rows(name, _time(run), chain_bytes(c.B, c.K, **c.io()), variant="")


def point_chain_cuda(c: C._Case) -> list[dict]:
    return point_chain(c, "cuda")


def _check_carry(c: C._Case, name: str, form: str, lazy: bool, var: str, rows: list[dict]):
    """Run and check one pending-count variant; returns ``(state, carry, bytes, mean pend,
    write-back fraction, plan)`` for the timing."""
    cc = c.carry_case(var)
    tag = "" if var == "eager" else f" ({VARIANT_NAMES[var]})"
    st, carry = c.state0.clone(), clone_carry(cc["carry"])
    o, eng = C.gdn_carry_verify(st, carry, *c.args, slot_tab=c.sel, form=form, lazy=lazy,
                                validate=True, eager_max_pending=None, **c.lay)
    wb = cc["wb"]
    rows.append(P.flag(name, "engaged_as_protocol", torch.equal(
        eng.cpu(), torch.as_tensor(np.where(wb, 2, 1), dtype=torch.int32)), "engaged" + tag))
    s = c.lsel[:c.n]
    rows += error_rows(name, o[:c.n], cc["o_ref"], tol=c.otol, what="o" + tag)
    rows += error_rows(name, st[s], c.to_layout(cc["state_ref"]), tol=c.stol, what="state" + tag)
    rows += error_rows(name, carry.u[s], cc["u_ref"], what="stash u" + tag, tol=c.stol)
    # over all B: no write-back leaves the state as it was; a write-back stores the state with
    # the pending rows folded (flagged only where such sequences exist)
    wbm = torch.as_tensor(wb, device=DEVICE)
    st_b = st[c.lsel]
    if not wb.all():
        rows.append(P.flag(name, "bitwise_vs_decode",
                           bitwise_equal(st_b[~wbm], c.state0[c.lsel][~wbm]),
                           "state untouched without write-back" + tag))
    rows.append(P.flag(name, "bitwise_vs_decode", bitwise_equal(o, cc["o_dec"]), "o" + tag))
    if wb.any():
        rows.append(P.flag(name, "bitwise_vs_decode",
                           bitwise_equal(st_b[wbm], cc["folded"][wbm]),
                           "written-back state" + tag))
    plan = None
    if c.B <= C.PLAN_MAX_B:
        # the same verify through a launch plan, bitwise against the launch above on its
        # second call (the first that skips Triton's launcher)
        st_p, carry_p = c.state0.clone(), clone_carry(cc["carry"])
        plan = C.gdn_carry_verify_plan(st_p, carry_p, *c.args, slot_tab=c.sel, form=form,
                                       lazy=lazy, **c.lay)
        for _ in range(2):
            st_p.copy_(c.state0)
            carry_p.buf.copy_(cc["carry"].buf)
            o_p, e_p = plan()
        rows.append(P.flag(name + PLAN, "bitwise_vs_launcher",
                           bitwise_equal(o_p, o) and bitwise_equal(e_p, eng)
                           and bitwise_equal(st_p, st) and bitwise_equal(carry_p.buf, carry.buf),
                           "o, engaged, state, stash" + tag))
    nbytes = carry_bytes(cc["pend"], wb, c.K, c.HK, c.HV, c.D, c.dtype, c.sdt)
    return st, carry, nbytes, float(np.mean(cc["pend"])), float(np.mean(wb)), plan


def point_carry(c: C._Case, form: str, lazy: bool) -> list[dict]:
    name = f"carry_{form}_{'lazy' if lazy else 'eager'}"
    rows: list[dict] = []
    ready = {var: _check_carry(c, name, form, lazy, var, rows)
             for var in (("nowb", "wb") if lazy else ("eager",))}
    P.require(rows)
    timed, plans = {}, {}
    for var, (st, carry, nbytes, mean_pend, wb_frac, plan) in ready.items():
        def run(st=st, carry=carry):
            C.gdn_carry_verify(st, carry, *c.args, slot_tab=c.sel, form=form, lazy=lazy, **c.lay)

        kname = name if var == "eager" else f"{name}:{var}"
        timed[var] = (_time(run), nbytes)
        rows += P.speed_rows(kname, timed[var][0], nbytes, variant=VARIANT_NAMES[var],
                             mean_pend=mean_pend, wb_frac=wb_frac)
        if plan is not None:
            plans[var] = _time(plan, graph=False)
            rows += P.speed_rows(kname + PLAN, plans[var], nbytes, mean_pend=mean_pend,
                                 variant=f"{VARIANT_NAMES[var]}, launch plan", wb_frac=wb_frac)
    if lazy:
        f = float(c.acc["lazy_wb"])
        (t0, b0), (t1, b1) = timed["nowb"], timed["wb"]
        extra = dict(variant="amortised", wb_frac=f, mean_pend=float(c.acc["lazy_mean_pend"]))
        nbytes = round((1 - f) * b0 + f * b1)
        rows += P.speed_rows(name, P.mix(t0, t1, f), nbytes, **extra)
        if plans:
            rows += P.speed_rows(name + PLAN, P.mix(plans["nowb"], plans["wb"], f), nbytes,
                                 **extra)
    return rows


# ---- peers ------------------------------------------------------------------------------------

def point_fla(c) -> list[dict]:
    """FLA over the case's ``K`` rows (K-major only); rows named ``fla_fused_recurrent``."""
    name = "fla_fused_recurrent"
    if peers.fla_fused_recurrent() is None or not P.on_cuda():
        raise RuntimeError("fla_fused_recurrent: needs a GPU and an importable fla-core")
    if c.layout != "kv":
        raise ValueError(f"state_layout: FLA runs K-major states only, got {c.layout!r}")
    q, k, v, g, beta = (t.contiguous() for t in c.args)
    run, gva = peers.fla_runner(q, k, v, g, beta, c.state0[c.lsel].contiguous(),
                                scale=c.D ** -0.5)
    o_f, h_f = run()
    o_dec, st_dec, _ = c.decoded()
    rows = (error_rows(name, o_f[:c.n], c.o_ref, tol=c.otol, what="o")
            + error_rows(name, h_f[:c.n], c.s_ref, tol=c.stol, what="state")
            + error_rows(name, o_f, o_dec, tol=c.otol, what="o vs decode")
            + error_rows(name, h_f, st_dec, tol=c.stol, what="state vs decode"))
    P.require(rows)
    del o_f, h_f
    return rows + P.speed_rows(name, P.timings(run, **C.TIMING),
                               fla_bytes(c.B, c.K, c.HK, c.HV, c.D, c.dtype), variant="",
                               fla_gva=gva, fla_version=peers.fla_version())


def _vk(t: torch.Tensor) -> torch.Tensor:
    """A K-major state tensor ``[..., kd, vd]`` seen V-major."""
    return t.transpose(-1, -2)


def point_flashinfer(c, provider: str) -> list[dict]:
    """One FlashInfer provider (``roofline_case.FLASHINFER``) on a V-major case; its time rows
    carry ``flashinfer_version``."""
    if provider not in C.FLASHINFER:
        raise ValueError(f"provider: not a FlashInfer provider: {provider!r}")
    if peers.flashinfer_gdn() is None or not P.on_cuda():
        raise RuntimeError(f"{provider}: needs a GPU and an importable flashinfer-python")
    if c.layout != "vk":
        raise ValueError(f"state_layout: FlashInfer runs V-major states only, got {c.layout!r}")
    name, K, n = provider, c.K, c.n
    pool = c.state0.clone()                                     # [S, HV, vd, kd]
    A_log, a, dt_bias, b = c.gate
    q, k, v = c.args[:3]
    gate = (A_log, a[:c.B, :K], dt_bias, b[:c.B, :K])
    if provider == "flashinfer_decode":
        run, bufs = peers.flashinfer_decode_runner(q, k, v, *gate, pool, c.sel, scale=c.D ** -0.5)
    else:
        run, bufs = peers.flashinfer_mtp_runner(q, k, v, *gate, pool, c.sel, scale=c.D ** -0.5,
                                                snapshots=provider.endswith("snapshots"),
                                                frozen=True)
    run()
    o = bufs["o"]
    o_ref, s_ref, i_ref = c.fi_ref()
    o_dec, st_dec, snaps = c.decoded("kv")
    rows = (error_rows(name, o[:n], o_ref, tol=c.otol, what="o")
            + error_rows(name, o, o_dec, tol=c.otol, what="o vs decode"))
    if provider == "flashinfer_decode":
        st = pool[c.lsel]
        rows += (error_rows(name, st[:n], _vk(s_ref), tol=c.stol, what="state")
                 + error_rows(name, st, _vk(st_dec), tol=c.stol, what="state vs decode"))
        nbytes = decode_bytes(c.B, **c.io())
    else:
        rows.append(P.flag(name, "state_untouched", bitwise_equal(pool, c.state0),
                           "pool unchanged (disable_state_update=True)"))
        inter = bufs["intermediate"]
        if inter is not None:                                   # [B, K, HV, vd, kd]
            rows += (error_rows(name, inter[:n, :K - 1], _vk(i_ref), tol=c.stol,
                                what="snapshots")
                     + error_rows(name, inter[:n, K - 1], _vk(s_ref), tol=c.stol, what="state")
                     + error_rows(name, inter[:, :K - 1], _vk(torch.stack(snaps, 1)),
                                  tol=c.stol, what="snapshots vs decode")
                     + error_rows(name, inter[:, K - 1], _vk(st_dec), tol=c.stol,
                                  what="state vs decode"))
            nbytes = chain_bytes(c.B, K, **c.io())
        else:
            nbytes = frozen_bytes(c.B, K, c.HK, c.HV, c.D, c.dtype, c.sdt)
    P.require(rows)
    return rows + P.speed_rows(name, P.timings(run, **C.TIMING), nbytes, variant="",
                               flashinfer_version=peers.flashinfer_version())
