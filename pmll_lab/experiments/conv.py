"""The gdn_conv notebook: the causal conv twin verifying K draft rows (SPEC §3c).

``conv_point`` (``K``, ``shape`` of ``SHAPES``, ``B``, ``dtype``, ``pending`` rows per slot)
checks the chain, ``K`` ``conv_update`` and the carry (eager, lazy) against float64 on
``ref_seqs`` sequences and bitwise against plain decoding on all, then times each (the carry
without accepting, so every call does the same work).
"""

from __future__ import annotations

from functools import partial

import pandas as pd
import torch

from pmll_lab.backend import DEVICE
from pmll_lab.bench import bitwise_equal, error_rows
from pmll_lab.conv import (
    ConvCarry, conv_carry_verify, conv_carry_verify_bytes, conv_chain, conv_chain_bytes,
    conv_update, conv_update_bytes, qwen3_next_conv_dim,
)
from pmll_lab.experiments import plots
from pmll_lab.experiments import protocol as P
from pmll_lab.experiments import target_table as TT
from pmll_lab.experiments.targets import fact, facts
from pmll_lab.ops.conv.common import INPUT_DTYPES
from pmll_lab.inputs import conv_inputs, generator
from pmll_lab.reference import conv as ref
from pmll_lab.tolerances import O_TOL as Y_TOL

SHAPES = {
    "qwen3-next": (16, 32, 128),     # HK, HV, kd = vd: dim 8192, qk_channels 4096
    "hk4-hv8-128": (4, 8, 128),      # dim 2048
    "hk2-hv4-32": (2, 4, 32),        # dim 256 (CPU-sized)
}
"""Named conv shapes ``(HK, HV, head size)``; ``dim = 2*HK*kd + HV*vd``."""

CAP = 8
KERNELS = ("chain", "updates", "carry_eager", "carry_lazy")
LABELS = {"chain": "chain + window snapshots", "updates": "K successive conv_update",
          "carry_eager": "carry verify, eager", "carry_lazy": "carry verify, lazy"}
PARAMS = ("K", "B", "shape", "dtype", "pending", "d_conv")
TARGET_SET = TT.SETS[TT.CONV]
TARGETS = TT.for_report(TT.CONV)

AXES = ("K", "B", "shape", "dtype", "pending", "d_conv", "seed")
CONV_DTYPES = tuple(str(d).removeprefix("torch.") for d in INPUT_DTYPES)
"""The dtypes the conv kernels take (``ops.conv.common.INPUT_DTYPES``, by name)."""
"""The gdn_conv sweep's axes (``protocol.grid_points``)."""


def points(grids: list[dict], seed: int = 0) -> list[dict]:
    """The grids' points (axes ``K, B, shape, dtype``, optionally ``pending``, ``d_conv``,
    ``seed`` (default ``seed``)), duplicates dropped. ``ValueError`` naming the axis for a dtype
    outside ``CONV_DTYPES`` (the conv kernels' inputs), a shape
    outside ``SHAPES`` or ``K``/``pending`` outside ``1..CAP``/``0..CAP``, before any point
    runs (and whatever ``protocol.grid_points`` refuses)."""
    pts = P.grid_points(grids, {"seed": [seed]}, axes=AXES, choices={"dtype": CONV_DTYPES})
    for p in pts:
        if p.get("shape") not in SHAPES:
            raise ValueError(f"grids: axis shape: {p.get('shape')!r} is not one of "
                             f"{', '.join(SHAPES)}")
        if not 1 <= p["K"] <= CAP or not 0 <= p.get("pending", 2) <= CAP:
            raise ValueError(f"grids: axis K must be in 1..{CAP} and pending in 0..{CAP}, got "
                             f"K={p['K']}, pending={p.get('pending', 2)}")
    return pts


def _flag(kernel, what, ok):
    return P.flag(kernel, "bitwise", ok, what)


