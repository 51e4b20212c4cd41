"""The GDN kernels that must agree bitwise reduce on decode's register layouts (sm_90 lowering).

The interpreter that runs the other tests has no layouts, so this test compiles the kernels for
an H100/H200 (``sm_90``) on the CPU, in a subprocess with ``PMLL_LAB_DEVICE=lower``, and compares
the layout of every ``tt.reduce`` (``pmll_lab.lowering``). The mutation case rebuilds the exact
carry kernel without its unspecialised row arguments, the version that the H200 caught differing
from decode in the last bits (2026-11-29), and requires the check to see it.
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = textwrap.dedent("""
    import json, sys
    import triton
    from pmll_lab.lowering import family_mismatches, gdn_exact_family
    from pmll_lab.ops.carry import gdn_carry as C
    CHAIN16 = dict(layout="kv", head_dim=16, state_type="bf16", input_type="fp32", rows=2)
    out = {}
    from pmll_lab.ops.gdn import decode as D
    names = set(C._ROW_PTRS + C._ROW_STRIDES)
    for kern in (C._gdn_carry_exact_kernel, C._gdn_carry_exact_split_kernel):
        assert names <= set(kern.arg_names), (kern.__name__, names - set(kern.arg_names))
    assert set(D._ROW_PTRS + D._ROW_STRIDES) <= set(D.gdn_rows_kernel.arg_names)
    for head_dim, input_type, rows in ((128, "bf16", 4), (64, "fp32", 1), (256, "bf16", 8)):
        fam = gdn_exact_family(head_dim=head_dim, input_type=input_type, rows=rows)
        out[f"{head_dim}-{input_type}-{rows}"] = {k: sorted(v) for k, v in fam.items()}
    # kd = 16 with a 2-byte state: every kernel's key sums must meet in a thread first
    for st in ("bf16", "fp16"):
        split = {}
        fam = gdn_exact_family(head_dim=16, input_type="bf16", rows=4, state_type=st,
                               lane_split=split, stage="ttgir")
        out[f"16-{st}"] = {"layouts": {k: sorted(v) for k, v in fam.items()}, "split": split}
    # mutation: the same without decode's state vector cap (the launch the H200 caught)
    from pmll_lab.ops.gdn import recurrence as R
    real_cap = R.kv_state_vector
    R.kv_state_vector = lambda *args: 0
    split = {}
    gdn_exact_family(head_dim=16, input_type="bf16", rows=4, state_type="bf16",
                     lane_split=split, stage="ttgir")
    out["16-bf16-uncapped"] = split
    R.kv_state_vector = real_cap
    # the chain with snapshots at kd = 16, bf16 state, fp32 inputs (the H200's 1-ulp outputs)
    out["16-bf16-chain"] = {"fixed": family_mismatches(CHAIN16)}
    # mutation: the snapshot store without decode's state vector cap
    real_row = D._chain_row
    mutant = triton.JITFunction(real_row.fn)
    src = mutant.src
    cap = "            if STATE_VEC > 0:"
    assert cap in src, "the snapshot cap moved: update the mutation"
    mutant._unsafe_update_src(src.replace(cap, "            if False:"))
    D._chain_row = mutant
    out["16-bf16-chain"]["uncapped"] = family_mismatches(CHAIN16)
    D._chain_row = real_row
    for head_dim, input_type, rows, batch in ((128, "bf16", 4, 64), (64, "fp32", 8, 1)):
        fam = gdn_exact_family(head_dim=head_dim, input_type=input_type, rows=rows,
                               layout="vk", batch=batch)
        out[f"vk-{head_dim}-{input_type}-{rows}-{batch}"] = {k: sorted(v) for k, v in fam.items()}
    # mutation: the V-major verify loading q/k without the alignment hint decode has
    fam = gdn_exact_family(head_dim=128, input_type="bf16", rows=4, layout="vk",
                           carry_constexprs={"QK_ALIGNED": False})
    out["vk-mutant"] = {k: sorted(v) for k, v in fam.items()}
    # mutation: the exact kernel specialised on every argument (no do_not_specialize lists)
    C._gdn_carry_exact_kernel = triton.JITFunction(C._gdn_carry_exact_kernel.fn)
    fam = gdn_exact_family(head_dim=128, input_type="bf16", rows=4)
    out["mutant"] = {k: sorted(v) for k, v in fam.items()}
    # the exact family's launch option: no multiply-add contracted by the compiler
    from pmll_lab.lowering import lower
    rows_t = {"q": "*bf16", "k": "*bf16", "v": "*bf16", "o": "*bf16", "g": "*fp32",
              "beta": "*fp32"}
    t = {"state": "*fp32", "inter": "*fp32", "slot_idx": "*i32", "out_idx": "*i32",
         "A_log": "*fp32", "dt_bias": "*fp32", "scale": "fp32", **rows_t}
    t = {p.name: t.get(p.name, "i32") for p in D.gdn_rows_kernel.params if not p.is_constexpr}
    out["fma"] = {}
    for fuse in (True, False):
        k = lower(D.gdn_rows_kernel, t, dict(KD=64, VD=64, K=2, BK=64, BV=64, HAS_IDX=True,
                  STORE_INTER=False, USE_QK_L2NORM=True, UNROLL=True, HAS_OUT_IDX=False,
                  GATE=False), values=dict(HV=32, GROUP=2), enable_fp_fusion=fuse)
        out["fma"][str(fuse)] = k.asm["ptx"].count("fma.rn.f32")
    json.dump(out, sys.stdout)
