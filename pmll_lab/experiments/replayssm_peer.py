"""FlashInfer's ReplaySSM verify (``gated_delta_rule_mtp_ucache_flush``) as a peer point:
``flashinfer_replayssm:verify`` (ring fill below the fold threshold) and ``:flush`` (fill
``16 - K + 1``: the window folded first), on bf16 inputs and a V-major pool. Checked (outputs,
state after committing ``K`` rows, within ``TOLERANCE`` of float64) before timed. Shapes it
does not take: ``unsupported`` rows; no GPU or no FlashInfer: ``unavailable`` rows.
"""

from __future__ import annotations

import torch

from pmll_lab.backend import DEVICE, INTERPRET
from pmll_lab.bench import error_rows
from pmll_lab.experiments import protocol as P
from pmll_lab.peers import flashinfer_version, fused_gating
from pmll_lab.peers_replayssm import (REPLAYSSM_RING_SLOTS, REPLAYSSM_WINDOW, ReplaySSMRing,
                                      replayssm_available, replayssm_commit, replayssm_runner,
                                      replayssm_state, replayssm_supports)
from pmll_lab.reference import carry as ref_carry
from pmll_lab.harness.step import StepCase
from pmll_lab.harness.step_forms import REPLAYSSM
from pmll_lab.sizes import ring_step_bytes
from pmll_lab.tolerances import STEP_TOL

PROVIDER = REPLAYSSM.name
"""The registered name (``harness.step_forms``) its rows carry."""
VARIANTS = ("verify", "flush")
KERNELS = tuple(f"{PROVIDER}:{v}" for v in VARIANTS)
LABELS = {PROVIDER: "FlashInfer ReplaySSM (ucache_flush)",
          KERNELS[0]: "FlashInfer ReplaySSM verify (ring fill P, no fold)",
          KERNELS[1]: "FlashInfer ReplaySSM verify + fold (flush)"}
TOLERANCE = STEP_TOL["bfloat16"]
"""rel L2 of outputs and effective states against float64 decoding (bf16 pool and ring)."""
DEFAULT_FILL = 8
"""Ring fill ``P`` of the verify variant (FlashInfer's window holds 16)."""


def flush_min(rows: int) -> int:
    """FlashInfer's default fold threshold for ``rows`` draft rows: ``16 - K + 1``."""
    return REPLAYSSM_WINDOW - int(rows) + 1


def fill_replayssm_ring(ring: ReplaySSMRing, slots: torch.Tensor, fill: int, seed: int) -> None:
    """``fill`` realistic rows in every request's window at a seeded random ``cache_base``
    (request ``b`` on pool slot ``slots[b]``): unit keys, corrections N(0, 0.3^2), cumulative
    log decays of ``-softplus(N(0, 1))`` steps from the stored state; drawn on the CPU."""
    gen = torch.Generator().manual_seed(int(seed))
    ns = REPLAYSSM_RING_SLOTS
    base = torch.randint(0, ns, (ring.hist_len.shape[0],), generator=gen, dtype=torch.int32)
    k = torch.nn.functional.normalize(torch.randn(ring.k.shape, generator=gen), dim=-1)
    u = torch.randn(ring.u.shape, generator=gen) * 0.3
    steps = -torch.nn.functional.softplus(torch.randn(ring.g.shape, generator=gen))
    G = torch.zeros(ring.g.shape)
    for b, s in enumerate(slots.tolist()):
        order = [(int(base[b]) + i) % ns for i in range(ns)]
        G[s][:, order] = torch.cumsum(steps[s], -1)
    for dst, src in ((ring.k, k), (ring.u, u), (ring.g, G), (ring.cache_base, base)):
        dst.copy_(src.to(dst))
    ring.hist_len.fill_(int(fill))


def available() -> bool:
    """On a GPU (not the interpreter) where FlashInfer's ReplaySSM kernels import."""
    return DEVICE.type == "cuda" and not INTERPRET and replayssm_available()


def _base(variant: str, fill: int) -> dict:
    """The columns every row of a variant carries (``kernel`` is given apart)."""
    return dict(provider=PROVIDER, variant=variant, ring_fill=fill, state_layout="vk",
                state_dtype="bfloat16")


def _fills(K: int, p: dict) -> dict:
    return {"verify": min(int(p.get("ring_fill", DEFAULT_FILL)), flush_min(K) - 1),
            "flush": flush_min(K)}


