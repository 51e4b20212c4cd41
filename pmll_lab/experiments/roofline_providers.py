"""The roofline's providers, each checked, then timed, on a ``roofline_case.RooflineCase``; ours
bitwise against the decodes, peers (GPU only, ``RuntimeError`` otherwise) against float64 on
``N_REF`` sequences and our decodes within the tolerances; a frozen verify must leave the pool
as it was. Launchers are called through ``gdn_case`` (a test replaces them there).

Each point function takes the ``RooflineCase`` and the provider's registered ``name`` (its rows'
``kernel``); importing this module binds them to the ``roofline_verify`` registrations
(``harness.verify.bind``; ``harness.verify.point(name)`` gives one back).
"""

from __future__ import annotations

from functools import partial

import numpy as np
import torch

from pmll_lab import peers
from pmll_lab.bench import bitwise_equal, error_rows
from pmll_lab.experiments import protocol as P
from pmll_lab.experiments import gdn_case as GC
from pmll_lab.experiments import roofline_case as C
from pmll_lab.harness import registry
from pmll_lab.harness import verify as V
from pmll_lab.harness.decode import FLASHINFER_DECODE
from pmll_lab.sizes import (carry_bytes, chain_bytes, decode_bytes, decodes_bytes, fla_bytes,
                            frozen_bytes)

PLAN = P.PLAN_SUFFIX
VARIANT_NAMES = {"eager": "eager", "nowb": "no write-back", "wb": "write-back"}


def _time(fn, graph: bool = True) -> list[dict]:
    return P.timings(fn, graph=graph, **C.TIMING)


def point_decodes(c: C.RooflineCase, name: str) -> list[dict]:
    """``K`` launches of the Triton decode (and, at ``B <= PLAN_MAX_B``, through launch plans:
    ``<name>:plan``), checked against the float64 chain; rows named ``name``."""
    o_dec, st_sel, _, _ = c.decoded()
    rows = c.ref_rows(name, o_dec, st_sel)
    plans = None
    if c.B <= C.PLAN_MAX_B:             # the same decodes through launch plans
        row, plans = c.decode_plans(name + PLAN)
        rows.append(row)
    P.require(rows)
    nbytes = decodes_bytes(c.B, c.K, **c.io())
    rows += P.speed_rows(name, _time(c.decodes_run(c.state0.clone())), nbytes, variant="")
    if plans is not None:
        def run_plans():
            for p in plans:
                p()

        rows += P.speed_rows(name + PLAN, _time(run_plans, graph=False), nbytes,
                             variant="launch plan")
    return rows


def point_decodes_cuda(c: C.RooflineCase, name: str) -> list[dict]:
    """``K`` launches of the decode's CUDA C++ twin (``gdn_decode(impl="cuda")``, V-major),
    checked against the float64 chain (not bitwise against Triton: another order of sums); rows
    named ``name``."""
    st = c.state0.clone()
    o = torch.stack([GC.gdn_decode(st, *c.row_args[r], state_indices=c.sel, impl="cuda",
                                  **c.lay) for r in range(c.K)], 1)
    rows = c.ref_rows(name, o, st[c.lsel])
    P.require(rows)
    return rows + P.speed_rows(name, _time(c.decodes_run(c.state0.clone(), impl="cuda")),
                               decodes_bytes(c.B, c.K, **c.io()), variant="")


def point_chain(c: C.RooflineCase, name: str, impl: str = "triton") -> list[dict]:
    """The chain with its ``K-1`` snapshots against the float64 chain; the Triton one also
    bitwise against the decodes (the CUDA twin sums in another order: bitwise only within its
    family, which its own tests check); rows named ``name``."""
    kw = {"impl": "cuda"} if impl == "cuda" else {}
    rows, o, st, inter = c.check_chain(name, **(kw or {"validate": True}))
    if impl == "triton":
        o_dec, st_dec, snaps, _ = c.decoded()
        rows += [P.flag(name, "bitwise_vs_decode", bitwise_equal(o, o_dec), "o"),
                 P.flag(name, "bitwise_vs_decode", bitwise_equal(st[c.lsel], st_dec), "state"),
                 P.flag(name, "bitwise_vs_decode",
                        all(bitwise_equal(inter[:, t], snaps[t]) for t in range(c.K - 1)),
                        "snapshots")]
    P.require(rows)
    return rows + P.speed_rows(name, _time(c.chain_run(st, inter, **kw)),
                               chain_bytes(c.B, c.K, **c.io()), variant="")


