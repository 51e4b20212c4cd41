"""The carry_protocol notebook: acceptance model, protocol runs, verify sweep, byte budgets.

Four parts (SPEC §3b, §3c, §4; issue 4):

1. **Acceptance model and protocol simulation** (host arithmetic, no kernels). A verify of ``K``
   rows checks the last accepted token plus ``K-1`` drafts; ``a = 1 +`` the number of leading
   drafts accepted, each with probability ``alpha`` (so ``E[a] = 1 + alpha + ... + alpha^(K-1)``;
   Qwen3-Next's MTP mean acceptance length ~3.3 at ``K = 4`` gives ``alpha ~ 0.875``), and with
   probability ``p_zero`` a sequence accepts nothing (``a = 0``). ``simulate`` runs the pending
   count of one slot through many steps of the protocol (eager: write back whenever ``p > 0``;
   lazy: when ``p + K > CAP``): write-back frequency, rows folded per verify, and the stationary
   distribution of ``p`` that the timing draws its pending counts from.
2. **Protocol run** (``protocol_point``): a stack of layers (conv twin + GDN) driven by
   ``SpecDecodeStep`` on the real kernels, batch widths crossing ``lazy_min_seqs``, accepted
   counts from the model. Checked: every ``engaged`` flag equals the host simulation of the same
   accepted counts; accepted rows' outputs and the folded states equal plain decoding
   (``conv_update`` + ``gdn_decode`` per token) bitwise for the exact form, within ``1e-4`` for WY.
3. **Verify sweep** (``verify_point``): for one ``(K, B, HK, HV, head_dim, dtype, alpha)``, the
   slots hold pending counts drawn from part 1's stationary distribution (per mode), the stash
   holds realistic rows. Checks first (exact: bitwise against folding the pending rows then ``K``
   ``gdn_decode`` launches; both forms against the float64 protocol reference on the first
   ``ref_seqs`` sequences; WY against exact), then times ``carry_{exact,wy}_{eager,lazy}``, the
   snapshot chain (``gdn_chain`` with ``intermediate``) and, on a GPU where fla-core imports, FLA's
   ``fused_recurrent_gated_delta_rule`` over the same K rows. GB/s over SPEC §4's bytes:
   carry ``Hb`` read, ``Hb`` written per write-back (counted at the launch's actual write-backs),
   ``p`` stash rows read, ``K`` stash rows written, inputs and outputs; chain ``(K+1)*Hb``; FLA
   ``2*Hb`` (state in and out), each plus inputs and outputs.
4. **Byte budgets** per slot and layer for real model configurations: stash (GDN fp32 rows and
   the conv's input rows) against the snapshots of the chain (states and conv windows).

Part 1 lives in ``pmll_lab.experiments.acceptance`` (shared with the roofline notebook), part 2
in ``carry_protocol``, the byte budgets, tables, headline and conclusion in ``carry_report``, the
plots in ``carry_plots``; all are reachable as attributes of this module (``carry.protocol_point``),
the last three imported on first use.
"""

from __future__ import annotations

import numpy as np
import torch

from pmll_lab.backend import DEVICE
from pmll_lab.bench import bitwise_equal, error_rows
from pmll_lab.carry import GDN_CARRY_CAP, GdnCarry, gdn_carry_flush, gdn_carry_verify
from pmll_lab.inputs import gdn_inputs
from pmll_lab.reference import carry as ref
from pmll_lab.experiments.acceptance import (  # noqa: F401  (part 1, for the notebook)
    MODES, accept_counts, alpha_for_mean, mean_accept_len, protocol_step, simulate,
    simulation_table, steady_pending,
)
from pmll_lab.experiments.common import (  # noqa: F401  (COMPILE_KEYS: for the notebook)
    COMPILE_KEYS, clone_carry, fill_stash, gating_inputs, parts_getattr,
)
from pmll_lab.experiments.gdn import (  # noqa: F401  (points, with_layout: for the notebook)
    LAYOUTS, fla_run_once, peer_rows, peer_snapshot_check, points, timed_rows, with_layout,
)
from pmll_lab.peers import (  # noqa: F401  (flashinfer_status: for the notebook)
    fla_available, flashinfer_available, flashinfer_status, flashinfer_supports,
    flashinfer_version,
)
from pmll_lab.sweep import CheckFailed