""")


def _lowered(script: str, *args: str) -> subprocess.CompletedProcess:
    """Run ``script`` (with ``args`` as ``sys.argv[1:]``) in a fresh Python with
    ``PMLL_LAB_DEVICE=lower`` (kernels compiled)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PMLL_LAB_DEVICE"] = "lower"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=1200)


@pytest.fixture(scope="module")
def lowered():
    run = _lowered(SCRIPT)
    assert run.returncode == 0, run.stderr[-4000:]
    import json
    return json.loads(run.stdout)


@pytest.mark.parametrize("case", ["128-bf16-4", "64-fp32-1", "256-bf16-8"])
def test_exact_family_reduces_on_decode_layouts(lowered, case):
    fam = lowered[case]
    decode = fam["gdn_rows_kernel"]
    # decode reduces on two layouts: the [BK] row vectors (l2norm, k.q) and the [BK, BV] block
    assert len(decode) == 2, decode
    shapes = sorted(s.split(",")[0].count("x") for s in decode)   # "128xf32", "128x32xf32"
    assert shapes == [1, 2], decode
    chain = ("gdn_rows_kernel[chain]",) if not case.endswith("-1") else ()
    assert ("gdn_rows_kernel[chain]" in fam) == bool(chain), sorted(fam)
    for name in chain + ("_gdn_carry_exact_kernel", "_gdn_carry_exact_split_kernel"):
        assert fam[name] == decode, (name, fam[name], decode)


@pytest.mark.parametrize("case", ["vk-128-bf16-4-64", "vk-64-fp32-8-1"])
def test_vk_family_reduces_on_decode_layouts(lowered, case):
    """The V-major exact verify (whose tile may hold more value rows than decode's:
    ``vk_tiles``) sums every row over keys on decode's thread layout."""
    fam = lowered[case]
    decode = fam["gdn_rows_vk_kernel"]
    assert decode, "decode lost its reductions"
    for name in ("gdn_rows_vk_kernel[chain]", "gdn_carry_exact_vk_kernel"):
        assert fam[name] == decode, (name, fam[name], decode)


@pytest.mark.parametrize("state", ["bf16", "fp16"])
def test_tiny_heads_sum_keys_alike_on_every_lane(lowered, state):
    """kd = 16 with a 2-byte state (a 16 x 16 block, 8 per thread): with decode's state
    vector cap every kernel holds two key rows per thread, so no FMA key sum starts across
    lanes (where lanes would round it differently and a stashed ``u`` would not replay the
    other lanes' rows), and the carry reduces on decode's layouts."""
    got = lowered[f"16-{state}"]
    assert got["split"] and not any(got["split"].values()), got["split"]
    decode = got["layouts"]["gdn_rows_kernel"]
    for name in ("gdn_rows_kernel[chain]", "_gdn_carry_exact_kernel",
                 "_gdn_carry_exact_split_kernel"):
        assert got["layouts"][name] == decode, (name, got["layouts"][name], decode)