def replayssm_rows(p: dict, *, variants=VARIANTS, timing: dict | None = None) -> list[dict]:
    """Check, then time, each variant at point ``p`` (keys ``K, B, HK, HV, head_dim, dtype``,
    optional ``state_dtype`` ("float32": unsupported, the kernels take a bf16 pool only),
    ``ring_fill`` (8), ``seed`` (0), ``ref_seqs`` (2)): rows named
    ``flashinfer_replayssm:<variant>`` (module docstring). ``timing``: ``protocol.timings``
    keywords. Raises ``CheckFailed`` (nothing timed) when a check fails."""
    K, B, HK, HV, D = (int(p[n]) for n in ("K", "B", "HK", "HV", "head_dim"))
    fills = _fills(K, p)
    sdt = str(p.get("state_dtype", "float32"))
    if not replayssm_supports(D, K, str(p.get("dtype", "bfloat16")), sdt):
        return [dict(_base(v, fills[v]), kernel=f"{PROVIDER}:{v}", metric="unsupported", value=1.0,
                     status="unsupported", reason="FlashInfer's ReplaySSM kernels take kd = "
                     "vd = 128, K in {4, 8}, bf16 inputs and pool") for v in variants]
    if not available():
        return [dict(_base(v, fills[v]), kernel=f"{PROVIDER}:{v}", metric="unavailable", value=1.0,
                     status="unavailable", reason="needs a GPU and flashinfer-python with "
                     "the ReplaySSM kernels") for v in variants]
    case = StepCase(batch=B, rows=K, num_k_heads=HK, num_v_heads=HV, head_dim=D, steps=1,
                    state_dtype=torch.bfloat16, seed=int(p.get("seed", 0)))
    n = min(int(p.get("ref_seqs", 2)), B)
    rows, entries = [], []
    for v in variants:
        run, state, ring, chk = _checked(case, fills[v], n, f"{PROVIDER}:{v}")
        rows += [dict(r, **_base(v, fills[v])) for r in chk]
        nbytes = B * ring_step_bytes(K, HK, HV, D, case.dtype, case.state_dtype,
                                     fold_frac=1.0 if v == "flush" else 0.0,
                                     mean_fill=fills[v], ring_dtype=torch.bfloat16)
        entries.append((f"{PROVIDER}:{v}", run, nbytes,
                        dict(_base(v, fills[v]), flashinfer_version=flashinfer_version())))
    P.require(rows)
    return rows + P.timed_rows(entries, **(timing or {}))


def _checked(case: StepCase, fill: int, n: int, name: str):
    """One verify at ``fill`` on fresh buffers, checked; returns ``(run, state, ring, rows)``
    with ``run`` bound to buffers reset to the pre-check state."""
    t, K, B = case.tensors, case.rows, case.batch
    r = case.rows_of(0)
    slots = t["slots"]

    def fresh():
        ring = ReplaySSMRing.empty(B, B, case.num_k_heads, case.num_v_heads, case.head_dim,
                                   case.head_dim, DEVICE)
        fill_replayssm_ring(ring, slots.cpu(), fill, case.seed + 3)
        return t["state"].clone(), ring

    state, ring = fresh()
    H = [replayssm_state(state, ring, b, int(slots[b])) for b in range(n)]   # float64 K-major
    run, o = replayssm_runner(r["q"], r["k"], r["v"], r["A_log"], r["a"], r["dt_bias"], r["b"],
                              state, slots, ring, scale=case.scale, flush_min=flush_min(K))
    run()
    g, beta = fused_gating(r["A_log"].cpu(), r["a"][:n].cpu(), r["dt_bias"].cpu(),
                           r["b"][:n].cpu())
    ref = torch.stack(H)
    o_ref = ref_carry.decode_tokens(ref, r["q"][:n].cpu(), r["k"][:n].cpu(), r["v"][:n].cpu(),
                                    g, beta, torch.arange(n), scale=case.scale)
    replayssm_commit(ring, torch.full((B,), K, dtype=torch.int32, device=DEVICE), flush_min(K))
    got = torch.stack([replayssm_state(state, ring, b, int(slots[b])) for b in range(n)])
    rows = (error_rows(name, o[:n].float().cpu(), o_ref, tol=TOLERANCE, what="o")
            + error_rows(name, got, ref, tol=TOLERANCE, what="state after commit"))
    state, ring = fresh()
    run, _ = replayssm_runner(r["q"], r["k"], r["v"], r["A_log"], r["a"], r["dt_bias"], r["b"],
                              state, slots, ring, scale=case.scale, flush_min=flush_min(K))
    return run, state, ring, rows
