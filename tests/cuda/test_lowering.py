"""The GDN kernels that must agree bitwise reduce on decode's register layouts (sm_90 lowering).

The interpreter that runs the other tests has no layouts, so this test compiles the kernels for
an H100/H200 (``sm_90``) on the CPU, in a subprocess with ``PMLL_LAB_DEVICE=lower``, and compares
the layout of every ``tt.reduce`` (``pmll_lab.lowering``). The mutation case rebuilds the exact
carry kernel without its unspecialised row arguments, the version that the H200 caught differing
from decode in the last bits (2026-11-29), and requires the check to see it.
"""

import json
import subprocess
import sys
import textwrap

import pytest

from _lowering_helpers import ROOT, lower_env, run_lowered


SCRIPT = textwrap.dedent("""
    import json, sys
    import triton
    from pmll_lab.lowering import family_mismatches, gdn_exact_family
    from pmll_lab.ops.carry import exact_kernels as C
    from pmll_lab.ops.carry.exact_kernels import gdn_carry_exact_vk_kernel
    CHAIN16 = dict(layout="kv", head_dim=16, state_type="bf16", input_type="fp32", rows=2)
    out = {}
    from pmll_lab.ops.gdn import decode as D
    from pmll_lab.ops.gdn.decode_vk import ROW_PTRS, ROW_STRIDES, gdn_rows_vk_kernel
    names = set(C.ROW_PTRS + C.ROW_STRIDES)
    for kern in (C.gdn_carry_exact_kernel, C.gdn_carry_exact_split_kernel,
                 gdn_carry_exact_vk_kernel):
        assert names <= set(kern.arg_names), (kern.__name__, names - set(kern.arg_names))
    for kern in (D.gdn_rows_kernel, gdn_rows_vk_kernel):
        assert set(ROW_PTRS + ROW_STRIDES) <= set(kern.arg_names), kern.__name__
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
    real_row = D.chain_row
    mutant = triton.JITFunction(real_row.fn)
    src = mutant.src
    cap = "            if STATE_VEC > 0:"
    assert cap in src, "the snapshot cap moved: update the mutation"
    mutant._unsafe_update_src(src.replace(cap, "            if False:"))
    D.chain_row = mutant
    out["16-bf16-chain"]["uncapped"] = family_mismatches(CHAIN16)
    D.chain_row = real_row
    for head_dim, input_type, rows, batch in ((128, "bf16", 4, 64), (64, "fp32", 8, 1)):
        fam = gdn_exact_family(head_dim=head_dim, input_type=input_type, rows=rows,
                               layout="vk", batch=batch)
        out[f"vk-{head_dim}-{input_type}-{rows}-{batch}"] = {k: sorted(v) for k, v in fam.items()}
    # the speculative store (the full-acceptance state to a spare slot), fp32 and bf16 pools
    for st in ("fp32", "bf16"):
        fam = gdn_exact_family(head_dim=128, input_type="bf16", rows=4, layout="vk",
                               state_type=st, carry_constexprs={"SPEC_STORE": True})
        out[f"vk-spec-{st}"] = {k: sorted(v) for k, v in fam.items()}
    # mutation: the V-major verify loading q/k without the alignment hint decode has
    fam = gdn_exact_family(head_dim=128, input_type="bf16", rows=4, layout="vk",
                           carry_constexprs={"QK_ALIGNED": False})
    out["vk-mutant"] = {k: sorted(v) for k, v in fam.items()}
    # mutation: the exact kernel specialised on every argument (no do_not_specialize lists)
    C.gdn_carry_exact_kernel = triton.JITFunction(C.gdn_carry_exact_kernel.fn)
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


@pytest.fixture(scope="module")
def lowered():
    run = run_lowered(SCRIPT)
    assert run.returncode == 0, run.stderr[-4000:]
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
    for name in chain + ("gdn_carry_exact_kernel", "gdn_carry_exact_split_kernel"):
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


@pytest.mark.parametrize("state", ["fp32", "bf16"])
def test_speculative_store_keeps_decode_layouts(lowered, state):
    """The V-major verify with ``SPEC_STORE`` (one more store of the tile after its rows) sums
    on decode's layouts and compiles for sm_90 (ptxas), fp32 and bf16 pools."""
    fam = lowered[f"vk-spec-{state}"]
    decode = fam["gdn_rows_vk_kernel"]
    assert decode and fam["gdn_carry_exact_vk_kernel"] == decode, fam


@pytest.mark.parametrize("state", ["bf16", "fp16"])
def test_tiny_heads_sum_keys_alike_on_every_lane(lowered, state):
    """kd = 16 with a 2-byte state (a 16 x 16 block, 8 per thread): with decode's state
    vector cap every kernel holds two key rows per thread, so no FMA key sum starts across
    lanes (where lanes would round it differently and a stashed ``u`` would not replay the
    other lanes' rows), and the carry reduces on decode's layouts."""
    got = lowered[f"16-{state}"]
    assert got["split"] and not any(got["split"].values()), got["split"]
    decode = got["layouts"]["gdn_rows_kernel"]
    for name in ("gdn_rows_kernel[chain]", "gdn_carry_exact_kernel",
                 "gdn_carry_exact_split_kernel"):
        assert got["layouts"][name] == decode, (name, got["layouts"][name], decode)


def test_check_sees_lane_split_sums(lowered):
    """Without the cap (``kv_state_vector`` 0: the natural 16-byte vector) decode and both
    exact verify kernels start their key sums across lanes, and the check says so."""
    split = lowered["16-bf16-uncapped"]
    assert set(split) == {"gdn_rows_kernel", "gdn_rows_kernel[chain]",
                          "gdn_carry_exact_kernel", "gdn_carry_exact_split_kernel"}, split
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
    assert fam["gdn_carry_exact_split_kernel"] == fam["gdn_rows_kernel"]
    extra = set(fam["gdn_carry_exact_kernel"]) - set(fam["gdn_rows_kernel"])
    assert extra, "the specialised exact kernel must reduce on a layout decode does not use"


def test_every_launch_case_reduces_on_decode_layouts():
    """Every head size (16 .. 256), layout, state dtype and tile the launch tables can pick
    (``lowering.launch_cases``: K-major per head size, V-major at one batch per row of
    ``VK_TILES`` x ``VK_AHEAD``), lowered to TTGIR in two processes: the exact family reduces
    on decode's layouts everywhere. Before the carry's state tile took decode's vector width
    (``STATE_VEC``), V-major kd = 16 with a bf16/fp16 state failed here past 128 work units."""
    env = lower_env()
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
    run = run_lowered(CASES)
    assert run.returncode == 0, run.stderr[-4000:]
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
    decode tile's share of 32 threads; only the states of ``settings.STATE_DTYPES`` (a float8,
    float64 or integer state is refused, naming ``state_dtype``)."""
    import torch

    from pmll_lab.ops.gdn.recurrence import vk_config, vk_state_vector


    bf16, fp32 = torch.bfloat16, torch.float32
    assert vk_config(16, 16, 2048, state_dtype=fp32) == (16, 8, 1)
    assert vk_state_vector(16, 16, 2048, bf16) == 4      # 8 x 16 keys / 32 threads
    assert vk_state_vector(16, 16, 2048, fp32) == 4
    assert vk_state_vector(128, 128, 2048, bf16) == 8    # a 16-byte vector of bf16
    assert vk_state_vector(128, 128, 2048, "float16") == 8
    assert vk_state_vector(128, 128, 2048, fp32) == 4
    assert vk_state_vector(32, 32, 64, bf16) == 8
    assert vk_state_vector(16, 4, 64, fp32) == 2         # 4 value rows x 16 keys / 32
    for bad in ("float8_e4m3fn", torch.float64, torch.int8):
        with pytest.raises(ValueError, match="^state_dtype: "):
            vk_state_vector(16, 16, 64, bad)
