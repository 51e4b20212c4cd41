"""SGLang's GDN speculative-verify kernels as peers (pmll_lab.peers_sglang, harness.step_sglang,
experiments.sglang_exactness), on the CPU through the Triton interpreter.

Without SGLang (CI): the "not installed" path (status line, ``RuntimeError`` from the
builders, no drift rows, an ``unavailable`` exactness record), the loader on a directory of
stand-in module files (the device-query stand-ins they see, ``sys.modules`` restored), the
interpreter's tensor loop variables, ``supports`` and the byte formulas against real buffers.
With SGLang (``pip install --no-deps sglang==0.5.23``, or ``scripts/fetch-sglang.sh``): its
kernels run here; each form's accepted outputs and effective states against float64 decoding
(``harness.step.check``'s tolerances: 8e-3 with an fp32 pool, 2e-2 with bf16), its ring's
cursors against SGLang's protocol modelled in Python, its bitwise claim on the interpreter, and
the drift study with its forms.
"""

from __future__ import annotations

import sys

import pytest
import torch

import pmll_lab  # noqa: F401, I001  (first: picks GPU or the Triton interpreter)
import triton
import triton.language as tl
from pmll_lab import peers_sglang as PS
from pmll_lab import sizes
from pmll_lab.harness import step_sglang
from pmll_lab.backend import DEVICE, INTERPRET
from pmll_lab.experiments import sglang_exactness as SX
from pmll_lab.harness import step as H
from pmll_lab.harness.step import StepCase


def check_form(sf, ref_seqs):
    """The runner's step check of ``sf`` (``harness.step.check``), flattened."""
    r = H.check(sf, sf.case, ref_seqs=ref_seqs)
    return dict(passed=r["passed"], o_rel_l2=r["errors"]["o"], state_rel_l2=r["errors"]["state"],
                **r["facts"])

pytestmark = pytest.mark.filterwarnings(      # the interpreter's range over a tensor bound
    "ignore:Conversion of an array with ndim > 0 to a scalar:DeprecationWarning")
NEEDS_SGLANG = pytest.mark.skipif(
    not PS.sglang_available(),
    reason="SGLang not installed (pip install --no-deps sglang==0.5.23, or "
           "scripts/fetch-sglang.sh); test_not_installed_path checks this case")


@pytest.fixture
def fresh_loader():
    """The loader's cache cleared before and after (the test changes where it looks)."""
    PS.load_kernels.cache_clear()
    yield
    PS.load_kernels.cache_clear()


def _case(state_dtype=torch.float32, **kw):
    kw = dict(dict(batch=2, rows=4, num_k_heads=1, num_v_heads=2, head_dim=32, steps=6,
                   ring_length=16, seed=5), **kw)
    return StepCase(state_dtype=state_dtype, **kw)


def _nowhere(monkeypatch, tmp_path):
    monkeypatch.delenv(PS.SGLANG_DIR_ENV, raising=False)
    monkeypatch.setattr(PS, "PROJECT_DIR", tmp_path / "none")

    def no_dist(name):
        raise PS.importlib.metadata.PackageNotFoundError(name)
    monkeypatch.setattr(PS.importlib.metadata, "distribution", no_dist)


def test_not_installed_path(monkeypatch, tmp_path, fresh_loader):
    _nowhere(monkeypatch, tmp_path)
    assert PS.sglang_status() == "SGLang: not installed"
    assert not PS.sglang_available() and PS.sglang_version() == ""
    assert not step_sglang.available() and step_sglang.peer_version() == ""
    with pytest.raises(RuntimeError, match=r"not installed \(pip install --no-deps sglang==0.5.23"):
        step_sglang.build_form("sglang_replayssm", _case())
    rec = SX.run_config(SX.configs((16,), ("float32",), ("bfloat16",), (2,))[0], B=2, steps=1)
    assert rec["status"] == "unavailable" and rec["bitwise"] is False
    from pmll_lab.experiments.targets import about
    assert "SGLang: not installed" in about(peers=True)
    from pmll_lab.step_drift import drift_study
    df = drift_study(batch=1, steps=2, rows=2, num_k_heads=1, num_v_heads=2, head_dim=16,
                     checkpoints=1, forms=(("sglang_exact_fold", torch.float32),
                                           ("ring", torch.float32)))
    assert set(df.form) == {"ring"}