def test_check_sees_lane_split_sums(lowered):
    """Without the cap (``kv_state_vector`` 0: the natural 16-byte vector) decode and both
    exact verify kernels start their key sums across lanes, and the check says so."""
    split = lowered["16-bf16-uncapped"]
    assert set(split) == {"gdn_rows_kernel", "gdn_rows_kernel[chain]",
                          "_gdn_carry_exact_kernel", "_gdn_carry_exact_split_kernel"}, split
    assert all(split.values()), split


def test_chain_with_snapshots_keeps_decode_layout_at_tiny_heads(lowered):
    """kd = 16, bf16 state, fp32 inputs, 2 rows with snapshots: the chain reduces on decode's
    layouts; with its snapshot store left at the natural 16-byte vector (8 columns, one key
    row per thread) Triton lays the whole block out for that store, and the check flags the
    chain (another layout, lane-split key sums) and nothing else."""
    got = lowered["16-bf16-chain"]
    assert got["fixed"] == {}, got["fixed"]
    bad = got["uncapped"]
    assert set(bad) == {"gdn_rows_kernel[chain]"}, bad
    assert any("lane-split" in x for x in bad["gdn_rows_kernel[chain]"]), bad
    assert any("sizePerThread = [1, 8]" in x and "lane-split" not in x
               for x in bad["gdn_rows_kernel[chain]"]), bad


def test_kv_state_vector_caps_only_the_one_key_row_blocks():
    from pmll_lab.ops.gdn.recurrence import kv_state_vector

    assert kv_state_vector(16, 16, 2) == 4            # 8 per thread, natural vector 8: capped
    assert [kv_state_vector(d, d, s) for d in (16, 32, 64, 128, 256) for s in (2, 4)
            if (d, s) != (16, 2)] == [0] * 9
    with pytest.raises(ValueError, match="state_itemsize"):
        kv_state_vector(16, 16, 8)


def test_exact_launch_leaves_only_the_written_fmas(lowered):
    """Compiled with ``EXACT_LAUNCH`` (no contraction), decode keeps the FMAs written out
    (``u``) and loses the ones the compiler would add (the sums' and ``o``'s multiply-adds)."""
    fma = lowered["fma"]
    assert 0 < fma["False"] < fma["True"], fma


def test_check_sees_an_unhinted_vk_kernel(lowered):
    fam = lowered["vk-mutant"]
    extra = set(fam["gdn_carry_exact_vk_kernel"]) - set(fam["gdn_rows_vk_kernel"])
    assert extra, "a V-major verify without the q/k hint must reduce on a layout decode does not use"


def test_check_sees_a_specialised_kernel(lowered):
    fam = lowered["mutant"]
    assert fam["_gdn_carry_exact_split_kernel"] == fam["gdn_rows_kernel"]
    extra = set(fam["_gdn_carry_exact_kernel"]) - set(fam["gdn_rows_kernel"])
    assert extra, "the specialised exact kernel must reduce on a layout decode does not use"


def test_lower_needs_compiled_kernels_and_every_argument():
    from pmll_lab import INTERPRET
    from pmll_lab.lowering import lower
    from pmll_lab.ops.gdn.decode import gdn_rows_kernel

    if INTERPRET:
        with pytest.raises(RuntimeError, match="PMLL_LAB_DEVICE=lower"):
            lower(gdn_rows_kernel, {}, {})
    else:   # compiled kernels (a GPU machine): lowering runs, and names what is missing
        with pytest.raises(ValueError, match="types: no Triton type for argument 'state'"):
            lower(gdn_rows_kernel, {}, {})


BAD_CALLS = textwrap.dedent("""
    import json, sys
    from pmll_lab.lowering import gdn_exact_family, lower
    from pmll_lab.ops.gdn.decode import gdn_rows_kernel
    out = {}
    for name, call in (
        ("type", lambda: lower(gdn_rows_kernel, {"state": "foo"}, {})),
        ("unaligned", lambda: lower(gdn_rows_kernel, {}, {}, unaligned=("no_such_arg",))),
        ("extra_type", lambda: lower(gdn_rows_kernel, {"KD": "i32"}, {})),
        ("rows", lambda: gdn_exact_family(rows=0)),
        ("heads", lambda: gdn_exact_family(heads=(16, 24))),
    ):
        try:
            call()
            out[name] = "no error"
        except ValueError as exc:
            out[name] = str(exc)
    json.dump(out, sys.stdout)
""")


