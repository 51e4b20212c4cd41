"""The gdn_verify notebook (the snapshot chain verifying ``K`` draft rows), and the GDN
inputs the carry and roofline points share. ``verify_point`` checks the chain (with and without
snapshots) and ``K`` ``gdn_decode`` launches against float64 and each other bitwise (SPEC §2),
then times them; on a GPU also FLA (``"kv"``) and FlashInfer's mtp (``"vk"``), checked first.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING

import pandas as pd
import torch
import torch.nn.functional as F

from pmll_lab.backend import DEVICE
from pmll_lab.bench import bitwise_equal, error_rows
from pmll_lab.experiments import plots
from pmll_lab.ops.gdn.checks import MAX_ROWS
from pmll_lab.experiments import protocol as P
from pmll_lab.experiments.gdn_case import Case
from pmll_lab.experiments import target_table as TT
from pmll_lab.experiments.targets import fact, facts
from pmll_lab.gdn import (
    carry_stash_bytes, chain_bytes, decodes_bytes, gdn_chain, gdn_chain_ref,
    snapshot_bytes, state_bytes,
)
from pmll_lab.inputs import gdn_inputs
from pmll_lab.peers import (
    fla_available, fla_runner, flashinfer_available, flashinfer_supports,
    flashinfer_version, fused_gating,
)
from pmll_lab.reference import carry as ref_carry
from pmll_lab.sizes import fla_bytes
from pmll_lab.tolerances import STATE_TOL
from pmll_lab.harness import verify as V

if TYPE_CHECKING:
    from pmll_lab.carry import GdnCarry

LAYOUTS = P.LAYOUTS
QWEN3_NEXT = TT.QWEN3_NEXT_BF16
"""Qwen3-Next's GDN heads: the shape every GDN target is held at."""
COMPILE_KEYS = ("K", "head_dim", "dtype", "state_layout")
"""Point keys that decide which kernels a point compiles (``run_sweep(affinity=...)``)."""
N_REF = 4
"""Sequences a peer is checked on against the float64 reference with its own gating."""
LABELS = {"chain": "chain + snapshots", "chain_nosnap": "chain, no snapshots",
          V.DECODES.name: "K x decode", V.FLA.name: "FLA fused_recurrent (no snapshots)",
          V.MTP_SNAPSHOTS.name: "FlashInfer mtp + snapshots"}


# ---- inputs shared with the carry and roofline points ---------------------------------------

def _heads(p: dict) -> dict:
    hk, hv = p.pop("heads")
    return dict(p, HK=int(hk), HV=int(hv))


AXES = ("B", "K", "dtype", "head_dim", "heads", "state_layout", "state_dtype", "seed")
"""The gdn_verify sweep's axes (``protocol.grid_points``; carry_protocol's add
``baselines``: ``pmll_lab.experiments.carry.AXES``)."""


def head_points(grids: Sequence[dict], axes: Sequence[str] = AXES) -> list[dict]:
    """Grids whose ``heads`` axis lists ``(HK, HV)`` pairs -> points with ``HK, HV``;
    duplicates dropped, order kept; ``axes``: the sweep's own (``protocol.grid_points``)."""
    grids = list(grids)
    P.check_axes(grids, axes)
    return P.grid_points([{**{k: v for k, v in g.items() if k != "heads"},
                           "heads": [tuple(h) for h in P.pair_axis(g, "heads")]} for g in grids],
                         each=_heads, axes=axes, choices={"dtype": P.KERNEL_DTYPES})


def points(grids: Sequence[dict], *, axes: Sequence[str] = AXES, **fixed) -> list[dict]:
    """``head_points`` with a ``state_layout`` axis (default ``["kv"]``; an unknown layout is a
    ``ValueError``) and ``fixed`` keys on every point (``seed``); ``axes``: the sweep's own."""
    grids = list(grids)
    for g in grids:
        bad = [x for x in P.axis_values(g, "state_layout", ["kv"]) if x not in LAYOUTS]
        if bad:
            raise ValueError(f"state_layout: unknown {bad}; known {list(LAYOUTS)}")
        many = [k for k in P.axis_values(g, "K", []) if isinstance(k, int) and k > MAX_ROWS]
        if many:
            raise ValueError(f"grids: axis K: at most {MAX_ROWS} rows per verify (the kernels' "
                             f"bound), got {many[0]}")
    for name, value in fixed.items():
        if name in P.INT_AXES:
            P.int_param(name, value, P.INT_AXES[name])
    full = [{**g, "state_layout": g.get("state_layout", ["kv"])} for g in grids]
    return [{**fixed, **p} for p in head_points(full, axes)]