FAKE = '''
import sys
from sglang.srt.utils import (get_device_sm, is_cuda, is_gfx95_supported, is_hip,
                              is_sm90_supported)
from sglang.kernels.jit.utils import is_arch_support_pdl
from sglang.kernels.ops.attention.fla.utils import is_tf32_supported
SEEN = dict(cuda=is_cuda(), hip=is_hip(), gfx95=is_gfx95_supported(), sm=get_device_sm(),
            sm90=is_sm90_supported(), pdl=is_arch_support_pdl(), tf32=is_tf32_supported)
PRESENT = sorted(n for n in sys.modules if n.split(".")[0] == "sglang")
'''


def test_loader_from_a_directory_with_stand_ins(monkeypatch, tmp_path, fresh_loader):
    """The three files load from PMLL_LAB_SGLANG_DIR with the stand-ins in sys.modules during
    the import only; whatever held those names before is back afterwards."""
    for name in PS.KERNEL_FILES.values():
        (tmp_path / name).write_text(FAKE)
    (tmp_path / "VERSION").write_text("9.9.9\n")
    monkeypatch.setenv(PS.SGLANG_DIR_ENV, str(tmp_path))
    sentinel = object()
    monkeypatch.setitem(sys.modules, "sglang", sentinel)
    k = PS.sglang_kernels()
    assert k is not None and k.version == "9.9.9" and PS.sglang_status() == "SGLang 9.9.9"
    gpu = DEVICE.type == "cuda" and not INTERPRET
    want = {n: f() if callable(f) else f for mod in PS.stand_ins().values()
            for n, f in mod.items()}
    assert want["is_cuda"] is gpu and (gpu or want["get_device_sm"] == 0)
    for mod in (k.recurrent, k.fold, k.spec):
        assert mod.SEEN == dict(cuda=want["is_cuda"], hip=want["is_hip"],
                                gfx95=want["is_gfx95_supported"], sm=want["get_device_sm"],
                                sm90=want["is_sm90_supported"], pdl=want["is_arch_support_pdl"],
                                tf32=want["is_tf32_supported"])
        assert "sglang.srt.utils" in mod.PRESENT and "sglang.kernels.jit.utils" in mod.PRESENT
    assert sys.modules["sglang"] is sentinel
    assert not [n for n in sys.modules if n.startswith("sglang.")]


def test_loader_reports_a_broken_directory(monkeypatch, tmp_path, fresh_loader):
    monkeypatch.setenv(PS.SGLANG_DIR_ENV, str(tmp_path))
    assert PS.sglang_status() == (f"SGLang: {PS.SGLANG_DIR_ENV}={tmp_path} lacks "
                                  + ", ".join(PS.KERNEL_FILES.values()))
    PS.load_kernels.cache_clear()
    for name in PS.KERNEL_FILES.values():
        (tmp_path / name).write_text("from sglang.srt.utils import is_not_there\n")
    status = PS.sglang_status()
    assert status.startswith("SGLang unknown: its kernel modules do not import (ImportError")
    assert "is_not_there" in status and not PS.sglang_available()
    assert not [n for n in sys.modules if n == "sglang" or n.startswith("sglang.")]


@triton.jit
def _loop_var_plain(out_ptr, n):
    acc = tl.zeros((1,), dtype=tl.int64)
    for t in range(0, n):
        acc += t.to(tl.int64) * 3
    tl.store(out_ptr + tl.arange(0, 1), acc)


@triton.jit
def _loop_var_fixed(out_ptr, n):
    acc = tl.zeros((1,), dtype=tl.int64)
    for t in range(0, n):
        acc += t.to(tl.int64) * 3
    tl.store(out_ptr + tl.arange(0, 1), acc)