def test_lowering_rejects_bad_arguments_naming_them():
    run = _lowered(BAD_CALLS)
    assert run.returncode == 0, run.stderr[-4000:]
    import json
    got = json.loads(run.stdout)
    assert got["type"].startswith("types: 'state' has type 'foo'"), got
    assert got["unaligned"].startswith("unaligned: ['no_such_arg']"), got
    assert got["extra_type"].startswith("types: ['KD']"), got
    assert got["rows"].startswith("rows: must lie in 1..8"), got
    assert got["heads"].startswith("heads: value heads 24"), got


COMPILE_ALL = textwrap.dedent("""
    from pmll_lab.lowering import lower
    from pmll_lab.ops.carry import gdn_carry as C
    rows = {"q": "*bf16", "k": "*bf16", "v": "*bf16", "o": "*bf16", "g": "*fp32", "beta": "*fp32"}
    types = {f"{n}_ptr": t for n, t in rows.items()} | {
        "state_ptr": "*fp32", "stash_ptr": "*fp32", "pend_ptr": "*i32", "slot_ptr": "*i32",
        "engaged_ptr": "*i32", "arrive_ptr": "*i32", "scale": "fp32", "state_off_ptr": "*i64",
        "stash_off_ptr": "*i64", "pend_off_ptr": "*i64", "acc_ptr": "*i32", "alog_ptr": "*fp32",
        "dtb_ptr": "*fp32", "A_log": "*fp32", "dt_bias": "*fp32", "a": "*bf16", "b": "*bf16",
        "g": "*fp32", "beta": "*fp32"}
    from pmll_lab.ops.carry import gdn_carry_vk as VK
    from pmll_lab.ops.gdn import gating as G
    meta = dict(K=4, CAP=8, HV=32, GROUP=2, KD=128, VD=128, BK=128, BV=32, NV=4, LAZY=True,
                USE_QK_L2NORM=True, BLOCK=128, PREFETCH=True, GATE=False, BH=32)
    vk = dict(BV=16, NV=8, NC=4, CW=32, STASH_AHEAD=4)
    for kern, extra, warps in (
            (C._gdn_carry_flush_kernel, {}, 1),
            (C._carry_accept_kernel, {}, 4),
            (VK.gdn_carry_flush_vk_kernel, vk, 1),
            (G._gdn_gating_kernel, {}, 1)):
        t = {p.name: types.get(p.name, "i32") for p in kern.params if not p.is_constexpr}
        m = {p.name: (extra | meta)[p.name] for p in kern.params if p.is_constexpr}
        ptx = lower(kern, t, m, num_warps=warps).asm["ptx"]
        assert ".target sm_90" in ptx, kern.__name__
        print(kern.__name__, "ok")
""")


def test_other_carry_kernels_compile_for_sm90():
    """The interpreter does not apply the GPU compiler's rules (tl.dot shapes and precisions,
    atomics, layouts): every carry kernel the bitwise check does not already lower is compiled
    for sm_90 here, so a kernel that only the GPU would reject fails in CI."""
    run = _lowered(COMPILE_ALL)
    assert run.returncode == 0, run.stderr[-4000:]
    assert run.stdout.split() == ["_gdn_carry_flush_kernel", "ok", "_carry_accept_kernel", "ok",
                                  "gdn_carry_flush_vk_kernel", "ok", "_gdn_gating_kernel", "ok"]



