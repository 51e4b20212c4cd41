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


def test_the_decode_family_gets_the_decode_targets_and_no_other_family_does():
    names = {t.ours for t in kernels.targets("gdn_decode")}
    assert names == {"decode"}
    assert kernels.targets("gdn_step") == () and kernels.targets("conv_step") == ()


@pytest.mark.parametrize("scale", [0.9, 1.25])
def test_decode_targets_judge_real_rows(scale):
    df = load(RUN)
    ours = df[df["kernel"] == "decode"]
    peer = ours.assign(kernel="flashinfer_decode")
    peer.loc[peer["metric"] == "time_us", "value"] *= scale
    df = pd.concat([df[df["kernel"] != "flashinfer_decode"], peer], ignore_index=True)
    head = T.headline(df, kernels.targets("gdn_decode"))
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