def conv_point(point: dict) -> list[dict]:
    """Check then time one point; returns tidy rows (see the module docstring)."""
    K, B = int(point["K"]), int(point["B"])
    HK, HV, hd = SHAPES[point["shape"]]
    dim, qk, _ = qwen3_next_conv_dim(HK, HV, hd, hd)
    d_conv = int(point.get("d_conv", 4))
    pending = int(point.get("pending", 2))
    ref_seqs = min(B, int(point.get("ref_seqs", 8)))
    dname = point.get("dtype", "bfloat16")
    dtype = getattr(torch, dname)
    seed = int(point.get("seed", 0))
    if not 1 <= K <= CAP or not 0 <= pending <= CAP:
        raise ValueError(f"point: need 1 <= K <= {CAP} and 0 <= pending <= {CAP}")
    d = conv_inputs(seed, B, dim, rows=K, d_conv=d_conv, slots=B + 2, dtype=dtype)
    x, w, bias, state0, idx = d["x"], d["weight"], d["bias"], d["conv_state"], d["state_indices"]
    S, SL = state0.shape[0], state0.shape[2]
    kw = dict(qk_channels=qk, head_dim=hd)
    tol = Y_TOL[dname]
    sub = slice(0, ref_seqs)
    rows: list[dict] = []

    # chain with window snapshots, against the float64 reference
    st_c = state0.clone()
    inter = torch.empty(B, K - 1, dim, SL, dtype=dtype, device=DEVICE)
    y_c = conv_chain(st_c, x, w, bias, state_indices=idx, intermediate=inter, validate=True, **kw)
    y_r, s_r, i_r = ref.conv_chain(state0, x[sub], w, bias, state_indices=idx[sub], **kw)
    sel = idx[sub].long().cpu()
    rows += error_rows("chain", y_c[sub], y_r, tol=tol, what="y")
    rows.append(_flag("chain", "final windows == reference",
                      torch.equal(st_c[idx[sub].long()].double().cpu(), s_r[sel])))
    if K > 1:
        rows.append(_flag("chain", "window snapshots == reference",
                          torch.equal(inter[sub].double().cpu(), i_r)))

    # K successive updates, bitwise against the chain
    st_u = state0.clone()
    row_x = [x[:, t] for t in range(K)]
    ys, same_snap = [], True
    for t in range(K):
        ys.append(conv_update(st_u, row_x[t], w, bias, state_indices=idx, **kw))
        if t < K - 1:
            same_snap = same_snap and bitwise_equal(st_u[idx.long()], inter[:, t])
    y_u = torch.stack(ys, 1)
    rows += error_rows("updates", y_u[sub], y_r, tol=tol, what="y")
    rows += [_flag("updates", "y == chain", bitwise_equal(y_u, y_c)),
             _flag("updates", "final windows == chain", bitwise_equal(st_u, st_c)),
             _flag("updates", "snapshots == chain", same_snap)]

    # carried verify: slots hold `pending` accepted inputs in the stash, not yet in the window
    gen = generator(seed + 1)
    prior = torch.randn(B, max(pending, 1), dim, generator=gen).to(dtype).to(DEVICE)[:, :pending]
    plain_st = state0.clone()
    y_plain = conv_chain(plain_st, torch.cat([prior, x], dim=1), w, bias, state_indices=idx,
                         **kw)[:, pending:]
    carries = {}
    for name, lazy in (("carry_eager", False), ("carry_lazy", True)):
        carry = ConvCarry.empty(S, dim, cap=CAP, dtype=dtype)
        carry.stash[idx.long(), :pending] = prior
        carry.pend[idx.long()] = pending
        st_k = state0.clone()
        stash0, pend0 = carry.stash.clone(), carry.pend.clone()
        y_k, eng = conv_carry_verify(st_k, carry, x, w, bias, slot_tab=idx, lazy=lazy,
                                     validate=True, **kw)
        y_kr, e_kr, s_kr, t_kr = ref.conv_carry_verify(state0, stash0, pend0, x[sub], w, bias,
                                                       slot_tab=idx[sub], lazy=lazy, **kw)
        wb = (pending + K > CAP) if lazy else pending > 0
        rows += error_rows(name, y_k[sub], y_kr, tol=tol, what="y")
        rows += [_flag(name, "y == plain chain", bitwise_equal(y_k, y_plain)),
                 _flag(name, "windows == reference", torch.equal(st_k[sel].double().cpu(), s_kr[sel])),
                 _flag(name, "stash == reference",
                       torch.equal(carry.stash[sel].double().cpu(), t_kr[sel])),
                 _flag(name, "engaged == protocol",
                       eng[sub].tolist() == e_kr.tolist() == [2 if wb else 1] * ref_seqs)]
        carries[name] = (carry, st_k, lazy, wb)
    P.require(rows)

    # timing, after every check passed (the carry without accepting: pend is not advanced, every
    # call verifies from the same pending count)
    io = dict(d_conv=d_conv, state_len=SL, dtype=dtype)

    def run_updates():
        for t in range(K):
            conv_update(st_u, row_x[t], w, bias, state_indices=idx, **kw)

    entries = [("chain", lambda: conv_chain(st_c, x, w, bias, state_indices=idx,
                                            intermediate=inter, **kw),
                conv_chain_bytes(B, K, dim, **io), {"write_back": None}),
               ("updates", run_updates, K * conv_update_bytes(B, dim, **io), {"write_back": None})]
    for name, (carry, st_k, lazy, wb) in carries.items():
        entries.append((name, lambda carry=carry, st_k=st_k, lazy=lazy: conv_carry_verify(
            st_k, carry, x, w, bias, slot_tab=idx, lazy=lazy, **kw), conv_carry_verify_bytes(
            B, K, dim, pending=pending, write_back=float(wb), **io), {"write_back": float(wb)}))
    return rows + P.timed_rows(entries, warmup_ms=25, rep_ms=100, cpu_reps=3)