COMPILE_RING = textwrap.dedent("""
    import sys
    from pmll_lab.lowering import lower
    from pmll_lab.ops.carry.gdn_ring_fused import gdn_ring_fused_kernel
    from pmll_lab.ops.carry.gdn_ring_kernels import (SMALL_PRODUCTS, gdn_ring_flush_kernel,
                                                     ring_accept_kernel)
    ints = {"len_ptr", "base_ptr", "slot_ptr", "engaged_ptr", "acc_ptr"}
    def types(kern, state):
        t = {}
        for p in kern.params:
            if p.is_constexpr:
                continue
            n = p.name
            if n in ("state_ptr", "kr_ptr", "ur_ptr"):
                t[n] = state
            elif n in ints:
                t[n] = "*i32"
            elif n.endswith("_off"):
                t[n] = "*i64"
            elif n in ("q_ptr", "k_ptr", "v_ptr", "o_ptr"):
                t[n] = "*bf16"
            elif n.endswith("_ptr"):
                t[n] = "*fp32"
            else:
                t[n] = "fp32" if n == "scale" else "i32"
        return t
    shape = dict(K=4, R=16, NS=32, RW=16, RP=16, HV=32, HK=16, KD=128, KP=128, VD=128)
    for state, dtype, tile, early in (("*bf16", "bfloat16", (128, 64, 2, 2), True),
                                      ("*bf16", "bfloat16", (128, 64, 2, 2), False),
                                      ("*fp16", "float16", (128, 64, 2, 2), True),
                                      ("*fp32", "float32", (64, 32, 1, 3), False),
                                      ("*fp32", "float32", (128, 32, 2, 3), True)):
        BV, BK, warps, stages = tile
        meta = dict(shape, BK=BK, BV=BV, NT=128 // BV, STAGES=stages, USE_QK_L2NORM=True,
                    GATE=True, SMALL=SMALL_PRODUCTS[dtype], FBK=min(BK, 32), EARLY=early)
        for kern in (gdn_ring_fused_kernel, gdn_ring_flush_kernel):
            m = {p.name: meta[p.name] for p in kern.params if p.is_constexpr}
            ptx = lower(kern, types(kern, state), m, num_warps=warps).asm["ptx"]
            assert ".target sm_90" in ptx and "mma.sync" in ptx, (kern.__name__, dtype)
        print(dtype, "early" if early else "after", "ok")
    ptx = lower(ring_accept_kernel, types(ring_accept_kernel, "*fp32"), dict(NS=32, BLOCK=128),
                num_warps=4).asm["ptx"]
    print("ring_accept_kernel", "ok" if ".target sm_90" in ptx else "missing")
""")


def test_ring_form_kernels_compile_for_sm90():
    """The ring form's verify (the coefficients before the state product and after it, at each
    state dtype's operand precision), its flush and its commit compiled for sm_90: the
    interpreter does not apply the GPU compiler's rules for ``tl.dot`` shapes and precisions."""
    run = _lowered(COMPILE_RING)
    assert run.returncode == 0, run.stderr[-4000:]
    assert run.stdout.split() == ["bfloat16", "early", "ok", "bfloat16", "after", "ok", "float16",
                                  "early", "ok", "float32", "after", "ok", "float32", "early",
                                  "ok", "ring_accept_kernel", "ok"]

def test_reduction_layouts_reads_inline_and_aliased_layouts():
    """A reduce whose operand layout is written inline (a slice of an aliased parent) is read,
    its parent resolved; a module whose reduce cannot be parsed raises instead of dropping it."""
    from pmll_lab.lowering import reduction_layouts

    blocked = "#ttg.blocked<{sizePerThread = [1, 4], threadsPerWarp = [4, 8], warpsPerCTA = [1, 1], order = [1, 0]}>"
    text = "\n".join([
        f"#blocked = {blocked}",
        "module {",
        '    %a = "tt.reduce"(%x) <{axis = 0 : i32}> ({',
        "    ^bb0(%p: f32, %q: f32):",
        "      %s = arith.addf %p, %q : f32",
        "      tt.reduce.return %s : f32",
        "    }) : (tensor<128xf32, #ttg.slice<{dim = 1, parent = #blocked}>>) -> f32",
        '    %b = "tt.reduce"(%y) <{axis = 0 : i32}> ({',
        "    ^bb0(%p: f32, %q: f32):",
        "      tt.reduce.return %p : f32",
        "    }) : (tensor<128x32xf32, #blocked>) -> tensor<32xf32, #ttg.slice<{dim = 0, parent = #blocked}>>",
        "}",
    ])
    assert reduction_layouts(text) == [
        f"128xf32, #ttg.slice<{{dim = 1, parent = {blocked}}}>",
        f"128x32xf32, {blocked}",
    ]
    with pytest.raises(ValueError, match="unterminated tt.reduce"):
        reduction_layouts('%a = "tt.reduce"(%x) <{axis = 0 : i32}> ({\n  ^bb0:\n')