def verify_case(point: dict, n: int) -> Case:
    """The ``Case`` of a verify point (``K, B, HK, HV, head_dim``, optional ``dtype`` bf16,
    ``state_layout`` "kv", ``seed`` 0): ``gdn_inputs`` of ``K`` rows gated by ``gating_inputs``,
    ``n`` sequences for the references. ``ValueError`` for an unknown layout."""
    K, B, HK, HV, D = (int(point[k]) for k in ("K", "B", "HK", "HV", "head_dim"))
    layout = point.get("state_layout", "kv")
    P.check_layout(layout)
    seed = int(point.get("seed", 0))
    x = gdn_inputs(seed, B, HK, HV, D, D, rows=K,
                   dtype=getattr(torch, point.get("dtype", "bfloat16")), state_layout="kv")
    gate = gating_inputs(seed + 11, (B, K), HV)
    x["g"], x["beta"] = gate["g"], gate["beta"]
    state0 = x["state"] if layout == "kv" else x["state"].transpose(-1, -2).contiguous()
    return Case(point, x, gate, x["state"], state0, n=n)


def gating_inputs(seed: int, lead: Sequence[int], num_v_heads: int) -> dict[str, torch.Tensor]:
    """Raw gating inputs of a Qwen3-Next GDN layer and the ``g, beta`` they give, so that our
    kernels (fed ``g, beta``) and FlashInfer (fed the raw inputs) gate identically: ``A_log
    [HV]`` ~ U(-1, 1), ``dt_bias [HV]`` zeros (fp32), ``a, b [*lead, HV]`` bf16 N(0, 1) drawn on
    the CPU from ``seed``; ``g, beta`` fp32 from ``peers.fused_gating``."""
    gen = torch.Generator(device="cpu").manual_seed(int(seed))
    A_log = torch.rand(num_v_heads, generator=gen) * 2.0 - 1.0
    a = torch.randn(*lead, num_v_heads, generator=gen).to(torch.bfloat16)
    b = torch.randn(*lead, num_v_heads, generator=gen).to(torch.bfloat16)
    dt_bias = torch.zeros(num_v_heads)
    g, beta = fused_gating(A_log, a, dt_bias, b, dtype=torch.float32)
    out = dict(A_log=A_log, a=a, dt_bias=dt_bias, b=b, g=g, beta=beta)
    return {name: t.to(DEVICE) for name, t in out.items()}


def fill_stash(carry: GdnCarry, seed: int) -> None:
    """Fill every stash row of ``carry`` with a verify's values (fp32, drawn on the CPU from
    ``seed``): ``u`` ~ N(0, 0.3^2), ``g = -softplus(N(0, 1))``, unit keys ``k``."""
    gen = torch.Generator().manual_seed(int(seed))
    carry.u.copy_((torch.randn(carry.u.shape, generator=gen) * 0.3).to(carry.device))
    carry.g.copy_((-F.softplus(torch.randn(carry.g.shape, generator=gen))).to(carry.device))
    carry.k.copy_(ref_carry.l2norm(torch.randn(carry.k.shape, generator=gen)).float()
                  .to(carry.device))


def fla_run_once(args, h0: torch.Tensor, D: int):
    """FLA's fused_recurrent on the rows ``args`` from ``h0``: ``(run, run())``."""
    run, _ = fla_runner(*args, h0, scale=D ** -0.5)
    return run, run()


