"""Helpers the experiment modules share."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import pandas as pd
import torch
import torch.nn.functional as F

from pmll_lab.reference import carry as ref_carry
from pmll_lab.sweep import grid

if TYPE_CHECKING:
    from pmll_lab.carry import GdnCarry

COMPILE_KEYS = ("K", "head_dim", "dtype", "state_layout")
"""Point keys that decide which kernels a GDN or carry point compiles: ``run_sweep(affinity=...)``
keeps points that share them on one Dask worker, so each kernel compiles once per sweep (the
gdn_verify and carry_protocol notebooks; ``roofline.COMPILE_KEYS`` adds its own keys)."""


def parts_getattr(module: str, parts: Sequence[str]):
    """A module-level ``__getattr__`` for an experiment split by topic (as FLA splits its ops):
    a name not defined in ``module`` is looked up, in order, in the sibling modules ``parts`` of
    ``pmll_lab.experiments``, imported on first use (they import ``module``, so it cannot import
    them at its top). Raises ``AttributeError`` naming ``module`` when none has the name."""
    import importlib

    def __getattr__(name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        for mod in parts:
            m = importlib.import_module(f"pmll_lab.experiments.{mod}")
            if hasattr(m, name):
                return getattr(m, name)
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__


def head_points(grids: list[dict]) -> list[dict]:
    """Expand notebook grids whose ``heads`` axis lists ``(HK, HV)`` pairs: one point per
    combination with ``HK, HV`` split out; duplicates across grids dropped, order kept."""
    out, seen = [], set()
    for g in grids:
        axes = dict(g)
        heads = axes.pop("heads")
        for p in grid(**axes, heads=[tuple(h) for h in heads]):
            hk, hv = p.pop("heads")
            p.update(HK=int(hk), HV=int(hv))
            key = tuple(sorted(p.items()))
            if key not in seen:
                seen.add(key)
                out.append(p)
    return out


def failed_points(df: pd.DataFrame, params: Sequence[str]) -> pd.DataFrame:
    """One line per failed point or failed peer: the ``params`` columns present, the kernel
    (``*`` for a whole point) and the error text."""
    if df.empty or "status" not in df:
        return pd.DataFrame()
    cols = [c for c in (*params, "kernel", "error") if c in df]
    return df[df["status"] == "failed"][cols].drop_duplicates().reset_index(drop=True)


def point_failures(df: pd.DataFrame) -> tuple[int, pd.DataFrame]:
    """``(failed points, failed peers)``: how many points failed as a whole (every row
    ``status == "failed"``: an exception or a failed check of ours), and the failed rows of
    points that ran otherwise (a peer that raised inside the point,
    ``experiments.gdn.peer_failure_row``: our rows of it are kept)."""
    if df.empty or "status" not in df:
        return 0, pd.DataFrame()
    bad = df["status"] == "failed"
    whole = bad.groupby(df["point_id"]).all()
    peers = df[bad & ~df["point_id"].map(whole)]
    return int(whole.sum()), peers


def failure_line(df: pd.DataFrame) -> str:
    """The conclusions' first line: points run, points failed, and peers that raised inside a
    point (named, with their point count)."""
    n_fail, peers = point_failures(df)
    line = f"- {df['point_id'].nunique()} points run, {n_fail} failed their checks."
    if not peers.empty:
        per = peers.groupby("kernel")["point_id"].nunique()
        line += (" A peer raised inside " + ", ".join(f"{n} ({k})" for k, n in per.items())
                 + " points; our rows of those points are kept.")
    return line


def error_strip(ax, err: pd.DataFrame, cats: Sequence[str], *,
                ticks: Sequence[str] | None = None, legend_title: str = "input dtype (-- tolerance)", fontsize: int = 8,
                rotation: int = 0):
    """The error plot every notebook draws: for each category in ``cats`` (values of
    ``err["cat"]``), the ``rel_l2`` rows of ``err`` as points, one colour per ``dtype``, the
    largest positive ``tolerance`` as a short dash; log scale, exact results (0) at 1e-12.
    ``ticks`` labels the categories (default: ``cats``). Returns ``ax``."""
    dtypes = sorted(err["dtype"].unique())
    width = 0.8 / max(len(dtypes), 1)
    for j, dt in enumerate(dtypes):
        for i, cat in enumerate(cats):
            sel = err[(err["cat"] == cat) & (err["dtype"] == dt)]
            if sel.empty:
                continue
            xpos = i - 0.4 + width * (j + 0.5)
            vals = sel["value"].astype(float).clip(lower=1e-12)
            ax.scatter([xpos] * len(vals), vals, s=12, color=f"C{j}", alpha=0.7, label=dt)
            tol = float(sel["tolerance"].max())
            if tol > 0:
                ax.hlines(tol, xpos - width / 2, xpos + width / 2, colors=f"C{j}",
                          linestyles="--")
    handles, labels = ax.get_legend_handles_labels()
    uniq = dict(zip(labels, handles))
    ax.legend(uniq.values(), uniq.keys(), title=legend_title, fontsize=fontsize)
    ax.set_xticks(range(len(cats)), list(ticks if ticks is not None else cats),
                  fontsize=fontsize, rotation=rotation)
    ax.set_yscale("log")
    return ax


def gating_inputs(seed: int, lead: Sequence[int], num_v_heads: int, *,
                  device: torch.device | str | None = None) -> dict[str, torch.Tensor]:
    """Raw gating inputs of a Qwen3-Next GDN layer and the ``g, beta`` they give, so that our
    kernels (fed ``g, beta``) and FlashInfer (fed the raw inputs) gate identically.

    ``A_log [HV]`` fp32 ~ U(-1, 1); ``dt_bias [HV]`` fp32 zeros; ``a, b [*lead, HV]`` bf16 (the
    projections' dtype in the model), drawn N(0, 1) on the CPU from ``seed``; ``g, beta
    [*lead, HV]`` fp32 computed from the bf16 values by ``pmll_lab.peers.fused_gating`` in fp32
    (``g = -exp(A_log) * softplus(a + dt_bias)``, PyTorch softplus threshold 20; ``beta =
    sigmoid(b)``). References recompute them in float64 from the same raw inputs."""
    from pmll_lab.backend import DEVICE
    from pmll_lab.peers import fused_gating

    gen = torch.Generator(device="cpu").manual_seed(int(seed))
    dev = DEVICE if device is None else torch.device(device)
    A_log = torch.rand(num_v_heads, generator=gen) * 2.0 - 1.0
    a = torch.randn(*lead, num_v_heads, generator=gen).to(torch.bfloat16)
    b = torch.randn(*lead, num_v_heads, generator=gen).to(torch.bfloat16)
    dt_bias = torch.zeros(num_v_heads)
    g, beta = fused_gating(A_log, a, dt_bias, b, dtype=torch.float32)
    out = dict(A_log=A_log, a=a, dt_bias=dt_bias, b=b, g=g, beta=beta)
    return {name: t.to(dev) for name, t in out.items()}


def fill_stash(carry: GdnCarry, seed: int) -> None:
    """Fill every stash row of ``carry`` with realistic values, so that pending counts can be set
    by hand: corrections ``u`` of a verify's scale (N(0, 0.3^2)), log decays ``g =
    -softplus(N(0, 1)) <= 0``, unit keys ``k`` (``reference.carry.l2norm`` of N(0, 1)); fp32,
    drawn on the CPU from ``seed`` (the same rows on every device), then copied to the carry's
    device. Used by the carry verify sweep and the roofline's carry providers."""
    gen = torch.Generator().manual_seed(int(seed))
    carry.u.copy_((torch.randn(carry.u.shape, generator=gen) * 0.3).to(carry.device))
    carry.g.copy_((-F.softplus(torch.randn(carry.g.shape, generator=gen))).to(carry.device))
    carry.k.copy_(ref_carry.l2norm(torch.randn(carry.k.shape, generator=gen)).float()
                  .to(carry.device))


def clone_carry(c: GdnCarry) -> GdnCarry:
    """A copy of ``c`` (stash rows and pending counts cloned, same heads, sizes and ``cap``) that
    a launch may write without touching ``c``."""
    from pmll_lab.carry import GdnCarry

    return GdnCarry(c.buf.clone(), c.pend.clone(), c.num_v_heads, c.k_dim, c.v_dim, c.cap)