SASS = textwrap.dedent("""
    import json, sys
    from pmll_lab.lowering import lower, sass_stats
    from pmll_lab.ops.gdn import decode as D
    rows = {"q": "*bf16", "k": "*bf16", "v": "*bf16", "o": "*bf16", "g": "*fp32", "beta": "*fp32"}
    t = {"state": "*fp32", "inter": "*fp32", "slot_idx": "*i32", "out_idx": "*i32",
         "A_log": "*fp32", "dt_bias": "*fp32", "scale": "fp32", **rows}
    t = {p.name: t.get(p.name, "i32") for p in D.gdn_rows_kernel.params if not p.is_constexpr}
    out = {}
    for K in (1, 4):
        k = lower(D.gdn_rows_kernel, t, dict(KD=64, VD=64, K=K, BK=64, BV=64, HAS_IDX=True,
                  STORE_INTER=False, USE_QK_L2NORM=True, UNROLL=True, HAS_OUT_IDX=False,
                  GATE=False),
                  values=dict(HV=32, GROUP=2))
        out[K] = sass_stats(k)
    json.dump(out, sys.stdout)
""")


def test_sass_stats_counts_the_unrolled_rows():
    """Decode of K rows unrolls the shared row K times: the FP32 multiply-add count of the
    4-row kernel is 4x the 1-row one (within 2 %: shared prologue), registers in 1..255."""
    run = _lowered(SASS)
    assert run.returncode == 0, run.stderr[-4000:]
    import json
    got = json.loads(run.stdout)
    one, four = got["1"], got["4"]
    for st in (one, four):
        assert 0 < st["registers"] <= 255 and st["instructions"] > 100, st
    assert one["mix"]["FFMA"] > 100
    assert abs(four["mix"]["FFMA"] / one["mix"]["FFMA"] - 4) < 0.08, (one["mix"], four["mix"])
    assert four["instructions"] > 3 * one["instructions"]