CAP = GDN_CARRY_CAP
O_TOL = {"float32": 1e-5, "float16": 1e-3, "bfloat16": 8e-3}
"""rel_l2 tolerance of outputs against the float64 reference, per input dtype (tests/test_carry.py)."""
STATE_TOL = 1e-5
"""rel_l2 tolerance of fp32 states and stash rows against the float64 reference."""
WY_TOL = 1e-4
"""rel_l2 tolerance of the WY form against the exact form / plain decoding (fp32 rounding)."""

FORMS = ("exact", "wy")
CARRY_KERNELS = tuple(f"carry_{f}_{m}" for f in FORMS for m in MODES)
KERNELS = CARRY_KERNELS + ("chain_snapshots", "fla_fused_recurrent", "flashinfer_mtp_snapshots")
LABELS = {
    "carry_exact_eager": "carry exact, eager", "carry_exact_lazy": "carry exact, lazy",
    "carry_wy_eager": "carry WY (reference form), eager",
    "carry_wy_lazy": "carry WY (reference form), lazy",
    "chain_snapshots": "chain + K-1 snapshots", "fla_fused_recurrent": "FLA fused_recurrent (no rollback)",
    "flashinfer_mtp_snapshots": "FlashInfer mtp + K snapshots",
}
STYLE = {"carry_exact_eager": ("C0", "--"), "carry_exact_lazy": ("C0", "-"),
         "carry_wy_eager": ("C1", "--"), "carry_wy_lazy": ("C1", "-"),
         "chain_snapshots": ("C2", "-"), "fla_fused_recurrent": ("C3", ":"),
         "flashinfer_mtp_snapshots": ("C6", "-.")}


# ---- shared helpers -----------------------------------------------------------------------