@pytest.mark.skipif(not INTERPRET, reason="compiled Triton's loop variables are tensors already")
def test_interpreter_loop_variables_are_tensors_where_asked():
    from pmll_lab._interpreter import tensor_loop_variables

    out = torch.zeros(1, dtype=torch.int64)
    n = torch.tensor(5, dtype=torch.int32).item()
    with pytest.raises(Exception, match="'int' object has no attribute 'to'"):
        _loop_var_plain[(1,)](out, n)
    tensor_loop_variables(_loop_var_fixed)
    tensor_loop_variables(_loop_var_fixed)                     # idempotent
    _loop_var_fixed[(1,)](out, n)
    assert int(out[0]) == 3 * (0 + 1 + 2 + 3 + 4)
    with pytest.raises(ValueError, match="fn: .*already"):
        tensor_loop_variables(_loop_var_plain)
    with pytest.raises(ValueError, match="fn: expected an interpreted Triton kernel"):
        tensor_loop_variables(len)


def test_supports():
    f32, bf16, f16 = torch.float32, torch.bfloat16, torch.float16
    assert PS.exact_fold_supports(16, 2, bf16, f32) and PS.exact_fold_supports(100, 8, f32, bf16)
    assert not PS.exact_fold_supports(128, 4, bf16, f16)          # fp16 pool: not checked here
    assert PS.ring_supports(128, 4, bf16, f32, 16) and PS.ring_supports(32, 8, bf16, bf16, 16)
    assert PS.ring_supports(64, 16, f16, f32, 32)
    for bad in ((16, 4, bf16, f32, 16), (96, 4, bf16, f32, 16), (128, 9, bf16, f32, 16),
                (128, 4, bf16, f32, 8), (128, 4, bf16, f32, 24), (128, 4, bf16, f16, 16)):
        assert not PS.ring_supports(*bad), bad
    c = _case()
    assert step_sglang.supports("sglang_replayssm", c)
    assert not step_sglang.supports("sglang_replayssm", _case(head_dim=16))
    assert step_sglang.supports("sglang_exact_fold", _case(head_dim=16))
    assert step_sglang.unsupported("sglang_replayssm", c) is None
    assert step_sglang.unsupported("sglang_replayssm", _case(head_dim=16)).startswith(
        "head size 16, K = ")
    assert "a head size a power of two >= 32" in step_sglang.unsupported(
        "sglang_replayssm", _case(head_dim=16))
    with pytest.raises(ValueError, match="form: must be one of"):
        step_sglang.supports("sglang", c)
    with pytest.raises(ValueError, match="form: sglang_replayssm does not take this case"):
        step_sglang.build_form("sglang_replayssm", _case(head_dim=16))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_bytes_held_are_the_buffers_bytes(dtype):
    HK, HV, kd, vd, K, L = 2, 4, 32, 64, 3, 16
    w = PS.SglangFoldWindow.empty(5, HK, HV, kd, vd, K, dtype, device="cpu")
    assert w.bytes_per_slot == sizes.sglang_fold_bytes_per_seq(K, HK, HV, kd, vd, dtype)
    es = torch.finfo(dtype).bits // 8
    assert w.bytes_per_slot == K * ((HK * kd + HV * vd) * es + 8 * HV)
    for layout in sizes.SGLANG_RING_LAYOUTS:
        r = PS.SglangRing.empty(3, HK, HV, kd, vd, L, dtype, layout=layout, device="cpu")
        assert r.bytes_per_slot == sizes.sglang_ring_bytes_per_seq(L, HK, HV, kd, vd, dtype,
                                                                   layout)
        pieces = (1 if dtype == torch.float32 and layout == "compact" else 2)
        extra = 4 * HV if layout == "raw" else 0
        assert r.bytes_per_slot == L * ((HK * kd + HV * vd) * es * pieces + 4 * HV + extra) + 9
    with pytest.raises(ValueError, match="layout"):
        PS.SglangRing.empty(1, 1, 1, 32, 32, 16, dtype, layout="packed", device="cpu")