def fla_check(args, h0: torch.Tensor, D: int, check) -> tuple[list[dict], object]:
    """FLA from ``h0`` (K-major), its ``(o, h)`` checked by ``check`` (error rows): ``(rows,
    run)``, ``run`` None when a check failed; FLA raising gives its failure row."""
    fla, failed = P.peer_call(V.FLA.name, fla_run_once, args, h0, D)
    if failed:
        return failed, None
    run, (o, h) = fla
    rows = check(o, h)
    return rows, (run if all(r["passed"] for r in rows) else None)


def flashinfer_snapshot_check(c: Case, o_c: torch.Tensor, st_final: torch.Tensor,
                              inter: torch.Tensor):
    """Check FlashInfer's snapshot verify on a V-major case (GPU only): against the float64
    chain with its own gating on ``N_REF`` sequences, against our chain's ``o_c [B, K, HV, vd]``,
    final states and snapshots ``inter [B, K-1, HV, vd, kd]`` over all ``B``, and for a pool left
    as it was. ``(rows, run)``; ``run`` (the call to time) is None when a check failed."""
    name, K, n = V.MTP_SNAPSHOTS.name, c.K, min(c.B, N_REF)
    run, bufs, pool = c.flashinfer(name)
    o, buf = bufs["o"], bufs["intermediate"]
    o_r, s_r, i_r = c.fi_ref(n, "vk")
    rows = (error_rows(name, o[:n], o_r, tol=c.otol, what="o")
            + error_rows(name, buf[:n, K - 1], s_r, tol=STATE_TOL, what="state")
            + error_rows(name, buf[:n, :K - 1], i_r, tol=STATE_TOL, what="snapshots")
            + error_rows(name, o, o_c.to(o.dtype), tol=c.otol, what="o vs our chain")
            + error_rows(name, buf[:, K - 1], st_final, tol=STATE_TOL, what="state vs our chain")
            + error_rows(name, buf[:, :K - 1], inter, tol=STATE_TOL,
                         what="snapshots vs our chain"))
    rows.append(P.flag(name, "state_untouched", bitwise_equal(pool, c.state0),
                       "pool unchanged (disable_state_update=True)"))
    return rows, (run if all(r["passed"] for r in rows) else None)


def peer_snapshot_check(*args) -> tuple[list[dict], object]:
    """``flashinfer_snapshot_check(*args)``, or its failure row when FlashInfer raises."""
    out, failed = P.peer_call(V.MTP_SNAPSHOTS.name, flashinfer_snapshot_check, *args)
    return out if failed is None else (failed, None)


def peers_checked(c: Case, o_c, st_c, inter, fla_rows) -> tuple[list[dict], list[tuple]]:
    """On a GPU: FLA on a K-major case (its ``(o, h)`` checked by ``fla_rows``), FlashInfer's
    snapshot verify on a V-major one (``K >= 2``) against our chain's ``o_c``, pool ``st_c``
    and snapshots ``inter``. ``(rows, timing entries)``: a peer that disagrees or raises is not
    timed, our rows stand."""
    rows, entries = [], []
    if c.layout == "kv" and fla_available():
        frows, run = fla_check(c.args, c.state0[c.lsel].contiguous(), c.D, fla_rows)
        rows += frows
        if run is not None:
            entries.append((V.FLA.name, run,
                            fla_bytes(c.B, c.K, c.HK, c.HV, c.D, c.dtype), {}))
    if c.layout == "vk" and c.K >= 2 and flashinfer_available() and \
            flashinfer_supports(c.D, c.dname):
        firows, run = peer_snapshot_check(c, o_c, st_c[c.lsel], inter)
        rows += firows
        if run is not None:     # K states to the buffer, the pool read once: (K+1)*Hb
            entries.append((V.MTP_SNAPSHOTS.name, run, chain_bytes(c.B, c.K, **c.io()),
                            {"flashinfer_version": flashinfer_version()}))
    return rows, entries


# ---- the point -------------------------------------------------------------------------------

