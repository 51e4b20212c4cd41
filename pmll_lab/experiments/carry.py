"""The carry_protocol notebook's points (SPEC §3b, §4).

``verify_point``: pending counts from the protocol's stationary distribution; the exact form
checked bitwise against folding then ``K`` ``gdn_decode`` launches and against the float64
protocol on ``ref_seqs`` sequences, then ``carry_exact_{eager,lazy}`` timed and, with
``baselines``, the snapshot chain and the peers (each checked first). ``protocol_point``: see
its docstring.
"""

from __future__ import annotations

import random
from functools import partial

import numpy as np
import torch

from pmll_lab.backend import DEVICE
from pmll_lab.bench import bitwise_equal, error_rows, errors
from pmll_lab.carry import GDN_CARRY_CAP, CarryLayer, GdnCarry, SpecDecodeStep
from pmll_lab.experiments import gdn as G
from pmll_lab.experiments import protocol as P
from pmll_lab.experiments.acceptance import MODES, accept_counts, protocol_step, steady_pending
from pmll_lab.experiments import replayssm_peer as RS
from pmll_lab.experiments.gdn import fill_stash
from pmll_lab.inputs import conv_inputs, gdn_inputs
from pmll_lab.reference import carry as ref
from pmll_lab.sizes import carry_bytes, chain_bytes
from pmll_lab.sweep import CheckFailed
from pmll_lab.harness import verify as V

CAP = GDN_CARRY_CAP
COMPILE_KEYS = G.COMPILE_KEYS
AXES = (*G.AXES, "baselines")
"""The carry_protocol sweep's axes: gdn_verify's and ``baselines``."""
points = partial(G.points, axes=AXES)    # the notebook's sweep: gdn_verify's points
FORMS = ("exact",)
CARRY_KERNELS = (V.CARRY_EAGER.name, V.CARRY_LAZY.name)
"""One per form of ``FORMS`` and mode of ``MODES`` (``carry_{form}_{mode}``)."""
KERNELS = CARRY_KERNELS + (V.CHAIN.name, V.FLA.name, V.MTP_SNAPSHOTS.name,
                           *RS.KERNELS)
LABELS = {
    V.CARRY_EAGER.name: "carry exact, eager", V.CARRY_LAZY.name: "carry exact, lazy",
    V.CHAIN.name: "chain + K-1 snapshots", V.FLA.name: "FLA fused_recurrent",
    V.MTP_SNAPSHOTS.name: "FlashInfer mtp + K snapshots",
    **RS.LABELS,
}


def verify_point(point: dict) -> list[dict]:
    """Check, then time, every verify kernel at one point (module docstring). Optional keys:
    ``state_layout`` ("kv"), ``alpha`` (0.875), ``p_zero`` (0), ``seed`` (0), ``ref_seqs`` (4),
    ``baselines`` (True). Raises ``CheckFailed`` (nothing timed) when one of ours fails."""
    c = G.verify_case(point, min(int(point["B"]), int(point.get("ref_seqs", 4))))
    K, B, HK, HV, D, n = c.K, c.B, c.HK, c.HV, c.D, c.n
    alpha, p_zero = float(point.get("alpha", 0.875)), float(point.get("p_zero", 0.0))
    seed = int(point.get("seed", 0))
    rng = np.random.default_rng(seed + 1)
    c.stash = GdnCarry.empty(B, HV, D, D, state_layout=c.layout)
    fill_stash(c.stash, seed + 2)
    rows: list[dict] = []
    runs = {}
    for mode in MODES:
        lazy = mode == "lazy"
        pend = steady_pending(rng, B, K, alpha, lazy, p_zero)
        cc = c.carry_case(mode, pend, lazy)
        for form in FORMS:
            name = f"carry_{form}_{mode}"
            chk, st, carry, _, _ = c.check_carry(name, cc, form)
            rows += chk + [{"kernel": name, "metric": m, "value": float(v.mean())}
                           for m, v in (("write_back_frac", cc["wb"]), ("mean_pending", pend))]
            runs[name] = (st, carry, lazy, carry_bytes(pend, cc["wb"], K, HK, HV, D, c.dtype))
    P.require(rows)

    entries = [(name, c.carry_run(st, carry, name.split("_")[1], lazy), nbytes, {})
               for name, (st, carry, lazy, nbytes) in runs.items()]
    if point.get("baselines", True):
        o_c, st_c, inter = c.chain()
        o_plain = ref.decode_tokens(c.state_kv[c.lsel[:n]].double().cpu(), *c.cpu_args,
                                    torch.arange(n))       # float64 plain decoding, no pending
        rows += error_rows(V.CHAIN.name, o_c[:n], o_plain, tol=c.otol, what="o")
        P.require(rows)
        entries.append((V.CHAIN.name, c.chain_run(st_c, inter),
                        chain_bytes(B, K, HK, HV, D, D, c.dtype), {}))
        peer_rows, peer_entries = G.peers_checked(c, o_c, st_c, inter, lambda o, h: error_rows(
            V.FLA.name, o[:n], o_plain, tol=c.otol, what="o"))
        rows += peer_rows
        entries += peer_entries
        if c.layout == "vk":
            rows += replayssm_point(dict(point, dtype=c.dname))
    return rows + P.timed_rows(entries)