# ---- tables and plots --------------------------------------------------------------------------

correctness_table = partial(P.correctness_table, by=("dtype",))
failed_points = partial(P.failed_points, params=PARAMS)
main_shape = partial(P.main_shape, keys=("shape", "dtype"),
                     prefer=dict(shape="qwen3-next", dtype="bfloat16"))
plot_errors = partial(plots.plot_errors, labels=LABELS,
                      title="Conv outputs against the float64 reference")


def plot_speed(df: pd.DataFrame, metric: str = "time_us", shape: dict | None = None):
    """Time per verify of K rows or GB/s against batch width, one panel per K, at ``shape``
    (default ``main_shape``)."""
    return plots.plot_speed(df, metric, main_shape(df) if shape is None else shape, LABELS,
                            KERNELS, "Conv twin", {"time_us": "time per verify of K rows (µs)",
                                                   "gbps": "GB/s"})


def budget_table(shapes=("qwen3-next",), Ks=(1, 2, 3, 4, 8), dtype=torch.bfloat16,
                 d_conv: int = 4) -> pd.DataFrame:
    """Conv bytes per sequence per layer (KiB) that verifying K rows holds: the chain's ``K-1``
    window snapshots against the window and the carry stash (``CAP`` rows, whatever K)."""
    e = torch.empty((), dtype=dtype).element_size()
    rows = []
    for name in shapes:
        HK, HV, hd = SHAPES[name]
        dim, _, _ = qwen3_next_conv_dim(HK, HV, hd, hd)
        win = dim * (d_conv - 1) * e
        row = {"shape": name, "dim": dim, "window, KiB": win / 1024,
               f"carry stash (CAP={CAP}), KiB": CAP * dim * e / 1024}
        row.update({f"snapshots K={K}, KiB": (K - 1) * win / 1024 for K in Ks})
        rows.append(row)
    return pd.DataFrame(rows).round(1)


def findings(df: pd.DataFrame) -> pd.DataFrame:
    """Facts: per kernel, the points where every bitwise check held."""
    rows = []
    bit = df[df["metric"] == "bitwise"] if len(df) else df
    for kern, g in bit.groupby("kernel", sort=False) if len(bit) else []:
        good = g.groupby("point_id")["passed"].all()
        rows.append(fact(f"{LABELS.get(kern, kern)}: bitwise ({', '.join(sorted(set(g['what'])))})",
                         int(good.sum()), f"of {len(good)} points"))
    return facts(rows)