def _check_carry(c: C.RooflineCase, name: str, form: str, var: str, rows: list[dict]):
    """Run and check one pending-count variant; returns ``(state, carry, bytes, mean pend,
    write-back fraction, plan)`` for the timing."""
    cc = c.variant(var)
    tag = "" if var == "eager" else f" ({VARIANT_NAMES[var]})"
    chk, st, carry, o, eng = c.check_carry(name, cc, form, tag, untouched=True)
    rows += chk
    plan = None
    if c.B <= C.PLAN_MAX_B:             # the same verify through a launch plan
        row, plan = c.carry_plan(name + PLAN, cc, form, (st, carry, o, eng), tag)
        rows.append(row)
    wb = cc["wb"]
    nbytes = carry_bytes(cc["pend"], wb, c.K, c.HK, c.HV, c.D, c.dtype, c.sdt)
    return st, carry, nbytes, float(np.mean(cc["pend"])), float(np.mean(wb)), plan


def point_carry(c: C.RooflineCase, name: str, form: str, lazy: bool) -> list[dict]:
    """The carried-state verify of ``form``, eager, or lazy timed without (``<name>:nowb``) and
    with (``:wb``) a write-back and amortised at the acceptance process's write-back frequency;
    each variant checked first; rows named ``name``."""
    rows: list[dict] = []
    ready = {var: _check_carry(c, name, form, var, rows)
             for var in (("nowb", "wb") if lazy else ("eager",))}
    P.require(rows)
    timed, plans = {}, {}
    for var, (st, carry, nbytes, mean_pend, wb_frac, plan) in ready.items():
        kname = name if var == "eager" else f"{name}:{var}"
        timed[var] = (_time(c.carry_run(st, carry, form, lazy)), nbytes)
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

def point_fla(c, name: str) -> list[dict]:
    """FLA over the case's ``K`` rows (K-major only); rows named ``name``."""
    if peers.fla_fused_recurrent() is None or not P.on_cuda():
        raise RuntimeError(f"{name}: needs a GPU and an importable fla-core")
    if c.layout != "kv":
        raise ValueError(f"state_layout: FLA runs K-major states only, got {c.layout!r}")
    q, k, v, g, beta = (t.contiguous() for t in c.args)
    run, gva = peers.fla_runner(q, k, v, g, beta, c.state0[c.lsel].contiguous(),
                                scale=c.D ** -0.5)
    o_f, h_f = run()
    o_dec, st_dec, _, _ = c.decoded()
    rows = (c.ref_rows(name, o_f, h_f)
            + error_rows(name, o_f, o_dec, tol=c.otol, what="o vs decode")
            + error_rows(name, h_f, st_dec, tol=c.stol, what="state vs decode"))
    P.require(rows)
    del o_f, h_f
    return rows + P.speed_rows(name, P.timings(run, **C.TIMING),
                               fla_bytes(c.B, c.K, c.HK, c.HV, c.D, c.dtype), variant="",
                               fla_gva=gva, fla_version=peers.fla_version())