def verify_point(point: dict) -> list[dict]:
    """Check, then time, one point (module docstring). Optional keys: ``dtype`` (bf16),
    ``state_layout`` ("kv"), ``seed`` (0). Raises ``CheckFailed`` (nothing timed) when one of
    our kernels fails, ``ValueError`` for an unknown layout."""
    c = verify_case(point, int(point["B"]))
    K, B, args, idx, lay = c.K, c.B, c.args, c.sel, c.lay
    o_ref, s_ref, i_ref = gdn_chain_ref(c.state0, *args, state_indices=idx, **lay)
    c.o_ref, c.s_ref, c.i_ref = o_ref, c.to_layout(s_ref[c.lsel]), c.to_layout(i_ref)
    rows, o_c, st_c, inter = c.check_chain("chain", validate=True)
    st_n = c.state0.clone()
    o_n = gdn_chain(st_n, *args, state_indices=idx, validate=True, **lay)
    o_d, st_sel, snaps, st_d = c.decoded()
    rows += c.ref_rows(V.DECODES.name, o_d, st_sel)
    for what, ok in (("o", bitwise_equal(o_c, o_d)), ("state", bitwise_equal(st_c, st_d)),
                     ("snapshots", all(bitwise_equal(s, inter[:, r]) for r, s in enumerate(snaps))),
                     ("no-snapshot chain", bitwise_equal(o_n, o_c) and bitwise_equal(st_n, st_c))):
        rows.append(P.flag("chain", "bitwise_vs_decodes", ok, what))
    P.require(rows)

    peer_rows, peer_entries = peers_checked(c, o_c, st_c, inter,
                                            lambda o, h: c.ref_rows(V.FLA.name, o, h))
    rows += peer_rows
    nosnap = fla_bytes(B, K, c.HK, c.HV, c.D, c.dtype)
    entries = [("chain", c.chain_run(st_c, inter), chain_bytes(B, K, **c.io()), {}),
               ("chain_nosnap", c.chain_run(st_n), nosnap + 4 * B, {}),
               (V.DECODES.name, c.decodes_run(st_d), decodes_bytes(B, K, **c.io()), {})]
    for r in P.timed_rows(entries + peer_entries):
        if r["metric"] == "time_us":
            r["time_per_row_us"] = r["value"] / K
        rows.append(r)
    return rows


# ---- targets, tables and plots (times: ``protocol.wide``; ratios from GPU runs only) ------

SHAPE_KEYS = ("HK", "HV", "head_dim", "dtype")
PARAMS = ("K", "B", "HK", "HV", "head_dim", "dtype", "state_layout")
TARGET_SET = TT.SETS[TT.GDN_VERIFY]
TARGETS = TT.for_report(TT.GDN_VERIFY)

correctness_table = partial(P.correctness_table, by=("state_layout", "dtype"))
failed_points = partial(P.failed_points, params=PARAMS)
main_shape = partial(P.main_shape, keys=SHAPE_KEYS, prefer=QWEN3_NEXT)
plot_errors = partial(plots.plot_errors, labels=LABELS,
                      title="Chain, decodes and peers against the float64 chain")


def plot_speed(df: pd.DataFrame, metric: str = "time_us", shape: dict | None = None):
    """Time per verify or GB/s against batch width, one panel per K, at ``shape`` (default
    ``main_shape``)."""
    return plots.plot_speed(df, metric, main_shape(df) if shape is None else shape, LABELS,
                            list(LABELS), "Verify of K rows",
                            {"time_us": "time per verify (µs)", "gbps": "GB/s (SPEC §4 bytes)"})


def layout_table(df: pd.DataFrame, shape: dict | None = None) -> pd.DataFrame:
    """Time per verify (µs) of each kernel per ``(K, B)`` (the index), one column per ``kernel
    layout``; on a GPU also the V-major / K-major ratio of the chain and the chain against
    FlashInfer. A cell is empty where that kernel did not run at that point."""
    shape = main_shape(df) if shape is None else shape
    w = P.at(P.wide(df), shape)
    if w.empty:
        return pd.DataFrame()
    w = w.assign(col=w["kernel"] + " " + w["state_layout"])
    out = w.pivot_table(index=["K", "B"], columns="col", values="time_us").round(1)
    if P.on_gpu(w):
        if {"chain kv", "chain vk"} <= set(out.columns):
            out["chain vk / kv"] = (out["chain vk"] / out["chain kv"]).round(3)
        if {"flashinfer_mtp_snapshots vk", "chain vk"} <= set(out.columns):
            out["chain vk / FlashInfer"] = (out["chain vk"]
                                            / out["flashinfer_mtp_snapshots vk"]).round(3)
    out.columns.name = "µs per verify"
    return out


