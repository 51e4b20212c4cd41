"""The roofline's peer providers on a ``roofline_case._Case``, checked, then timed (GPU only,
``RuntimeError`` otherwise): FLA's ``fused_recurrent`` from a gathered copy of the K-major
states (``point_fla``); FlashInfer's decode (``K = 1``, the V-major pool updated) and ``mtp``
verify with its snapshot buffer or without, the pool frozen (``point_flashinfer``), fed the raw
gating inputs. Checks: against float64 on ``N_REF`` sequences (FlashInfer's with its own gating,
``_Case.fi_ref``) and against our decodes over all ``B`` within the tolerances (peers are not
bitwise ours); a frozen verify must leave the pool as it was. At a bf16-state point the pool,
buffer and references are bf16.
"""

from __future__ import annotations

import torch

from pmll_lab import peers
from pmll_lab.bench import bitwise_equal, error_rows
from pmll_lab.experiments import protocol as P
from pmll_lab.experiments import roofline_case as C
from pmll_lab.experiments.gdn import fla_bytes, frozen_bytes
from pmll_lab.gdn import chain_bytes, decode_bytes


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
