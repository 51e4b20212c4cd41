"""Kernels compiled for sm_90 on the CPU: what the interpreter cannot check.

The interpreter ignores the GPU compiler's rules (``tl.dot`` shapes and precisions, atomics,
launch options). These tests compile every carry and ring-form kernel for an H100/H200
(``sm_90``), count instructions in the SASS (unrolled rows, paired conversions of a 2-byte
state) and record that every GDN kernel launches without FMA contraction
(``recurrence.EXACT_LAUNCH``). The bitwise layout check is ``test_lowering.py``.
"""

import json
import textwrap

from _lowering_helpers import run_lowered


COMPILE_ALL = textwrap.dedent("""
    from pmll_lab.lowering import lower
    from pmll_lab.ops.carry.exact_kernels import gdn_carry_flush_kernel, gdn_carry_flush_vk_kernel
    from pmll_lab.ops.carry.stash import carry_accept_kernel
    rows = {"q": "*bf16", "k": "*bf16", "v": "*bf16", "o": "*bf16", "g": "*fp32", "beta": "*fp32"}
    types = {f"{n}_ptr": t for n, t in rows.items()} | {
        "state_ptr": "*fp32", "stash_ptr": "*fp32", "pend_ptr": "*i32", "slot_ptr": "*i32",
        "engaged_ptr": "*i32", "arrive_ptr": "*i32", "scale": "fp32", "state_off_ptr": "*i64",
        "stash_off_ptr": "*i64", "pend_off_ptr": "*i64", "acc_ptr": "*i32", "alog_ptr": "*fp32",
        "dtb_ptr": "*fp32", "A_log": "*fp32", "dt_bias": "*fp32", "a": "*bf16", "b": "*bf16",
        "g": "*fp32", "beta": "*fp32"}
    from pmll_lab.ops.gdn import gating as G
    meta = dict(K=4, CAP=8, HV=32, GROUP=2, KD=128, VD=128, BK=128, BV=32, NV=4, LAZY=True,
                USE_QK_L2NORM=True, BLOCK=128, PREFETCH=True, GATE=False, BH=32)
    vk = dict(BV=16, NV=8, NC=4, CW=32, STASH_AHEAD=4)
    for kern, extra, warps in (
            (gdn_carry_flush_kernel, {}, 1),
            (carry_accept_kernel, {}, 4),
            (gdn_carry_flush_vk_kernel, vk, 1),
            (G.gdn_gating_kernel, {}, 1)):
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
    run = run_lowered(COMPILE_ALL)
    assert run.returncode == 0, run.stderr[-4000:]
    assert run.stdout.split() == ["gdn_carry_flush_kernel", "ok", "carry_accept_kernel", "ok",
                                  "gdn_carry_flush_vk_kernel", "ok", "gdn_gating_kernel", "ok"]


COMPILE_RING = textwrap.dedent("""
    import sys
    from pmll_lab.lowering import lower
    from pmll_lab.ops.carry.ring_verify import gdn_ring_fused_kernel
    from pmll_lab.ops.carry.ring_kernels import (SMALL_PRODUCTS, gdn_ring_flush_kernel,
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
    run = run_lowered(COMPILE_RING)
    assert run.returncode == 0, run.stderr[-4000:]
    assert run.stdout.split() == ["bfloat16", "early", "ok", "bfloat16", "after", "ok", "float16",
                                  "early", "ok", "float32", "after", "ok", "float32", "early",
                                  "ok", "ring_accept_kernel", "ok"]


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
    run = run_lowered(SASS)
    assert run.returncode == 0, run.stderr[-4000:]
    got = json.loads(run.stdout)
    one, four = got["1"], got["4"]
    for st in (one, four):
        assert 0 < st["registers"] <= 255 and st["instructions"] > 100, st
    assert one["mix"]["FFMA"] > 100
    assert abs(four["mix"]["FFMA"] / one["mix"]["FFMA"] - 4) < 0.08, (one["mix"], four["mix"])
    assert four["instructions"] > 3 * one["instructions"]


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
    x = gdn_inputs(3, 2, 1, 2, 16, 16, slots=3, dtype=torch.float32, state_layout="kv")
    r = gdn_inputs(4, 2, 1, 2, 16, 16, rows=2, slots=3, dtype=torch.float32, state_layout="kv")
    sl = x["state_indices"]
    gdn_decode(x["state"], x["q"], x["k"], x["v"], x["g"], x["beta"], state_indices=sl,
               state_layout="kv")
    gdn_chain(x["state"], r["q"], r["k"], r["v"], r["g"], r["beta"], state_indices=sl,
              state_layout="kv")
    gdn_gating(torch.zeros(2, device=DEVICE), r["g"], torch.zeros(2, device=DEVICE), r["beta"])
    vk_state = x["state"].transpose(-1, -2).contiguous()
    gdn_decode(vk_state, x["q"], x["k"], x["v"], x["g"], x["beta"], state_indices=sl,
               state_layout="vk")
    for layout in ("kv", "vk"):
        st = x["state"] if layout == "kv" else x["state"].transpose(-1, -2).contiguous()
        c = GdnCarry.empty(3, 2, 16, 16, state_layout=layout)
        gdn_carry_verify(st, c, r["q"], r["k"], r["v"], r["g"], r["beta"], slot_tab=sl,
                         form="exact", state_layout=layout)
        gdn_carry_flush([st], [c], sl, state_layout=layout)
    fused = {name for name, opts in seen.items() if True in opts}
    assert not fused, f"launched with contraction: {sorted(fused)}"
    assert {"gdn_rows_kernel", "gdn_rows_vk_kernel", "gdn_gating_kernel",
            "gdn_carry_exact_vk_kernel", "gdn_carry_flush_vk_kernel",
            "gdn_carry_flush_kernel"} <= set(seen), sorted(seen)
    assert set(seen) & {"gdn_carry_exact_kernel", "gdn_carry_exact_split_kernel"}, seen


ROUNDING = textwrap.dedent("""
    import json, os, sys
    # before pmll_lab is imported: the setting is fixed then
    os.environ["PMLL_LAB_PACKED_STATE_TILE"] = "1" if sys.argv[1] == "packed" else "0"
    import triton.language as tl
    from pmll_lab.lowering import gdn_exact_family
    from pmll_lab.ops.gdn import recurrence as R
    assert bool(R.PACKED_STATE_TILE) == (sys.argv[1] == "packed")
    if sys.argv[1] == "unpaired":   # mutation, before anything compiles: one conversion per element
        R.PAIRED_ROUNDING = tl.constexpr(False)
    out = {}
    for st in sys.argv[2:]:
        res = {}
        lay = gdn_exact_family(layout="vk", state_type=st, gate=True, batch=64, resources=res)
        out[st] = {name: dict(r["mix"], registers=r["registers"]) for name, r in res.items()}
        out[st]["layouts_agree"] = all(v == next(iter(lay.values())) for v in lay.values())
    json.dump(out, sys.stdout)
""")


def test_two_byte_states_round_two_values_per_conversion():
    """The chain and the exact carry verify round a bf16 / fp16 state after every row; on sm_90
    that is paired conversions (``F2FP``) and no one-element ``F2F`` in the verify, the chain
    and decode (``recurrence.round_to_state``), whether the tile is held widened (the default)
    or as 2-byte pairs (``packed_state_tile``). Held as pairs, the verify takes fewer registers
    than the fp32-state verify (168 against 214 with Triton 3.6; 228 widened). The check sees
    the one-per-element version."""

    got = {}
    for mode, states in (("paired", ["bf16", "fp16"]), ("packed", ["bf16", "fp16", "fp32"]),
                         ("unpaired", ["bf16"])):
        run = run_lowered(ROUNDING, mode, *states)
        assert run.returncode == 0, run.stderr[-4000:]
        got[mode] = json.loads(run.stdout)
    verify, chain = "gdn_carry_exact_vk_kernel", "gdn_rows_vk_kernel[chain]"
    for mode in ("paired", "packed"):
        for st in ("bf16", "fp16"):
            mix = got[mode][st]
            assert mix[verify].get("F2F", 0) == 0, (mode, st, mix[verify])
            assert mix[verify].get("F2FP", 0) >= 64, (mode, st, mix[verify])
            assert mix[chain].get("F2F", 0) <= 4, (mode, st, mix[chain])  # the gate's scalars
            assert mix["layouts_agree"], (mode, st)     # decode's reductions in every kernel
    fp32 = got["packed"]["fp32"][verify]["registers"]
    for st in ("bf16", "fp16"):
        assert got["packed"][st][verify]["registers"] < fp32, (st, got["packed"][st][verify])
        assert got["paired"][st][verify]["registers"] > fp32, (st, got["paired"][st][verify])
    unpaired = got["unpaired"]["bf16"][verify]
    assert unpaired.get("F2F", 0) >= 128, unpaired     # one per value: 64 a thread, 3 rows