def point_flashinfer(c, provider: str) -> list[dict]:
    """One FlashInfer provider (``roofline_case.FLASHINFER``) on a V-major case; its time rows
    carry ``flashinfer_version``. A ``ZeroDivisionError`` raised inside FlashInfer's own code
    (``peers.raised_inside_flashinfer``; its K-row kernel at head size 256, in 0.7.2.post1 and
    0.7.4) is one ``unsupported`` row whose ``reason`` names the version and the head size: a
    limit of the peer, nothing measured. Raised in ours, it fails the point."""
    if provider not in C.FLASHINFER:
        raise ValueError(f"provider: not a FlashInfer provider: {provider!r}")
    if peers.flashinfer_gdn() is None or not P.on_cuda():
        raise RuntimeError(f"{provider}: needs a GPU and an importable flashinfer-python")
    if c.layout != "vk":
        raise ValueError(f"state_layout: FlashInfer runs V-major states only, got {c.layout!r}")
    name, K, n = provider, c.K, c.n
    try:
        run, bufs, pool = c.flashinfer(provider)               # pool [S, HV, vd, kd]
    except ZeroDivisionError as exc:
        if not peers.raised_inside_flashinfer(exc):
            raise
        ver = peers.flashinfer_version()
        return [{"kernel": name, "metric": "unsupported", "value": 1.0, "status": "unsupported",
                 "flashinfer_version": ver,
                 "reason": f"FlashInfer {ver} fails inside its own launcher at head size {c.D} "
                           f"(ZeroDivisionError: {exc}): not taken, nothing measured"}]
    o = bufs["o"]
    o_ref, s_ref, i_ref = c.fi_ref()
    o_dec, st_dec, snaps, _ = c.decoded("kv")
    vk = c.to_layout                                            # K-major -> V-major views
    rows = (error_rows(name, o[:n], o_ref, tol=c.otol, what="o")
            + error_rows(name, o, o_dec, tol=c.otol, what="o vs decode"))
    if provider == FLASHINFER_DECODE.name:            # one decode: it advances the pool
        st = pool[c.lsel]
        rows += (error_rows(name, st[:n], vk(s_ref), tol=c.stol, what="state")
                 + error_rows(name, st, vk(st_dec), tol=c.stol, what="state vs decode"))
        nbytes = decode_bytes(c.B, **c.io())
    else:
        rows.append(P.flag(name, "state_untouched", bitwise_equal(pool, c.state0),
                           "pool unchanged (disable_state_update=True)"))
        inter = bufs["intermediate"]
        if inter is not None:                                   # [B, K, HV, vd, kd]
            rows += (error_rows(name, inter[:n, :K - 1], vk(i_ref), tol=c.stol,
                                what="snapshots")
                     + error_rows(name, inter[:n, K - 1], vk(s_ref), tol=c.stol, what="state")
                     + error_rows(name, inter[:, :K - 1], vk(torch.stack(snaps, 1)),
                                  tol=c.stol, what="snapshots vs decode")
                     + error_rows(name, inter[:, K - 1], vk(st_dec), tol=c.stol,
                                  what="state vs decode"))
            nbytes = chain_bytes(c.B, K, **c.io())
        else:
            nbytes = frozen_bytes(c.B, K, c.HK, c.HV, c.D, c.dtype, c.sdt)
    P.require(rows)
    return rows + P.speed_rows(name, P.timings(run, **C.TIMING), nbytes, variant="",
                               flashinfer_version=peers.flashinfer_version())


for _impl, _fn in ((V.DECODES, point_decodes), (V.DECODES_CUDA, point_decodes_cuda),
                   (V.CHAIN, point_chain), (V.CHAIN_CUDA, partial(point_chain, impl="cuda")),
                   (V.CARRY_EAGER, partial(point_carry, form="exact", lazy=False)),
                   (V.CARRY_LAZY, partial(point_carry, form="exact", lazy=True)),
                   (V.FLA, point_fla)):
    V.bind(_impl, partial(_fn, name=_impl.name))
for _p in C.FLASHINFER:
    V.bind(registry.get(_p), partial(point_flashinfer, provider=_p))
# FlashInfer's ReplaySSM runs on the point itself (``replayssm_peer.replayssm_rows``), no RooflineCase.