def test_step_bytes_formulas():
    HK, HV, d, K = 1, 2, 32, 4
    hb32 = HV * d * d * 4
    io = (2 * HK * d + HV * d + 2 * HV) * 2 + HV * d * 2
    fold_row = (HK * d + HV * d) * 2 + 8 * HV
    assert sizes.sglang_fold_step_bytes(K, 2.5, HK, HV, d, d) == int(
        3 * hb32 + fold_row * 6.5 + K * io)
    hist = (HK * d + HV * d) * 2 + 4 * HV
    row = hist + (HK * d + HV * d) * 2
    assert sizes.sglang_ring_step_bytes(K, 0.25, 3.0, 2.5, HK, HV, d, d) == int(
        hb32 * 1.5 + hist * 3 + row * K + row * 2.5 + K * io)
    raw_row = row + 4 * HV
    assert sizes.sglang_ring_step_bytes(K, 0.25, 3.0, 2.5, HK, HV, d, d, layout="raw") == int(
        hb32 * 1.5 + hist * 3 + raw_row * K + fold_row * 2.5 + K * io)
    case = _case()
    fb = step_sglang.step_bytes("sglang_exact_fold", case, 1.0, 0.0)
    acc = float(case.tensors["accepted"].float().mean())
    assert fb == sizes.sglang_fold_step_bytes(K, acc, HK, HV, d, d, torch.bfloat16,
                                              torch.float32)
    assert step_sglang.bytes_held("sglang_replayssm", case) == 16 * row + 9
    for kw, name in ((dict(fold_frac=1.5), "fold_frac"), (dict(mean_fill=-1.0), "mean_fill"),
                     (dict(mean_accept=5.0), "mean_accept"), (dict(layout="x"), "layout")):
        args = dict(rows=K, fold_frac=0.5, mean_fill=1.0, mean_accept=2.0, num_k_heads=HK,
                    num_v_heads=HV, k_dim=d, v_dim=d)
        with pytest.raises(ValueError, match=name):
            sizes.sglang_ring_step_bytes(**dict(args, **kw))


@NEEDS_SGLANG
def test_installed_version_and_status():
    assert PS.sglang_version() == PS.SGLANG_VERSION
    assert PS.sglang_status() == f"SGLang {PS.SGLANG_VERSION}"
    assert step_sglang.peer_version() == PS.SGLANG_VERSION


FORM_CASES = [("sglang_exact_fold", torch.float32, 16), ("sglang_exact_fold", torch.bfloat16, 16),
              ("sglang_replayssm", torch.float32, 16), ("sglang_replayssm", torch.bfloat16, 16),
              ("sglang_replayssm", torch.float32, 32),
              ("sglang_replayssm_rawfold", torch.float32, 16),
              ("sglang_replayssm_rawfold", torch.bfloat16, 16)]


@NEEDS_SGLANG
@pytest.mark.parametrize("form,state_dtype,length", FORM_CASES,
                         ids=[f"{f}-{str(d)[6:]}-L{n}" for f, d, n in FORM_CASES])
def test_forms_match_plain_decoding(form, state_dtype, length):
    r = check_form(step_sglang.build_form(form, _case(state_dtype, ring_length=length)),
                   ref_seqs=2)
    assert r["passed"], r
    if form == "sglang_exact_fold":
        assert r["fold_frac"] == 1.0 and r["mean_fill"] == 0.0
        if state_dtype == torch.float32:
            assert r["state_rel_l2"] < 1e-6, r                  # the accepted rows replayed
    elif length == 16 and state_dtype == torch.float32:
        assert 0 < r["fold_frac"] < 1 and r["mean_fill"] > 0, r  # a window folded on the way
        assert r["state_rel_l2"] < 2e-4, r
    elif form == "sglang_replayssm":
        want = 1.0 if state_dtype == torch.bfloat16 else 0.0   # bf16: fold every commit
        assert r["fold_frac"] == want, r