def replayssm_point(point: dict) -> list[dict]:
    """FlashInfer's ReplaySSM verify and flush at ``point``'s shape on its bf16 pool
    (``replayssm_peer.replayssm_rows``); a failed check gives its rows (marked failed),
    nothing timed, and the rest of the point stands."""
    try:
        return RS.replayssm_rows(dict(point, state_dtype="bfloat16"))
    except P.CheckFailed as exc:
        return list(exc.rows)


# ---- protocol runs ----------------------------------------------------------------------------

PROTOCOL_KEYS = {
    "form": FORMS, "L": 1, "S": 1, "HK": 1, "HV": 1, "head_dim": 1, "K": 1, "steps": 1,
    "widths": list, "dtype": P.optional(P.KERNEL_DTYPES), "p_zero": P.optional(float),
    "lazy_min_seqs": P.optional(0), "eager_max_pending": P.optional(0),
    "state_layout": P.optional(P.LAYOUTS)}
"""A protocol run's keys and their rules (``protocol.check_points``); the notebook adds the
policy's ``alpha``, ``seed``, ``lazy_min_seqs`` and ``eager_max_pending`` where a run leaves
them out."""


def protocol_point(point: dict) -> list[dict]:
    """A stack of ``L`` layers (conv twin + GDN) through ``steps`` steps of ``SpecDecodeStep``.
    Keys: ``form`` ("exact"), ``L, S, HK, HV, head_dim, dtype, steps, widths`` (batch widths
    cycled), ``K, alpha, p_zero, lazy_min_seqs, eager_max_pending, seed``, optional
    ``state_layout`` ("kv"). Rows: checks (``bitwise_vs_plain``, ``rel_l2_vs_plain``,
    ``engaged_as_simulated``; ``CheckFailed`` when one fails) and the driver's counts."""
    from pmll_lab.conv import ConvCarry, conv_update
    from pmll_lab.gdn import gdn_decode

    form = point["form"]
    L, S, HK, HV, D, K = (int(point[n]) for n in ("L", "S", "HK", "HV", "head_dim", "K"))
    dtype = getattr(torch, point.get("dtype", "bfloat16"))
    steps, seed = int(point["steps"]), int(point.get("seed", 0))
    alpha, p_zero = float(point.get("alpha", 0.875)), float(point.get("p_zero", 0.0))
    widths = [int(w) for w in point["widths"]]
    layout = point.get("state_layout", "kv")
    P.check_layout(layout)
    dim, qk = 2 * HK * D + HV * D, 2 * HK * D
    rng = np.random.default_rng(seed)
    pyrng = random.Random(seed)
    layers, plain = [], []
    for layer in range(L):
        st = gdn_inputs(seed + 100 + layer, 1, HK, HV, D, D, slots=S, dtype=dtype,
                        state_layout="kv")["state"]
        if layout == "vk":
            st = st.transpose(-1, -2).contiguous()
        ci = conv_inputs(seed + 200 + layer, 1, dim, slots=S, dtype=dtype)
        layers.append(CarryLayer(st.clone(), GdnCarry.empty(S, HV, D, D, state_layout=layout),
                                 conv_state=ci["conv_state"].clone(),
                                 conv_carry=ConvCarry.empty(S, dim, dtype=dtype),
                                 conv_weight=ci["weight"], conv_bias=ci["bias"], num_k_heads=HK,
                                 state_layout=layout))
        plain.append((st.clone(), ci["conv_state"].clone()))
    step = SpecDecodeStep(layers, form=form, lazy_min_seqs=point.get("lazy_min_seqs", 8),
                          eager_max_pending=point.get("eager_max_pending", 4), validate=True)
    host_p = np.zeros(S, dtype=np.int64)           # the host simulation of pend
    worst = 0.0
    bit_ok, eng_ok = True, True
    n_wb = n_verify = 0
    for n in range(steps):
        B = widths[n % len(widths)]
        slots = pyrng.sample(range(S), B)
        g_in = gdn_inputs(seed + 1000 + n, B, HK, HV, D, D, rows=K, dtype=dtype, state_layout="kv")
        xs = [conv_inputs(seed + 5000 + 7 * n + layer, B, dim, rows=K, dtype=dtype)["x"]
              for layer in range(L)]
        plan = step.begin(slots, K)
        outs = [step.verify_layer(i, x=xs[i], g=g_in["g"], beta=g_in["beta"]) for i in range(L)]
        acc = accept_counts(rng, B, K, alpha, p_zero)
        # host simulation of the same step (a flush by the policy clears those slots first)
        if plan["flushed"]:
            over = host_p[slots] > step.eager_max_pending
            host_p[np.asarray(slots)[over]] = 0
        wb, newp = protocol_step(host_p[slots], acc, K, plan["lazy"])
        eng = step.engaged[0].cpu().numpy()
        eng_ok &= bool((eng == np.where(wb, 2, 1)).all())
        n_wb += int((eng == 2).sum())
        n_verify += B
        host_p[slots] = newp
        step.accept(acc.tolist())
        slot_t = torch.tensor(slots, dtype=torch.int32, device=DEVICE)
        for t in range(K):
            sel = [b for b in range(B) if acc[b] > t]
            if not sel:
                break
            sel_t = torch.tensor(sel, device=DEVICE)
            for layer, (pst, pcs) in enumerate(plain):
                y = conv_update(pcs, xs[layer][sel_t, t], layers[layer].conv_weight,
                                layers[layer].conv_bias, state_indices=slot_t[sel_t],
                                qk_channels=qk, head_dim=D)
                q = y[:, :HK * D].unflatten(-1, (HK, D))
                k = y[:, HK * D:qk].unflatten(-1, (HK, D))
                v = y[:, qk:].unflatten(-1, (HV, D))
                o = gdn_decode(pst, q, k, v, g_in["g"][sel_t, t], g_in["beta"][sel_t, t],
                               state_indices=slot_t[sel_t], use_qk_l2norm=False,
                               state_layout=layout)
                got = outs[layer][sel_t, t]
                bit_ok &= bitwise_equal(got, o)
                worst = max(worst, errors(got, o)["rel_l2"])
    step.flush(list(range(S)))
    for lay, (pst, pcs) in zip(layers, plain):
        bit_ok &= bitwise_equal(lay.conv_state, pcs)
        bit_ok &= bitwise_equal(lay.state, pst)
        worst = max(worst, errors(lay.state, pst)["rel_l2"])
    k = f"protocol_{form}"
    rows = [{"kernel": k, "metric": "engaged_as_simulated", "value": float(eng_ok), "passed": eng_ok,
             "what": "engaged"},
            {"kernel": k, "metric": "rel_l2_vs_plain", "value": worst,
             "tolerance": 0.0, "passed": worst <= 0.0, "what": "o and states"},
            {"kernel": k, "metric": "bitwise_vs_plain", "value": float(bit_ok),
             "passed": bit_ok, "what": "o and states"}]
    rows += [{"kernel": k, "metric": m, "value": float(v)} for m, v in step.stats.items()]
    rows.append({"kernel": k, "metric": "write_back_frac", "value": n_wb / max(n_verify, 1)})
    if any(r.get("passed") is False for r in rows):
        raise CheckFailed("protocol run disagrees with plain decoding or the simulation", rows)
    return rows
