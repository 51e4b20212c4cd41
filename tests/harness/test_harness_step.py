"""The speculative-step family (pmll_lab.harness.step) through the one runner, on the CPU.

The step loop runs without a graph here: each implementation's accepted outputs and final
states are checked against float64 decoding of the accepted rows (``step.check``), so a wrong
restore, commit or accept shows as an error far above the tolerance; the cursors are audited
against the acceptance process and the exact forms compared with plain decoding bitwise.
Tolerances: ``tolerances.STEP_TOL`` (bf16 outputs rounded once: 8e-3; a bf16 state: 2e-2).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

import pmll_lab  # noqa: F401  (first: picks GPU or the Triton interpreter)
from pmll_lab.backend import DEVICE
from pmll_lab.bench import bitwise_equal
from pmll_lab.ops.gdn.restore import gdn_snapshot_restore
from pmll_lab.harness import registry
from pmll_lab.harness.step import StepCase, acceptance_counts, check, cursor_audit

CUDA_FORMS = [n for n in registry.names("gdn_step") if registry.get(n).impl == "cuda"]


def _case(state_dtype=torch.float32, **kw):
    return StepCase(batch=3, rows=3, num_k_heads=1, num_v_heads=2, head_dim=16, steps=6,
                    state_dtype=state_dtype, ring_length=8, seed=kw.pop("seed", 5), **kw)


def _check(form, case, **kw):
    impl = registry.get(form)
    plain = impl.plain(case) if impl.plain else None
    return check(impl.build(case), case, ref_seqs=3, plain=plain, **kw)


@pytest.mark.parametrize("form", ["exact_lazy", "exact_eager", "ring", "ring_exact_fold",
                                  "chain_restore", "plain_decode"])
def test_step_forms_match_plain_decoding(form):
    r = _check(form, _case())
    assert r["passed"], r
    assert r["errors"]["state"] < 1e-5, r      # fp32 state: the accepted rows stick exactly
    if form in ("exact_lazy", "ring", "ring_exact_fold"):
        assert 0 < r["facts"]["fold_frac"] < 1 and r["facts"]["mean_fill"] > 0
        assert r["facts"]["cursor_mismatches"] == 0 and r["facts"]["cursor_steps"] == 6
    if registry.get(form).plain is not None:
        assert r["bitwise"] == {"state vs plain decoding": True}, r


def test_step_ring_bf16_state():
    r = _check("ring", _case(torch.bfloat16, seed=9))
    assert r["passed"], r


def test_ring_exact_fold_keeps_plain_decodings_bf16_state(monkeypatch):
    """The ring with an exact fold, bf16 pool: its state is plain bf16 decoding's to the bit
    (the ring's own fold is not: a bf16 tensor-core fold rounds once per fold), its outputs
    the ring's; a fold that replays one raw row too few breaks the bits."""
    from pmll_lab.harness import step_ring_exact_fold as ref_form

    case = _case(torch.bfloat16, seed=9)
    r = _check("ring_exact_fold", case)
    assert r["passed"] and r["bitwise"] == {"state vs plain decoding": True}, r
    assert r["facts"]["fold_frac"] > 0 and r["facts"]["cursor_mismatches"] == 0, r
    ring = _check("ring", case)
    assert r["errors"]["o"] == pytest.approx(ring["errors"]["o"], rel=0.25)
    plain = _check("plain_decode", case)
    assert r["errors"]["state"] == plain["errors"]["state"]   # the same bits, the same error

    replay = ref_form.RawWindow.replay
    monkeypatch.setattr(ref_form.RawWindow, "replay",
                        lambda self, state, slots, count, c, length:
                        replay(self, state, slots, (count - 1).clamp(min=0), c, length))
    short = _check("ring_exact_fold", case)
    assert short["bitwise"] == {"state vs plain decoding": False} and not short["passed"]


@pytest.mark.parametrize("breaks", ["outputs", "state"])
def test_a_form_right_only_on_the_reference_sequences_fails(breaks):
    """The float64 reference covers the first ``ref_seqs`` sequences; every other one is
    compared with plain decoding on the device, so a form that is right on the first sequences
    only (here the ring, its later sequences' outputs zeroed or their state scaled by 1.01)
    fails the check, and the same form unbroken passes it."""
    case = StepCase(batch=6, rows=3, num_k_heads=1, num_v_heads=2, head_dim=16, steps=4,
                    state_dtype=torch.float32, ring_length=8, seed=3)
    assert check(registry.get("ring").build(case), case, ref_seqs=2)["passed"]
    sf = registry.get("ring").build(case)
    real, slots = sf._step, case.tensors["slots"].long()

    def broken(i, collect):
        o, e, fill = real(i, collect)
        if breaks == "outputs":
            o[2:] = 0
        else:                         # the later sequences' state 1 % off
            st = sf.cursors()[-1]
            st[slots[2:]] *= 1 + 1e-2
        return o, e, fill
    sf._step = broken
    r = check(sf, case, ref_seqs=2)
    assert not r["passed"], r
    what = "o vs plain" if breaks == "outputs" else "state vs plain"
    assert r["errors"][what] > r["tolerance"][what], r
    assert r["errors"]["o"] <= r["tolerance"]["o"], r        # the first two are right


def test_cursor_audit_catches_a_commit_that_never_advances():
    """A ring whose commit is skipped (the cursor never moves, as in a benchmark that times no
    fold) fails the audit, though its first step's outputs are right."""
    case = _case(seed=2)
    sf = registry.get("ring").build(case)
    real = sf._step

    def stuck(i, collect):            # the verify runs, but the cursor is put back
        before = [c.clone() for c in sf.cursors()]
        out = real(i, collect)
        for c, b in zip(sf.cursors(), before):
            c.copy_(b)
        return out
    sf._step = stuck
    for i in range(case.steps):
        sf.step(i, collect=True)
    audit = cursor_audit(sf)
    assert audit["cursor_mismatches"] > 0, audit


def test_acceptance_counts_process():
    a = acceptance_counts(400, 64, 4, 0.8, seed=3, device="cpu")
    assert a.dtype == torch.int32 and a.shape == (400, 64)
    assert int(a.min()) >= 1 and int(a.max()) <= 4
    mean = float(a.float().mean())
    assert abs(mean - (1 + 0.8 + 0.64 + 0.512)) < 0.03, mean
    assert bitwise_equal(a, acceptance_counts(400, 64, 4, 0.8, seed=3, device="cpu"))
    with pytest.raises(ValueError, match="alpha"):
        acceptance_counts(4, 2, 4, 1.5, seed=0)


def test_snapshot_restore_copies_the_accepted_snapshot():
    gen = torch.Generator().manual_seed(0)
    state = torch.randn(5, 2, 4, 8, generator=gen).to(DEVICE)
    snaps = torch.randn(3, 3, 2, 4, 8, generator=gen).to(DEVICE)
    slots = torch.tensor([4, -1, 1], dtype=torch.int32, device=DEVICE)
    acc = torch.tensor([2, 3, 4], dtype=torch.int32, device=DEVICE)
    want = state.clone()
    want[4] = snaps[0, 1]
    got = state.clone()
    gdn_snapshot_restore(got, snaps, slots, acc, last_in_place=True)   # K = 4: a = 4 in place
    assert bitwise_equal(got, want)
    got2 = state.clone()
    acc2 = torch.tensor([1, 2, 3], dtype=torch.int32, device=DEVICE)
    gdn_snapshot_restore(got2, snaps, slots, acc2, last_in_place=False)   # K = 3 snapshots
    want2 = state.clone()
    want2[4], want2[1] = snaps[0, 0], snaps[2, 2]
    assert bitwise_equal(got2, want2)
    with pytest.raises(ValueError, match="snapshots"):
        gdn_snapshot_restore(got, snaps[:, :, :1], slots, acc, last_in_place=True)
    with pytest.raises(ValueError, match="accepted"):
        gdn_snapshot_restore(got, snaps, slots, acc.float(), last_in_place=True)


def test_step_bytes_and_support_table():
    case = _case()
    hb = 2 * 16 * 16 * 4
    nothing = {"fold_frac": 0.0, "mean_fill": 0.0}
    assert registry.get("chain_restore").bytes(case, nothing) > 4 * hb
    ring = registry.get("ring").bytes
    assert ring(case, nothing) < ring(case, {"fold_frac": 1.0, "mean_fill": 0.0})
    fi = registry.get("flashinfer_replayssm")
    assert fi.unsupported(case)           # an fp32 state and head size 16: FlashInfer refuses
    with pytest.raises(ValueError, match="name: no implementation registered as 'wy'"):
        registry.get("wy")
    with pytest.raises(ValueError, match="forms"):
        registry.resolve("gdn_step", "ring+rign")
    assert set(registry.names("gdn_step")) >= {"ring", "flashinfer_replayssm"}


def test_step_point_rows_and_targets_on_the_cpu():
    """A sweep point's rows: checks for our forms, FlashInfer as unsupported rows (no GPU); the
    target table says "not measured" rather than a ratio of interpreter times."""
    import pandas as pd

    from pmll_lab.experiments import step as S

    p = dict(B=2, K=2, HK=1, HV=2, head_dim=16, state_dtype="float32", steps=2, alpha=0.5,
             ring_length=8)
    rows = S.step_point(p)
    by = {(r["form"], r["metric"] if r["metric"] != "rel_l2" else f"{r['what']}_rel_l2"): r
          for r in rows}
    assert by[("flashinfer_replayssm", "unsupported")]["status"] == "unsupported"
    assert by[("flashinfer_replayssm", "unsupported")]["provider"] == "flashinfer"
    assert by[("flashinfer_replayssm", "unsupported")]["note"] == "FlashInfer: not installed" \
        or DEVICE.type == "cuda"
    assert by[("exact_lazy", "o_rel_l2")]["impl"] == "triton"
    assert by[("exact_lazy", "o_rel_l2")]["provider"] == "pmll_lab"
    assert by[("exact_lazy", "cursor_mismatches")]["value"] == 0
    assert by[("exact_lazy", "bitwise")]["value"] == 1.0
    if DEVICE.type != "cuda":         # the CUDA twins' forms need a GPU: one row each that says so
        for form in CUDA_FORMS:
            assert by[(form, "unsupported")]["impl"] == "cuda"
    for form in ("exact_lazy", "ring", "chain_restore"):
        assert by[(form, "o_rel_l2")]["passed"] and by[(form, "o_rel_l2")]["value"] < 8e-3
        assert by[(form, "bytes_held_seq")]["value"] > 0
    assert any(r["metric"] == "step_us" for r in rows) == (DEVICE.type == "cuda")  # GPU only
    from pmll_lab.experiments import targets as T

    df = pd.DataFrame([dict(p, point_id=0, **r) for r in rows])
    head = T.headline(df, S.TARGETS)
    if DEVICE.type == "cuda":       # one point of B = 2: every target is judged or not measured
        assert set(head["status"]) <= {"met", "missed", "reported", "not measured"}, head
    else:
        assert not set(head["status"]) & {"met", "missed"}, head  # no speed verdict on the CPU


def test_sensitivity_rows_and_facts():
    """A point naming its forms ("ring+exact_lazy") runs those only; the sensitivity table keys
    rows by alpha and ring length; its facts are ratios of GPU step times (synthetic rows here,
    since the CPU has none)."""
    import pandas as pd

    from pmll_lab.experiments import step as S

    p = dict(B=2, K=2, HK=1, HV=2, head_dim=16, state_dtype="bfloat16", steps=2, alpha=0.5,
             ring_length=8, forms="ring+exact_lazy")
    rows = S.step_point(p)
    assert {r["form"] for r in rows} == {"ring", "exact_lazy"}     # no conv twin rows either
    ring_rows = [r for r in rows if r["form"] == "ring" and r["metric"] == "rel_l2"]
    assert ring_rows and all(r["passed"] for r in ring_rows)
    t = S.sensitivity_table(pd.DataFrame([dict(p, **r) for r in rows]))
    assert set(t.form) == {"ring", "exact_lazy"} and set(t.ring_length) == {8}
    assert (t.mean_accept >= 0).all() and (t.mean_accept <= 2).all()
    # facts from step times: R=8 and R=32 against R=16; exact lazy against the ring at R=16
    base = dict(state_dtype="bfloat16", B=64, K=4, alpha=0.8, status="ok", mean_accept=2.9,
                metric="step_us")
    syn = pd.DataFrame([dict(base, form="ring", ring_length=8, value=80.0),
                        dict(base, form="ring", ring_length=16, value=64.0),
                        dict(base, form="ring", ring_length=32, value=72.0),
                        dict(base, form="exact_lazy", ring_length=16, value=192.0)])
    f = S.sensitivity_findings(syn).set_index("quantity")["value"]
    assert f["alpha=0.8: ring step with R=8 / with R=16"] == 1.25
    assert f["alpha=0.8: ring step with R=32 / with R=16"] == 1.125
    assert f["alpha=0.8 (mean 2.90 accepted): carry exact, lazy step / ring step"] == 3.0


def test_conv_twin_step_is_bitwise_conv_update():
    from pmll_lab.harness import conv_step

    case = _case(seed=4)
    for form in registry.names("conv_step"):
        r = conv_step.check(registry.get(form).build(case), case)
        assert r["passed"] and all(r["bitwise"].values()), (form, r)


def test_bytes_facts_keep_their_values():
    """The bytes facts are numbers in their units, readable at the CPU's tiny shapes (a few KB
    per step, which ``.2f`` MB showed as "0.00") and at the GPU's (MB per step, hundreds of KiB
    held)."""
    import pandas as pd
    import pytest

    from pmll_lab.experiments import step as S

    base = dict(state_dtype="bfloat16", B=2, K=3, status="ok")
    rows = [dict(base, form="ring", metric="bytes_moved_step", value=2504.0),
            dict(base, form="ring", metric="bytes_held_seq", value=1672.0),
            dict(base, form="exact_lazy", metric="bytes_moved_step", value=1889872.0),
            dict(base, form="exact_lazy", metric="bytes_held_seq", value=263172.0)]
    f = S.findings(pd.DataFrame(rows), pd.DataFrame(), pd.DataFrame()).set_index("quantity")
    ring, lazy = "carry ring (tolerance form), bf16", "carry exact, lazy, bf16"
    assert f.loc[f"{ring}: moved per step and sequence", "value"] == pytest.approx(0.002504)
    assert f.loc[f"{ring}: held per sequence", "value"] == pytest.approx(1672 / 1024)
    assert f.loc[f"{lazy}: moved per step and sequence", "value"] == pytest.approx(1.889872)
    assert f.loc[f"{lazy}: held per sequence", "value"] == pytest.approx(263172 / 1024)
    assert f.loc[f"{lazy}: moved per step and sequence", "unit"] == "MB"
    assert f.loc[f"{lazy}: held per sequence", "unit"] == "KiB"


def test_exact_lazy_effective_state_is_plain_decodings_to_the_bit():
    """The drift study's "state each form stands for": the exact lazy carry's stored bf16 state
    with its pending rows folded (by the flush kernel, on a copy) is bitwise the state plain
    bf16 decoding of the accepted tokens holds, checked while rows are pending (the fill before
    the next step > 0); folding a copy leaves the carry as it was (the same answer twice)."""
    import torch

    kw = dict(batch=2, rows=3, num_k_heads=1, num_v_heads=2, head_dim=16, steps=5, alpha=0.8,
              seed=3, state_dtype=torch.bfloat16)
    lazy = registry.get("exact_lazy").build(StepCase(**kw))
    plain = registry.get("plain_decode").build(StepCase(**kw))
    acc = lazy.case.tensors["accepted"]
    for i in range(kw["steps"]):
        o_lazy, o_plain = lazy.step(i, collect=True).clone(), plain.step(i)
        for b in range(kw["batch"]):
            a = int(acc[i, b])
            assert torch.equal(o_lazy[b, :a], o_plain[b, :a]), (i, b)
            first = lazy.effective_state(b)
            assert torch.equal(first, plain.effective_state(b)), (i, b)
            assert torch.equal(lazy.effective_state(b), first), (i, b)
    assert max(int(f.max()) for f in lazy.fills[1:]) > 0, \
        "no step began with pending rows: the fold went untested"


def test_drift_table_and_same_drift_on_constructed_rows():
    """The drift table is flat (one row per form and state dtype, mean/worst/last per quantity);
    ``same_drift`` is True only for equal error series and None for a form that did not run."""
    from pmll_lab.experiments import step as S

    rng = np.random.default_rng(3)
    rows = []
    vals = rng.random(6) * 1e-3
    for form, shift in (("exact_lazy", 0.0), ("plain_decode", 0.0), ("ring", 1e-7)):
        for j, tok in enumerate((10.0, 20.0, 30.0)):
            rows.append(dict(form=form, state_dtype="bfloat16", metric="o_rel_l2", tokens=tok,
                             value=vals[j] + shift))
            rows.append(dict(form=form, state_dtype="bfloat16", metric="state_rel_l2",
                             tokens=tok, value=vals[3 + j] + shift))
    ddf = pd.DataFrame(rows)
    t = S.drift_table(ddf)
    assert list(t.columns) == ["form", "state_dtype", "o_mean", "o_worst", "o_last",
                               "state_mean", "state_worst", "state_last"]
    ex = t[t.form == "exact_lazy"].iloc[0]
    assert ex.o_mean == pytest.approx(vals[:3].mean()) and ex.o_worst == vals[:3].max()
    assert ex.state_last == vals[5]
    assert S.same_drift(ddf, "exact_lazy", "plain_decode") is True
    assert S.same_drift(ddf, "ring", "plain_decode") is False
    assert S.same_drift(ddf, "exact_eager", "plain_decode") is None
    assert S.drift_table(ddf.iloc[:0]).empty
    # the findings carry the same answer as a fact (1: equal errors), and each form's drift
    f = S.findings(pd.DataFrame(), pd.DataFrame(), ddf).set_index("quantity")
    same = [q for q in f.index if q.startswith("drift, bf16 state: exact lazy carry's errors")]
    assert len(same) == 1 and f.loc[same[0], "value"] == 1
    worst = "drift, carry exact, lazy (bfloat16 state): o_rel_l2, worst"
    assert f.loc[worst, "value"] == vals[:3].max() and f.loc[worst, "unit"] == "rel. L2"


def test_roofline_and_carry_protocol_headlines_judge_the_step():
    """The per-step targets of the roofline and carry_protocol headlines on synthetic GPU step
    rows (the CPU has no step times): each judged from the forms' step_us at B = 64 and 128,
    ratios as measured, the reported ones outside the count."""
    import pandas as pd

    from pmll_lab.experiments import carry_report as CR
    from pmll_lab.experiments import roofline_report as RR
    from pmll_lab.experiments import targets as T

    times = {("exact_lazy", "float32"): 132.0, ("exact_eager", "float32"): 136.0,
             ("chain_restore", "float32"): 213.0, ("flashinfer_snapshot_restore", "float32"): 256.0,
             ("exact_lazy", "bfloat16"): 195.0, ("flashinfer_snapshot_restore", "bfloat16"): 140.0,
             ("chain_restore", "bfloat16"): 147.0, ("ring", "bfloat16"): 47.0,
             ("flashinfer_replayssm", "bfloat16"): 33.5, ("exact_lazy_cuda", "bfloat16"): 90.0,
             ("exact_lazy_cuda", "float32"): 70.0}
    rows = [dict(point_id=f"{B}-{sd}", kernel=form, form=form, state_dtype=sd, B=B, K=4,
                 metric="step_us", value=us * B / 64, timer="cuda_graph", status="ok")
            for (form, sd), us in times.items() for B in (1, 64, 128)]
    df = pd.DataFrame(rows)
    head = T.headline(df, CR.STEP_TARGETS).set_index(["target", "B"])
    lazy = head.loc[("exact lazy step <= 0.4x FlashInfer's snapshot step (mtp + restore), "
                     "fp32 state", 64)]
    assert lazy["status"] == "missed" and abs(lazy["ratio"] - 132.0 / 256.0) < 1e-3
    reported = head[head["bound"].isna()]
    # six reported targets measured at B = 64 and 128; SGLang's, absent here, not measured
    assert (reported["status"] == "reported").sum() == 12, reported
    assert set(reported["status"]) == {"reported", "not measured"}
    sgl = head[head.index.get_level_values(0).str.contains("SGLang")]
    assert len(sgl) and set(sgl["status"]) == {"not measured"}
    ring = head.loc[("ring step against our chain + snapshots + restore, bf16 state", 64)]
    assert abs(ring["ratio"] - 47.0 / 147.0) < 1e-3
    ring = head.loc[("ring step against FlashInfer's snapshot step (mtp + restore), bf16 "
                     "state", 128)]
    assert abs(ring["ratio"] - 47.0 / 140.0) < 1e-3
    twin = head.loc[("CUDA twin's exact lazy step <= 0.5x the Triton exact lazy step, bf16 state",
                     128)]
    assert twin["status"] == "met" and abs(twin["ratio"] - 90.0 / 195.0) < 1e-3
    twin_fi = head.loc[("CUDA twin's exact lazy step <= 1.5x FlashInfer's ReplaySSM step, bf16 "
                        "state", 64)]
    assert twin_fi["status"] == "missed" and abs(twin_fi["ratio"] - 90.0 / 33.5) < 1e-3
    rhead = T.headline(df, RR.STEP_TARGETS).set_index(["target", "B"])
    chain = rhead.loc[("chain + snapshots + restore step <= FlashInfer mtp + snapshots + "
                       "restore, fp32 state", 128)]
    assert chain["status"] == "met" and abs(chain["ratio"] - 213.0 / 256.0) < 1e-3
    ring1 = rhead.loc[("B = 1, 8: ring step <= FlashInfer's ReplaySSM step, bf16 state", 1)]
    assert ring1["status"] == "missed" and abs(ring1["ratio"] - 47.0 / 33.5) < 1e-3
    assert set(rhead["status"]) <= {"met", "missed", "reported", "not measured"}


def test_step_targets_match_the_two_sides_ring_length_by_ring_length():
    """Each ring length both sides ran is a cell of its own: the ring at R = 32 is set against
    the peer at R = 32, not against the peer's faster R = 16 (a mismatched pair), every cell is
    judged and the worst is shown with its ring length."""
    import pandas as pd

    from pmll_lab.experiments import targets as T
    from pmll_lab.experiments.target_table import TARGETS

    times = {("ring", 16): 48.0, ("ring", 32): 44.0,
             ("flashinfer_replayssm", 16): 42.0, ("flashinfer_replayssm", 32): 50.0}
    rows = [dict(point_id=f"{B}-{R}", kernel=form, form=form, state_dtype="bfloat16", B=B, K=4,
                 ring_length=R, metric="step_us", value=us * B / 64, timer="cuda_graph",
                 status="ok")
            for (form, R), us in times.items() for B in (64, 128)]
    (target,) = [t for t in TARGETS
                 if t.text == "ring step <= 0.9x FlashInfer's ReplaySSM step, bf16 state"]
    head = T.headline(pd.DataFrame(rows), [target]).set_index("B")
    assert head.loc[64, "cells"] == 2 and head.loc[64, "met_cells"] == 1
    assert abs(head.loc[64, "ratio"] - 48.0 / 42.0) < 1e-3           # the worst: R = 16
    assert head.loc[64, "note"] == "worst at ring_length=16"
    assert head.loc[64, "status"] == "missed"


def test_a_form_without_a_ring_meets_the_ring_at_its_best_ring_length():
    """exact lazy (no ring; its rows carry the grid's ring length 16) against the ring run at
    16 and 32: the ring's fastest length counts, one cell, nothing left out."""
    import pandas as pd

    from pmll_lab.experiments import targets as T
    from pmll_lab.experiments.target_table import TARGETS

    times = {("exact_lazy", 16): 150.0, ("ring", 16): 48.0, ("ring", 32): 44.0}
    rows = [dict(point_id=f"{B}-{R}-{form}", kernel=form, form=form, state_dtype="bfloat16",
                 B=B, K=4, ring_length=R, metric="step_us", value=us * B / 64,
                 timer="cuda_graph", status="ok")
            for (form, R), us in times.items() for B in (64, 128)]
    (target,) = [t for t in TARGETS if t.text == "exact lazy step <= 2.5x the ring step, bf16 state"]
    head = T.headline(pd.DataFrame(rows), [target]).set_index("B")
    assert head.loc[64, "cells"] == 1 and abs(head.loc[64, "ratio"] - 150.0 / 44.0) < 1e-3


def test_drift_study_leaves_out_a_form_whose_available_raises_and_says_so():
    """A registered step form whose ``available`` raises (a broken install) is left out of the
    drift study with a warning naming it; the other forms' rows are those of a study without it."""
    from pmll_lab.harness.registry import Implementation
    from pmll_lab.step_drift import drift_study

    def broken():
        raise RuntimeError("libfoo.so: cannot open shared object file")

    kw = dict(batch=1, steps=2, rows=2, num_k_heads=1, num_v_heads=2, head_dim=16,
              checkpoints=1, ring_length=8)
    base = drift_study(forms=(("ring", torch.float32),), **kw)
    registry.register(Implementation(name="test_broken_step", family="gdn_step", label="x",
                                     provider="yours", impl="torch",
                                     build=registry.get("ring").build, available=broken),
                      replace=True)
    try:
        with pytest.warns(UserWarning, match="test_broken_step .*RuntimeError: libfoo.so"):
            both = drift_study(forms=(("ring", torch.float32),
                                      ("test_broken_step", torch.float32)), **kw)
    finally:
        registry.unregister("test_broken_step")
    assert set(both.form) == {"ring"} and len(base) == 3
    pd.testing.assert_frame_equal(both.reset_index(drop=True), base.reset_index(drop=True))


def test_drift_study_names_a_bad_alpha_and_raises_for_a_bad_forms_entry():
    """The caller's own errors are raised, not taken for a peer's: a non-numeric ``alpha``
    names it, and a state dtype that is no torch dtype in ``forms`` raises (no warning)."""
    from pmll_lab.step_drift import drift_study

    kw = dict(batch=1, steps=2, rows=2, num_k_heads=1, num_v_heads=2, head_dim=16,
              checkpoints=1, ring_length=8)
    for bad in ("x", None, [0.5], True):
        with pytest.raises(ValueError, match=r"^alpha: the per-draft acceptance probability"):
            drift_study(alpha=bad, forms=(("ring", torch.float32),), **kw)
    with pytest.raises(Exception) as info:
        drift_study(forms=(("ring", "float32"),), **kw)
    assert not isinstance(info.value, Warning)