@NEEDS_SGLANG
@pytest.mark.parametrize("form", ["sglang_replayssm", "sglang_replayssm_rawfold"])
def test_ring_cursors_follow_sglang_protocol(form):
    """The device cursors after each step equal SGLang's rules run in Python: advance
    ``wp += a``, flag ``wp + 2K > L``; the compact ring folds and resets the flagged requests
    in the same commit, the raw ring at the next verify (its window restarting past the old
    one)."""
    case = _case(steps=8)
    sf = step_sglang.build_form(form, case)
    K, L = case.rows, case.ring_length
    wp, base, flag = [0] * case.batch, [0] * case.batch, [0] * case.batch
    acc = case.tensors["accepted"].cpu().tolist()
    folds = 0
    for i in range(case.steps):
        sf.step(i, collect=True)
        for b in range(case.batch):
            a = acc[i][b]
            if form == "sglang_replayssm":
                wp[b] += a
                if wp[b] + 2 * K > L:
                    base[b], wp[b], folds = (base[b] + wp[b]) % L, 0, folds + 1
                flag[b] = 0
            else:
                if flag[b]:
                    base[b], wp[b], folds = (base[b] + wp[b]) % L, a, folds + 1
                else:
                    wp[b] += a
                flag[b] = int(wp[b] + 2 * K > L)
        got = _cursors(sf)
        assert got == (wp, base, flag), (i, got, (wp, base, flag))
    assert folds > 0


def _cursors(sf):
    r = sf.ring
    return tuple(t.cpu().tolist() for t in (r.write_pos, r.cache_base, r.is_flush))


@NEEDS_SGLANG
@pytest.mark.skipif(not INTERPRET, reason="the GPU's answer is the grid's record "
                    "(python -m pmll_lab.experiments.sglang_exactness)")
def test_bitwise_claim_on_the_interpreter():
    """On the interpreter: with an fp32 pool and q/k normalisation off the fold equals the
    decode bit for bit; with it on (as SGLang runs) the fold's division-form norm and the
    decode's reciprocal-multiply differ in the last bits (numpy divides exactly); a bf16 pool is
    rounded once per commit instead of per token, a bf16 ulp apart."""
    cfg = dict(kd=16, layout="vk", state_dtype="float32", input_dtype="float32", K=3)
    off = SX.run_config(cfg, B=3, steps=3, use_qk_l2norm=False)
    assert off["status"] == "bitwise" and off["rows_compared"] > 6, off
    on = SX.run_config(cfg, B=3, steps=3)
    assert on["status"] == "differs" and 0 < on["max_abs_state_diff"] < 1e-6, on
    bf = SX.run_config(dict(cfg, state_dtype="bfloat16", input_dtype="bfloat16"), B=3, steps=3)
    assert bf["status"] == "differs" and bf["states_differing"] == 3, bf
    assert 0 < bf["max_abs_state_diff"] <= 2 ** -8, bf        # one bf16 ulp below 1
    assert bf["peer_version"] == PS.SGLANG_VERSION


@NEEDS_SGLANG
def test_drift_study_with_sglang_forms_leaves_the_others_alone():
    from pmll_lab.step_drift import drift_study

    kw = dict(batch=1, steps=3, rows=3, num_k_heads=1, num_v_heads=2, head_dim=32,
              checkpoints=1, ring_length=16)
    base = drift_study(forms=(("ring", torch.float32),), **kw)
    both = drift_study(forms=(("ring", torch.float32), ("sglang_replayssm", torch.float32),
                              ("sglang_exact_fold", torch.bfloat16)), **kw)
    mine = both[both.form == "ring"].reset_index(drop=True)
    assert mine.equals(base.reset_index(drop=True))
    s = both[both.form.str.startswith("sglang")]
    assert set(zip(s.form, s.state_dtype)) == {("sglang_replayssm", "float32"),
                                               ("sglang_exact_fold", "bfloat16")}
    assert len(s[s.metric == "state_rel_l2"]) == 2 and len(s[s.metric == "o_rel_l2"]) == 6
    assert s.value.between(0, 2e-2).all(), s