def _itemsize(dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def stash_row_bytes(HV: int, kd: int, vd: int) -> int:
    """Bytes of one stash row (all value heads): ``u [HV, vd]``, ``g [HV]``, ``k [HV, kd]`` fp32."""
    return 4 * (HV * vd + HV + HV * kd)


def row_io_bytes(HK, HV, kd, vd, dtype) -> int:
    """One row's inputs (q, k, v in ``dtype``; g, beta fp32) and output (``dtype``)."""
    es = _itemsize(dtype)
    return (2 * HK * kd + HV * vd) * es + 2 * HV * 4 + HV * vd * es


def carry_verify_bytes(pend, write_back, K, HK, HV, kd, vd, dtype) -> int:
    """SPEC §4 bytes of one carry verify: per sequence ``Hb`` read, ``Hb`` written if it writes
    back, ``p`` stash rows read, ``K`` written, ``K`` rows of inputs/outputs, and three int32
    (slot, pend, engaged)."""
    hb = 4 * HV * kd * vd
    pend = np.asarray(pend)
    wb = np.asarray(write_back)
    B = len(pend)
    return int(B * hb + wb.sum() * hb + (pend.sum() + B * K) * stash_row_bytes(HV, kd, vd)
               + B * K * row_io_bytes(HK, HV, kd, vd, dtype) + 12 * B)


def chain_bytes(B, K, HK, HV, kd, vd, dtype) -> int:
    """Snapshot chain: ``(K+1)*Hb`` per sequence plus inputs/outputs and the slot index."""
    return B * ((K + 1) * 4 * HV * kd * vd + K * row_io_bytes(HK, HV, kd, vd, dtype) + 4)


def fla_bytes(B, K, HK, HV, kd, vd, dtype) -> int:
    """FLA fused recurrent over K rows: state in and out (``2*Hb``) plus inputs/outputs."""
    return B * (2 * 4 * HV * kd * vd + K * row_io_bytes(HK, HV, kd, vd, dtype))


# ---- 3. the verify sweep ----------------------------------------------------------------------


def _decode_reference(state, carry, x, K, slots, layout="kv"):
    """Plain decoding of this verify's rows: fold each slot's pending rows (flush), then ``K``
    ``gdn_decode`` launches, in ``layout``. Returns ``(o [B, K, HV, vd], folded state)``."""
    from pmll_lab.gdn import gdn_decode

    st = state.clone()
    gdn_carry_flush([st], [carry], slots, state_layout=layout)
    folded = st.clone()
    outs = [gdn_decode(st, x["q"][:, t], x["k"][:, t], x["v"][:, t], x["g"][:, t],
                       x["beta"][:, t], state_indices=slots, state_layout=layout)
            for t in range(K)]
    return torch.stack(outs, 1), folded


def verify_point(point: dict) -> list[dict]:
    """Check, then time, every verify kernel at one point (see the module docstring).

    Point keys: ``K, B, HK, HV, head_dim, dtype``; optional ``state_layout`` (``"kv"``: state
    ``[S, HV, kd, vd]``; ``"vk"``: ``[S, HV, vd, kd]``), ``alpha`` (default 0.875), ``p_zero``
    (0), ``seed`` (0), ``ref_seqs`` (sequences checked against the float64 reference, default 4),
    ``baselines`` (default True: also check and time the snapshot chain and, on a GPU, the
    peers: FLA at ``"kv"``, FlashInfer's snapshot verify at ``"vk"``). Raises ``CheckFailed``
    (nothing timed) when one of our kernels fails a check."""
    K, B, HK, HV, D = (int(point[n]) for n in ("K", "B", "HK", "HV", "head_dim"))
    dname = point.get("dtype", "bfloat16")
    dtype = getattr(torch, dname)
    layout = point.get("state_layout", "kv")
    if layout not in LAYOUTS:
        raise ValueError(f"state_layout: must be one of {LAYOUTS}, got {layout!r}")
    lay = {"state_layout": layout}
    alpha = float(point.get("alpha", 0.875))
    p_zero = float(point.get("p_zero", 0.0))
    seed = int(point.get("seed", 0))
    baselines = bool(point.get("baselines", True))
    n_ref = min(B, int(point.get("ref_seqs", 4)))
    x = gdn_inputs(seed, B, HK, HV, D, D, rows=K, dtype=dtype)
    gate = gating_inputs(seed + 11, (B, K), HV)
    x["g"], x["beta"] = gate["g"], gate["beta"]
    state_kv, slots = x["state"], x["state_indices"]
    state0 = state_kv if layout == "kv" else state_kv.transpose(-1, -2).contiguous()

    def in_layout(t):                   # a K-major state tensor [..., kd, vd] seen in `layout`
        return t if layout == "kv" else t.transpose(-1, -2)

    args = (x["q"], x["k"], x["v"], x["g"], x["beta"])
    rng = np.random.default_rng(seed + 1)
    base = GdnCarry.empty(B, HV, D, D)
    fill_stash(base, seed + 2)
    rows: list[dict] = []
    runs = {}
    otol = O_TOL[dname]
    sel = slots[:n_ref].long()

    for mode in MODES:
        lazy = mode == "lazy"
        pend = steady_pending(rng, B, K, alpha, lazy, p_zero)
        carry_m = clone_carry(base)
        carry_m.pend[slots.long()] = torch.as_tensor(pend, dtype=torch.int32, device=DEVICE)
        wb = (pend + K > CAP) if lazy else (pend > 0)
        o_dec, folded = _decode_reference(state0, carry_m, x, K, slots, layout)
        # float64 protocol reference on the first n_ref sequences (a sub-problem of their slots;
        # K-major, mutated in place by the reference)
        sub_state = state_kv[sel].double().cpu()
        sub_carry = ref.RefCarry(u=carry_m.u[sel].double().cpu(), g=carry_m.g[sel].double().cpu(),
                                 k=carry_m.k[sel].double().cpu(),
                                 pend=carry_m.pend[sel].long().cpu())
        o_ref, eng_ref = ref.verify(sub_state, sub_carry, *(t[:n_ref].cpu() for t in args),
                                    torch.arange(n_ref), lazy=lazy)
        for form in FORMS:
            name = f"carry_{form}_{mode}"
            st, c = state0.clone(), clone_carry(carry_m)
            o, eng = gdn_carry_verify(st, c, *args, slot_tab=slots, form=form, lazy=lazy,
                                      validate=True, eager_max_pending=None, **lay)
            eng_ok = eng.cpu().tolist() == np.where(wb, 2, 1).tolist()
            rows.append({"kernel": name, "metric": "engaged_as_protocol", "value": float(eng_ok),
                         "passed": eng_ok, "what": "engaged"})
            rows += error_rows(name, o[:n_ref], o_ref, tol=otol, what="o")
            rows += error_rows(name, st[sel], in_layout(sub_state), tol=STATE_TOL, what="state")
            rows += error_rows(name, c.u[sel], sub_carry.u, tol=STATE_TOL if form == "exact" else WY_TOL,
                               what="stash u")
            wbm = torch.as_tensor(wb, device=DEVICE)
            if form == "exact":
                ok_o = bitwise_equal(o, o_dec)
                ok_s = bitwise_equal(st[slots.long()][wbm], folded[slots.long()][wbm])
                for what, ok in (("o", ok_o), ("written-back state", ok_s)):
                    rows.append({"kernel": name, "metric": "bitwise_vs_decode", "value": float(ok),
                                 "passed": ok, "what": what})
            else:
                rows += error_rows(name, o, runs[f"carry_exact_{mode}"][2], tol=max(otol, WY_TOL),
                                   what="o vs exact")
            rows.append({"kernel": name, "metric": "write_back_frac", "value": float(wb.mean())})
            rows.append({"kernel": name, "metric": "mean_pending", "value": float(pend.mean())})
            runs[name] = (st, c, o, lazy, carry_verify_bytes(pend, wb, K, HK, HV, D, D, dtype))
        del o_dec, folded
    bad = [r for r in rows if r.get("passed") is False]
    if bad:
        what = ", ".join(sorted({f"{r['kernel']}:{r['what']}:{r['metric']}" for r in bad}))
        raise CheckFailed(f"failed checks: {what}", rows)

    timed_fns = []
    for name in CARRY_KERNELS:
        st, c, _, lazy, nbytes = runs[name]
        form = name.split("_")[1]

        def run(st=st, c=c, lazy=lazy, form=form):
            gdn_carry_verify(st, c, *args, slot_tab=slots, form=form, lazy=lazy, **lay)

        timed_fns.append((name, run, nbytes, {}))

    if baselines:
        # the snapshot chain (checked against plain decoding of the same rows from the same
        # state, float64)
        from pmll_lab.gdn import gdn_chain

        st_c = state0.clone()
        inter = torch.empty(B, K - 1, HV, D, D, device=DEVICE)
        o_c = gdn_chain(st_c, *args, state_indices=slots, intermediate=inter, **lay)
        o_plain = o_ref_plain(state_kv, x, sel, n_ref)
        crows = error_rows("chain_snapshots", o_c[:n_ref], o_plain, tol=otol, what="o")
        rows += crows
        _require(rows)
        timed_fns.append(("chain_snapshots",
                          lambda: gdn_chain(st_c, *args, state_indices=slots, intermediate=inter,
                                            **lay),
                          chain_bytes(B, K, HK, HV, D, D, dtype), {}))

        if layout == "kv" and fla_available():
            fla, failed = peer_rows("fla_fused_recurrent", fla_run_once, args,
                                    state0[slots.long()].contiguous(), D)
            if failed:
                rows += failed
            else:
                run_fla, (o_f, _) = fla
                frows = error_rows("fla_fused_recurrent", o_f[:n_ref], o_plain, tol=otol,
                                   what="o")
                rows += frows
                if all(r["passed"] for r in frows):
                    timed_fns.append(("fla_fused_recurrent", run_fla,
                                      fla_bytes(B, K, HK, HV, D, D, dtype), {}))
        if (layout == "vk" and K >= 2 and flashinfer_available()
                and flashinfer_supports(D, dname)):
            firows, run_fi = peer_snapshot_check(x, gate, state0, o_c, st_c[slots.long()],
                                                 inter, otol)
            rows += firows
            if run_fi is not None:
                timed_fns.append(("flashinfer_mtp_snapshots", run_fi,
                                  chain_bytes(B, K, HK, HV, D, D, dtype),
                                  {"flashinfer_version": flashinfer_version()}))

    # timing, after every check passed (the verify does not change pend: each call is the same)
    rows += timed_rows(timed_fns)
    return rows


def _require(rows: list[dict]) -> None:
    bad = [r for r in rows if r.get("passed") is False]
    if bad:
        what = ", ".join(sorted({f"{r['kernel']}:{r['what']}:{r['metric']}" for r in bad}))
        raise CheckFailed(f"failed checks: {what}", rows)


def o_ref_plain(state0, x, sel, n):
    """Float64 plain decoding of the K rows of the first ``n`` sequences from their stored state
    (no pending rows): the reference of kernels that start from the state (chain, FLA)."""
    return ref.decode_tokens(state0[sel].double().cpu(),
                             *(x[k][:n].cpu() for k in ("q", "k", "v", "g", "beta")), torch.arange(n))


# ---- the protocol run, byte budgets, tables and plots (carry_protocol, carry_report, carry_plots)

_PARTS = ("carry_protocol", "carry_report", "carry_plots")


# ``protocol_point`` lives in ``carry_protocol``, the byte budgets, tables, headline and
# conclusion in ``carry_report``, the plots in ``carry_plots`` (each imports this module);
# they are reachable here too (``carry.headline``), imported on first use.
__getattr__ = parts_getattr(__name__, _PARTS)