def test_cli_without_lower_device_says_how_to_run_it():
    """``python -m pmll_lab.lowering`` with interpreted kernels (``PMLL_LAB_DEVICE=cpu``): exit 2
    and one line saying to set ``PMLL_LAB_DEVICE=lower`` without ``TRITON_INTERPRET``, no
    traceback."""
    env = dict(os.environ, PMLL_LAB_DEVICE="cpu",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    res = subprocess.run([sys.executable, "-m", "pmll_lab.lowering", "--rows", "2"],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert res.returncode == 2, (res.stdout, res.stderr)
    lines = [ln for ln in res.stderr.splitlines() if "PMLL_LAB_DEVICE" in ln]
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    assert "PMLL_LAB_DEVICE=lower" in lines[0] and "TRITON_INTERPRET" in lines[0]
    assert res.stdout == ""


def test_gdn_kernels_launch_without_contraction(monkeypatch):
    """Every GDN kernel (decode and the chain in both layouts, the exact verify in both,
    the flush, the gating) is launched with ``EXACT_LAUNCH``. Recorded at the launch (the
    interpreter ignores the option; on a GPU it selects the compiled variant)."""
    import torch

    from pmll_lab.backend import DEVICE
    from pmll_lab.carry import GdnCarry, gdn_carry_flush, gdn_carry_verify
    from pmll_lab.gdn import gdn_chain, gdn_decode, gdn_gating
    from pmll_lab.inputs import gdn_inputs
    from pmll_lab.ops.gdn.decode import gdn_rows_kernel

    seen = {}
    kind = type(gdn_rows_kernel)          # the interpreter's function, or Triton's JITFunction
    run = kind.run

    def record(self, *args, grid, warmup, **kwargs):
        seen.setdefault(self.fn.__name__, set()).add(kwargs.get("enable_fp_fusion", True))
        return run(self, *args, grid=grid, warmup=warmup, **kwargs)

    monkeypatch.setattr(kind, "run", record)
    x = gdn_inputs(3, 2, 1, 2, 16, 16, slots=3, dtype=torch.float32)
    r = gdn_inputs(4, 2, 1, 2, 16, 16, rows=2, slots=3, dtype=torch.float32)
    sl = x["state_indices"]
    gdn_decode(x["state"], x["q"], x["k"], x["v"], x["g"], x["beta"], state_indices=sl)
    gdn_chain(x["state"], r["q"], r["k"], r["v"], r["g"], r["beta"], state_indices=sl)
    gdn_gating(torch.zeros(2, device=DEVICE), r["g"], torch.zeros(2, device=DEVICE), r["beta"])
    vk_state = x["state"].transpose(-1, -2).contiguous()
    gdn_decode(vk_state, x["q"], x["k"], x["v"], x["g"], x["beta"], state_indices=sl,
               state_layout="vk")
    for layout in ("kv", "vk"):
        st = x["state"] if layout == "kv" else x["state"].transpose(-1, -2).contiguous()
        c = GdnCarry.empty(3, 2, 16, 16)
        gdn_carry_verify(st, c, r["q"], r["k"], r["v"], r["g"], r["beta"], slot_tab=sl,
                         form="exact", state_layout=layout)
        gdn_carry_flush([st], [c], sl, state_layout=layout)
    fused = {name for name, opts in seen.items() if True in opts}
    assert not fused, f"launched with contraction: {sorted(fused)}"
    assert {"gdn_rows_kernel", "gdn_rows_vk_kernel", "_gdn_gating_kernel",
            "gdn_carry_exact_vk_kernel", "gdn_carry_flush_vk_kernel",
            "_gdn_carry_flush_kernel"} <= set(seen), sorted(seen)
    assert set(seen) & {"_gdn_carry_exact_kernel", "_gdn_carry_exact_split_kernel"}, seen


def test_every_launch_case_reduces_on_decode_layouts():
    """Every head size (16 .. 256), layout, state dtype and tile the launch tables can pick
    (``lowering.launch_cases``: K-major per head size, V-major at one batch per row of
    ``VK_TILES`` x ``VK_AHEAD``), lowered to TTGIR in two processes: the exact family reduces
    on decode's layouts everywhere. Before the carry's state tile took decode's vector width
    (``STATE_VEC``), V-major kd = 16 with a bf16/fp16 state failed here past 128 work units."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PMLL_LAB_DEVICE"] = "lower"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    res = subprocess.run([sys.executable, "-m", "pmll_lab.lowering", "--all", "--jobs", "2"],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=1800)
    assert res.returncode == 0, (res.stdout[-4000:], res.stderr[-4000:])
    lines = res.stdout.splitlines()
    cases = [ln for ln in lines if ln.startswith("layout=")]
    assert all(ln.endswith("all as in decode") for ln in cases), cases
    for want in ("layout=kv", "layout=vk"):
        for d in (16, 32, 64, 128, 256):
            for t in ("fp32", "bf16", "fp16"):
                assert any(ln.startswith(f"{want} head_dim={d} state_type={t}") for ln in cases)
    assert lines[-1] == f"{len(cases)} of {len(cases)} launch cases reduce on decode's layouts"


CASES = textwrap.dedent("""
    import json, sys
    from pmll_lab import lowering as L
    from pmll_lab.ops import settings
    out = {"batches": L.table_batches(32), "batches64": L.table_batches(64),
           "cases": L.launch_cases()}
    tiles = settings.gdn().vk_tiles
    with settings.override(vk_tiles=tiles[:-1] + ((2048, 8, 8, 1),) + tiles[-1:]):
        out["batches_new_row"] = L.table_batches(32)
    case = dict(layout="vk", head_dim=16, state_type="bf16", batch=64)
    out["fixed"] = L.family_mismatches(case)
    fam = L.gdn_exact_family(**case, stage="ttgir", carry_constexprs={"STATE_VEC": 0})
    ref = fam["gdn_rows_vk_kernel"]
    out["unhinted"] = sorted(fam["gdn_carry_exact_vk_kernel"] - ref)
    json.dump(out, sys.stdout)
""")


def test_launch_cases_follow_the_tables_and_the_check_sees_the_small_head_carry():
    """The cases are read from the launch tables (a new table row adds a batch), and the check
    catches the carry that loads its kd = 16 bf16 tile at its own vector width
    (``STATE_VEC=0``: the kernel as it was), which the fixed launch does not."""
    run = _lowered(CASES)
    assert run.returncode == 0, run.stderr[-4000:]
    import json
    got = json.loads(run.stdout)
    assert got["batches"] == [1, 4, 8, 16, 17]       # 32, 128, 256, 512 work units, beyond
    assert got["batches64"] == [2, 4, 8, 9]          # no batch of 64 heads fits 32 units
    assert got["batches_new_row"] == [1, 4, 8, 16, 64, 65]
    cases = got["cases"]
    assert len(cases) == 5 * 3 + 5 * 3 * 5
    assert {(c["layout"], c["head_dim"], c["state_type"]) for c in cases} == {
        (lay, d, t) for lay in ("kv", "vk") for d in (16, 32, 64, 128, 256)
        for t in ("fp32", "bf16", "fp16")}
    assert got["fixed"] == {}
    assert got["unhinted"], "the carry at its own vector width must reduce on another layout"


def test_vk_state_vector_is_decodes_per_thread_width():
    """``vk_state_vector``: 16 bytes of state per thread, at most a key chunk, at most the
    decode tile's share of 32 threads; only 2- and 4-byte states."""
    from pmll_lab.ops.gdn.recurrence import vk_config, vk_state_vector

    assert vk_config(16, 16, 2048) == (16, 8, 1)
    assert vk_state_vector(16, 16, 2048, 2) == 4         # 8 x 16 keys / 32 threads
    assert vk_state_vector(16, 16, 2048, 4) == 4
    assert vk_state_vector(128, 128, 2048, 2) == 8       # a 16-byte vector of bf16
    assert vk_state_vector(128, 128, 2048, 4) == 4
    assert vk_state_vector(32, 32, 64, 2) == 8
    assert vk_state_vector(16, 4, 64, 4) == 2            # 4 value rows x 16 keys / 32
    for bad in (1, 8, 3):
        with pytest.raises(ValueError, match="state_itemsize"):
            vk_state_vector(16, 16, 64, bad)


ROUNDING = textwrap.dedent("""
    import json, sys
    import triton.language as tl
    from pmll_lab.lowering import gdn_exact_family
    from pmll_lab.ops.gdn import recurrence as R
    if sys.argv[1] == "unpaired":   # mutation, before anything compiles: one conversion per element
        R.PAIRED_ROUNDING = tl.constexpr(False)
    out = {}
    for st in sys.argv[2:]:
        res = {}
        gdn_exact_family(layout="vk", state_type=st, gate=True, batch=64, resources=res)
        out[st] = {name: r["mix"] for name, r in res.items()}
    json.dump(out, sys.stdout)
""")


def test_two_byte_states_round_two_values_per_conversion():
    """The chain and the exact carry verify round a bf16 / fp16 state after every row; on sm_90
    that is paired conversions (``F2FP``) and no one-element ``F2F`` in the verify, the chain
    and decode (``recurrence.round_like``). The check sees the one-per-element version."""
    import json

    got = {}
    for mode, states in (("paired", ["bf16", "fp16"]), ("unpaired", ["bf16"])):
        run = _lowered(ROUNDING, mode, *states)
        assert run.returncode == 0, run.stderr[-4000:]
        got[mode] = json.loads(run.stdout)
    verify, chain = "gdn_carry_exact_vk_kernel", "gdn_rows_vk_kernel[chain]"
    for st in ("bf16", "fp16"):
        mix = got["paired"][st]
        assert mix[verify].get("F2F", 0) == 0, (st, mix[verify])
        assert mix[verify].get("F2FP", 0) >= 64, (st, mix[verify])
        assert mix[chain].get("F2F", 0) <= 4, (st, mix[chain])      # the gate's scalars only
    unpaired = got["unpaired"]["bf16"][verify]
    assert unpaired.get("F2F", 0) >= 256, unpaired