def budget_table(shapes: list[tuple[int, int]], Ks=(1, 2, 3, 4, 8)) -> pd.DataFrame:
    """State bytes per sequence and layer (MiB) that verifying K rows holds: the snapshots
    ``(K-1)*Hb``, the state itself and the carried-state stash (``CAP = 8`` rows)."""
    rows = []
    for HV, D in shapes:
        row = {"HV": HV, "kd=vd": D, "state Hb, MiB": state_bytes(HV, D, D) / 2**20,
               "carry stash, MiB": carry_stash_bytes(HV, D, D) / 2**20}
        row.update({f"snapshots K={K}, MiB": snapshot_bytes(K, HV, D, D) / 2**20 for K in Ks})
        rows.append(row)
    return pd.DataFrame(rows).round(3).set_index(["HV", "kd=vd"])


def budget_shapes(pts: list[dict]) -> list[tuple[int, int]]:
    return sorted({(int(p["HV"]), int(p["head_dim"])) for p in pts})


def plot_snapshot_budget(shapes: list[tuple[int, int]], Ks=(1, 2, 3, 4, 8)):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 3.6), layout="constrained")
    for i, (HV, D) in enumerate(shapes):
        c = f"C{i}"
        ax.plot(Ks, [snapshot_bytes(K, HV, D, D) / 2**20 for K in Ks], "o-", color=c,
                label=f"snapshots, HV={HV}, kd=vd={D}")
        ax.axhline(state_bytes(HV, D, D) / 2**20, color=c, ls=":", lw=1)
        ax.axhline(carry_stash_bytes(HV, D, D) / 2**20, color=c, ls="--", lw=1)
    ax.plot([], [], "k:", lw=1, label="the state itself (Hb)")
    ax.plot([], [], "k--", lw=1, label="carry stash, CAP=8 rows (SPEC §3b)")
    ax.set(xlabel="K (draft rows verified)", ylabel="MiB per sequence per layer",
           yscale="symlog", title="State bytes the snapshots hold against K")
    fig.legend(loc="outside right center", fontsize=7, frameon=False)
    return fig


def findings(df: pd.DataFrame) -> pd.DataFrame:
    """Facts: the chain bitwise equal to K decodes per layout; on a GPU at the main shape, K=4,
    B=64, the chain's time over the chain without snapshots, and V-major over K-major."""
    rows = []
    ok = P.with_layout(df[df["status"] == "ok"]) if len(df) else df
    for lay in LAYOUTS:
        bit = ok[(ok["metric"] == "bitwise_vs_decodes") & (ok["state_layout"] == lay)] \
            if len(ok) else ok
        if len(bit):
            good = bit.groupby("point_id")["passed"].all()
            rows.append(fact(f"chain == K decodes bitwise, {P.LAYOUT_NAMES[lay]}",
                             int(good.sum()), f"of {len(good)} points"))
    w = P.at(P.wide(df), dict(QWEN3_NEXT, K=4, B=64)) if P.on_gpu(df) else pd.DataFrame()
    t = {(r.kernel, r.state_layout): r.time_us for r in w.itertuples()} if len(w) else {}
    for lay in LAYOUTS:
        if (("chain", lay) in t) and (("chain_nosnap", lay) in t):
            rows.append(fact(f"chain / chain without snapshots, {P.LAYOUT_NAMES[lay]}, K=4, B=64",
                             t[("chain", lay)] / t[("chain_nosnap", lay)], "x",
                             "SPEC §4 bytes: (K+1)/2 = 2.5x"))
    if ("chain", "kv") in t and ("chain", "vk") in t:
        rows.append(fact("chain, V-major / K-major time, K=4, B=64",
                         t[("chain", "vk")] / t[("chain", "kv")], "x"))
    return facts(rows)
