"""The kernels notebook's headline: the target table's decode rows judged on the GPU rows of a
committed run (one H100, run ``h100-2026-12-07f``), with FlashInfer's decode made up from ours
so the ratio is known."""

from __future__ import annotations

import pandas as pd
import pytest
from _paths import ROOT

import pmll_lab  # noqa: F401  (backend first)
from pmll_lab.experiments import kernels
from pmll_lab.experiments import targets as T
from pmll_lab.results import load

RUN = ROOT / "reports/h100-2026-12-07f/results/kernels/kernels_gdn_decode.jsonl"
RAN = ("decode", "decode_cuda", "flashinfer_decode")


def test_a_run_gets_the_targets_it_can_judge_and_no_other():
    assert {t.ours for t in kernels.targets("gdn_decode", RAN)} == {"decode"}
    assert {t.peer for t in kernels.targets("gdn_decode", RAN)} == {"flashinfer_decode", None}
    alone = kernels.targets("gdn_decode", ["decode"])          # FlashInfer not selected
    assert [t.peer for t in alone] == [None]
    assert kernels.targets("gdn_decode", ["decode_cuda"]) == ()  # the target's kernel not run
    assert kernels.targets("gdn_step", ["ring", "exact_lazy"]) == ()
    assert kernels.targets("gdn_decode", "all") == kernels.targets("gdn_decode", RAN)
    assert kernels.targets("gdn_decode", "decode+flashinfer_decode") == \
        kernels.targets("gdn_decode", RAN)
    with pytest.raises(ValueError, match="names: no implementation registered as 'my_decod'"):
        kernels.targets("gdn_decode", "my_decod")
    with pytest.raises(ValueError, match="gdn_decod"):
        kernels.targets("gdn_decod", RAN)


def _with_peer(df, scale):
    """``df`` with FlashInfer's decode made up from ours, ``scale`` times our time."""
    peer = df[df["kernel"] == "decode"].assign(kernel="flashinfer_decode")
    peer.loc[peer["metric"] == "time_us", "value"] *= scale
    return pd.concat([df[df["kernel"] != "flashinfer_decode"], peer], ignore_index=True)


@pytest.mark.parametrize("scale", [0.9, 1.25])
def test_decode_targets_judge_real_rows(scale):
    df = _with_peer(load(RUN), scale)
    ours = df[df["kernel"] == "decode"]
    head = T.headline(df, kernels.targets("gdn_decode", RAN))
    ratio = head[head["target"].str.contains("FlashInfer")]
    assert sorted(ratio["B"]) == [1, 8, 64, 128, 256]
    assert ratio["ratio"].tolist() == pytest.approx([round(1 / scale, 3)] * 5)
    assert set(ratio["status"]) == {"missed" if scale < 1 else "met"}
    frac = head[head["target"].str.contains("copy ceiling")].set_index("B")
    assert sorted(frac.index) == [64, 128, 256]
    t = ours[(ours["metric"] == "roofline_frac") & (ours["timer"] == "cuda_graph")
             & (ours["state_dtype"] == "bfloat16")].set_index("B")["value"]
    for B in (64, 128, 256):
        assert frac.loc[B, "roofline_frac"] == pytest.approx(t.loc[B], abs=5e-4)
        assert frac.loc[B, "status"] == ("met" if t.loc[B] >= 0.85 else "missed")


def test_decode_targets_compare_one_shape_only():
    """Our decode at a smaller head size (faster, and not FlashInfer's) beside the real rows
    does not enter the ratio: the targets are judged at Qwen3-Next's shape."""
    df = _with_peer(load(RUN), 0.9)
    small = df[df["kernel"] == "decode"].assign(head_dim=64)
    small.loc[small["metric"] == "time_us", "value"] /= 3
    small = small.assign(point_id=small["point_id"] + "-kd64")
    head = T.headline(pd.concat([df, small], ignore_index=True),
                      kernels.targets("gdn_decode", RAN))
    ratio = head[head["target"].str.contains("FlashInfer")]
    assert ratio["ratio"].tolist() == pytest.approx([round(1 / 0.9, 3)] * 5)


def test_speed_table_keeps_points_apart_and_divides_by_ours():
    """The speed table's ratio is each implementation's time over ours (``decode``) at the same
    point, whatever order the rows come in, and points that differ only in ``HV`` stay apart."""
    df = _with_peer(load(RUN), 1.25)
    wide = df[df["kernel"] == "decode"].assign(HV=64, point_id=lambda d: d["point_id"] + "-hv64")
    wide.loc[wide["metric"] == "time_us", "value"] *= 2
    both = pd.concat([wide, df.iloc[::-1]], ignore_index=True)     # peer rows before ours
    tab = kernels.speed_table(both, "time_us")
    assert {"HV", "vs_ours", "ours"} <= set(tab.columns)
    peer = tab[tab["label"].str.startswith("FlashInfer")]
    assert peer["vs_ours"].tolist() == pytest.approx([1.25] * len(peer), rel=1e-6)
    assert set(tab["ours"]) == {"GDN decode (Triton)"}
    ours = tab[tab["label"] == "GDN decode (Triton)"]
    assert ours["vs_ours"].tolist() == pytest.approx([1.0] * len(ours))
    assert len(ours) == 2 * len(peer) and sorted(ours["HV"].unique()) == [32, 64]
