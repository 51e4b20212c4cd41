"""Fused PMLL ring attention (``memory_attention(impl="fused")``, ``pmll_step``) against the
float64 reference and the gather path, and the GPT-2 architecture run segment by segment.

Tolerances (relative L2 against float64, inputs already in the tested dtype): the fused kernel
accumulates in fp32 and rounds twice to the dtype, the probabilities before ``p @ v`` (as
FlashAttention does) and the output, so we allow 8 unit roundoffs ``u`` of the dtype for 16-bit
inputs: bf16 ``u = 2**-9`` -> 1.6e-2, fp16 ``u = 2**-12`` -> 2e-3; fp32 1e-5 (IEEE fp32
products, as the reference path's 1e-5). The kernel against the gather path: the sum of both
tolerances. Sizes are tiny: the kernel runs in the Triton interpreter on the CPU.
"""

from __future__ import annotations

import pmll_lab  # noqa: F401  (first: picks GPU or the Triton interpreter)

import pytest
import torch

from pmll_lab.bench import bitwise_equal, errors
from pmll_lab.inputs import pmll_inputs
from pmll_lab.ops.pmll.ring_attention import attention_flops, ring_attention, tile_for
from pmll_lab.pmll import RingMemory, memory_attention, pmll_step, pmll_write
from pmll_lab.reference import pmll as ref
from _paths import ROOT

pytestmark = pytest.mark.filterwarnings(
    "ignore:Conversion of an array with ndim > 0 to a scalar:DeprecationWarning")

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
FUSED_TOL = {torch.float32: 1e-5, torch.bfloat16: 1.6e-2, torch.float16: 2e-3}
REF_TOL = {torch.float32: 1e-5, torch.bfloat16: 8e-3, torch.float16: 1e-3}
SMALL_TILE = dict(BLOCK_M=32, BLOCK_N=16, BLOCK_C=16, BLOCK_D=None, num_warps=4, num_stages=1)
"""Small blocks: several query blocks, several ring blocks plus a partial one, and diagonal
blocks narrower than the query block (both context loops run)."""


def _ring(seed, batch, heads, capacity, head_dim, dtype, counts):
    gen = torch.Generator().manual_seed(seed)
    shape = (batch, heads, capacity, head_dim)
    k = torch.randn(shape, generator=gen).to(dtype).to(pmll_lab.DEVICE)
    v = torch.randn(shape, generator=gen).to(dtype).to(pmll_lab.DEVICE)
    return RingMemory(k, v, torch.tensor(counts, dtype=torch.int64, device=pmll_lab.DEVICE))


def _close(out, want, tol, what):
    e = errors(out, want)
    assert e["rel_l2"] <= tol, f"{what}: rel_l2 {e['rel_l2']:.3g} > {tol:g} (max_abs {e['max_abs']:.3g})"


def _tile(head_dim, small):
    if not small:
        return None
    return {**SMALL_TILE, "BLOCK_D": max(16, 1 << (head_dim - 1).bit_length())}


# ---- fused vs reference over ring states ------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("tokens, head_dim, small", [(1, 64, False), (37, 64, True),
                                                     (20, 128, False), (1, 128, True)])
def test_fused_matches_reference_over_ring_states(dtype, tokens, head_dim, small):
    """One batch holds every ring state side by side (ragged lengths): empty (count 0), partly
    filled (3), exactly full (M), wrapped once by one row (M + 1), wrapped twice (2M + 3), and
    oldest row late in the ring (3M - 7: the chronological order wraps inside a whole block)."""
    capacity = 40
    counts = [0, 3, capacity, capacity + 1, 2 * capacity + 3, 3 * capacity - 7]
    mem = _ring(1, len(counts), 2, capacity, head_dim, dtype, counts)
    x = pmll_inputs(2, len(counts), 2, tokens, head_dim, dtype=dtype)
    o = ring_attention(x["q"], x["k_new"], x["v_new"], mem, tile=_tile(head_dim, small))
    assert o.dtype == dtype and o.shape == x["q"].shape
    want = ref.memory_attention(x["q"], x["k_new"], x["v_new"], mem.k, mem.v, mem.count)
    _close(o, want, FUSED_TOL[dtype], "fused vs float64")
    gathered = memory_attention(x["q"], x["k_new"], x["v_new"], mem, impl="reference")
    _close(o, gathered.double(), FUSED_TOL[dtype] + REF_TOL[dtype], "fused vs gather path")
    # each sequence alone (its own ring length) gives its rows of the batched launch
    for b in (0, 3, 5):
        one = RingMemory(mem.k[b:b + 1].clone(), mem.v[b:b + 1].clone(), mem.count[b:b + 1].clone())
        ob = ring_attention(x["q"][b:b + 1], x["k_new"][b:b + 1], x["v_new"][b:b + 1], one,
                            tile=_tile(head_dim, small))
        assert bitwise_equal(ob, o[b:b + 1]), f"sequence {b} differs alone and in the batch"


def test_wrapped_ring_is_read_from_the_right_slots():
    """Rings written by ``pmll_write`` over several wraps (count 2M + 3 and beyond): the fused
    kernel attends exactly the live rows the float64 write + gather reference holds."""
    batch, heads, capacity, dim = 3, 2, 8, 32
    mem = RingMemory.empty(batch, heads, capacity, dim)
    rk, rv, rc = (mem.k.double().cpu(), mem.v.double().cpu(), mem.count.cpu().clone())
    for s, tokens in enumerate((5, 6, 8, 12)):          # counts 5, 11 (M + 3), 19 (2M + 3), 31
        x = pmll_inputs(40 + s, batch, heads, tokens, dim, gate="bht")
        pmll_write(mem, x["k_new"], x["v_new"], x["gate"])
        rk, rv, rc = ref.ring_write(rk, rv, rc, x["k_new"], x["v_new"], x["gate"])
        y = pmll_inputs(50 + s, batch, heads, 7, dim)
        o = memory_attention(y["q"], y["k_new"], y["v_new"], mem, impl="fused")
        want = ref.memory_attention(y["q"], y["k_new"], y["v_new"], rk, rv, rc)
        _close(o, want, 2e-5, f"after segment {s} (count {int(rc[0])})")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
def test_fused_without_memory_is_causal_attention(dtype):
    x = pmll_inputs(3, 2, 3, 33, 64, dtype=dtype)
    o = memory_attention(x["q"], x["k_new"], x["v_new"], None, impl="fused")
    want = ref.causal_attention(x["q"], x["k_new"], x["v_new"])
    _close(o, want, FUSED_TOL[dtype], "no memory")
    # an all-empty ring runs the same arithmetic: bit for bit the no-memory result
    empty = RingMemory.empty(2, 3, 16, 64, dtype=dtype)
    assert bitwise_equal(memory_attention(x["q"], x["k_new"], x["v_new"], empty, impl="fused"), o)


def test_fused_strided_inputs():
    """q, k, v as the heads of a fused projection ``[B, T, 3, H, D]`` (strided, last dim
    contiguous; read in place), and a q whose last dim is strided (copied by the launcher)."""
    batch, heads, tokens, dim = 2, 2, 19, 64
    mem = _ring(4, batch, heads, 24, dim, torch.float32, [30, 11])
    gen = torch.Generator().manual_seed(5)
    qkv = torch.randn(batch, tokens, 3, heads, dim, generator=gen).to(pmll_lab.DEVICE)
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
    assert not q.is_contiguous() and q.stride(-1) == 1
    want = ref.memory_attention(q, k, v, mem.k, mem.v, mem.count)
    _close(memory_attention(q, k, v, mem, impl="fused"), want, 1e-5, "strided")
    qt = q.contiguous().transpose(2, 3).contiguous().transpose(2, 3)      # stride(-1) != 1
    assert qt.stride(-1) != 1
    _close(memory_attention(qt, k, v, mem, impl="fused"), want, 1e-5, "last dim strided")


def test_segmented_fused_attention_equals_full_causal():
    """SPEC §1 with the fused kernel: gate None, M >= tokens seen, segment by segment through
    ``pmll_step`` equals causal attention over the whole sequence."""
    batch, heads, dim, seg = 2, 2, 64, [5, 3, 17, 1]
    total = sum(seg)
    x = pmll_inputs(6, batch, heads, total, dim)
    mem = RingMemory.empty(batch, heads, total, dim)
    outs, start = [], 0
    for tokens in seg:
        sl = slice(start, start + tokens)
        outs.append(pmll_step(mem, x["q"][:, :, sl], x["k_new"][:, :, sl], x["v_new"][:, :, sl],
                              impl="fused"))
        start += tokens
    assert mem.count.tolist() == [total] * batch
    full = ref.causal_attention(x["q"], x["k_new"], x["v_new"])
    _close(torch.cat(outs, dim=2), full, 1e-5, "segmented vs full")


# ---- pmll_step --------------------------------------------------------------------------------

@pytest.mark.parametrize("impl", ["fused", "reference"])
@pytest.mark.parametrize("gate", [None, "bt", "bht"])
def test_pmll_step_is_attention_then_write(impl, gate):
    batch, heads, capacity, dim, tokens = 3, 2, 8, 32, 11
    mem = _ring(7, batch, heads, capacity, dim, torch.bfloat16, [0, 5, 19])
    x = pmll_inputs(8, batch, heads, tokens, dim, gate=gate, dtype=torch.bfloat16)
    twin, orig = mem.clone(), mem.clone()
    o = pmll_step(mem, x["q"], x["k_new"], x["v_new"], x["gate"], impl=impl)
    want = memory_attention(x["q"], x["k_new"], x["v_new"], twin, impl=impl)
    pmll_write(twin, x["k_new"], x["v_new"], x["gate"])
    assert bitwise_equal(o, want), "output differs from memory_attention over the old ring"
    for a, b, name in ((mem.k, twin.k, "k"), (mem.v, twin.v, "v"), (mem.count, twin.count, "count")):
        assert bitwise_equal(a, b), f"ring {name} differs from pmll_write's"
    rk, rv, rc = ref.ring_write(orig.k, orig.v, orig.count, x["k_new"], x["v_new"], x["gate"])
    assert torch.equal(mem.count.cpu(), rc)
    _close(mem.k, rk, 0 if gate is None else 1.6e-2, "ring k vs float64 write")


def test_pmll_step_without_memory():
    x = pmll_inputs(9, 2, 2, 9, 32)
    for impl in ("fused", "reference"):
        o = pmll_step(None, x["q"], x["k_new"], x["v_new"], impl=impl)
        _close(o, ref.causal_attention(x["q"], x["k_new"], x["v_new"]), 1e-5, impl)
    with pytest.raises(ValueError, match=r"^gate:"):
        pmll_step(None, x["q"], x["k_new"], x["v_new"], torch.ones(2, 9))


# ---- bad input --------------------------------------------------------------------------------

def _bad_cases():
    x = pmll_inputs(10, 2, 3, 5, 16, gate="bt")
    mem = RingMemory.empty(2, 3, 4, 16)
    q, k, v = x["q"], x["k_new"], x["v_new"]
    return mem, q, k, v, x["gate"], [
        ("q", (q[0], k, v, mem)),
        ("q", (q.to(torch.float64), k.double(), v.double(), None)),
        ("k_ctx", (q, k[:, :, :2], v, mem)),
        ("v_ctx", (q, k, v.half(), mem)),
        ("mem", (q[:, :2], k[:, :2], v[:, :2], mem)),
        ("q", (q.half(), k.half(), v.half(), mem)),
        ("mem", (q, k, v, object())),
        ("mem.count", (q, k, v, type("R", (), {"k": mem.k, "v": mem.v, "count": mem.count[:1]})())),
        ("mem.k", (q, k, v, type("R", (), {"k": mem.k.transpose(2, 3), "v": mem.v,
                                           "count": mem.count})())),
    ]


@pytest.mark.parametrize("impl", ["fused", "reference"])
def test_bad_input_same_errors_on_both_paths(impl):
    _, _, _, _, _, cases = _bad_cases()
    step_name = {"k_ctx": "k", "v_ctx": "v"}      # pmll_step's own argument names
    for name, args in cases:
        with pytest.raises(ValueError, match=rf"^{name}:"):
            memory_attention(*args, impl=impl)
        q, k, v, mem = args
        with pytest.raises(ValueError, match=rf"^{step_name.get(name, name)}:"):
            pmll_step(mem, q, k, v, impl=impl)
    mem, q, k, v, _, _ = _bad_cases()
    with pytest.raises(ValueError, match=r"^impl:"):
        memory_attention(q, k, v, mem, impl="flash")


@pytest.mark.parametrize("impl", ["fused", "reference"])
def test_pmll_step_checks_the_write_before_attending(impl):
    """A bad gate or a strided key is refused before the attention runs: the ring is unchanged."""
    mem, q, k, v, gate, _ = _bad_cases()
    before = mem.clone()
    bad = [("gate", (q, k, v, gate[:, :2])), ("gate", (q, k, v, gate.to(torch.int32))),
           ("gate", (q, k, v, gate[0])),
           ("k", (q, k.transpose(2, 3).contiguous().transpose(2, 3), v, gate))]
    for name, (qq, kk, vv, gg) in bad:
        with pytest.raises(ValueError, match=rf"^{name}:"):
            pmll_step(mem, qq, kk, vv, gg, impl=impl)
        assert torch.equal(mem.k, before.k) and torch.equal(mem.count, before.count)


def test_tiles_and_flops():
    assert tile_for(64, torch.bfloat16, 1)["BLOCK_M"] == 16            # small T: a small block
    t = tile_for(128, torch.float16, 4096)
    assert t["BLOCK_M"] % t["BLOCK_C"] == 0 and t["BLOCK_D"] == 128
    assert tile_for(40, torch.float32, 100)["BLOCK_D"] == 64
    x = pmll_inputs(11, 1, 1, 4, 16)
    with pytest.raises(ValueError, match=r"^tile:"):
        ring_attention(x["q"], x["k_new"], x["v_new"], None,
                       tile=dict(BLOCK_M=32, BLOCK_N=16, BLOCK_C=24, BLOCK_D=16, num_warps=4,
                                 num_stages=1))
    # one sequence, T = 2 queries, 3 ring rows: (3 + 1) + (3 + 2) key rows of 4 FLOPs * H * D
    assert attention_flops(1, 2, 2, 8, [3]) == 4 * 2 * 8 * (3 + 1 + 3 + 2)


# ---- GPT-2 architecture -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def gpt2():
    from pmll_lab.models import gpt2_pmll as G

    model = G.tiny_gpt2(0, layers=2, heads=2, head_dim=64, vocab=128, positions=64)
    ids = G.token_ids(1, 2, 40, 128)
    return G, model, ids, G.full_logits(model, ids)


def test_gpt2_segmented_equals_whole_sequence(gpt2):
    """GPT-2 (2 layers, 2 heads of 64), 40 tokens in segments of 16: gate None and a ring of
    >= 32 rows (the tokens before the last segment) gives the whole-sequence logits within
    1e-5 relative L2 (fp32; both paths)."""
    G, model, ids, full = gpt2
    for impl, capacity in (("fused", 40), ("fused", 32), ("reference", 64)):
        seg = G.segmented_logits(model, ids, segment=16, capacity=capacity, impl=impl)
        _close(seg, full, 1e-5, f"{impl}, capacity {capacity}")


def test_gpt2_error_grows_as_history_is_evicted(gpt2):
    """Smaller rings evict history: the logits' error against the whole-sequence forward grows
    as the capacity shrinks (0 = no memory), and a gate < 1 changes the result even when
    nothing is evicted (it blends each token into a zero slot)."""
    G, model, ids, full = gpt2
    err = {}
    for capacity in (0, 8, 16):
        seg = G.segmented_logits(model, ids, segment=16, capacity=capacity, impl="fused")
        err[capacity] = errors(seg, full)["rel_l2"]
    assert err[0] > err[8] > err[16] > 1e-3, err
    gated = G.segmented_logits(model, ids, segment=16, capacity=40, gate=0.5, impl="fused")
    assert errors(gated, full)["rel_l2"] > 1e-3
    # the first segment never sees memory: identical to the whole-sequence forward there
    _close(gated[:, :16], full[:, :16], 1e-5, "first segment")
    with pytest.raises(ValueError, match=r"^gate:"):
        G.segmented_logits(model, ids, segment=16, capacity=8, gate=1.5)
    with pytest.raises(ValueError, match=r"^capacity:"):
        G.segmented_logits(model, ids, segment=16, capacity=-1)


# ---- compiled for the GPU -----------------------------------------------------------------------

LOWER_SCRIPT = """
import json, sys, torch
from pmll_lab.lowering import lower, sass_stats
from pmll_lab.ops.pmll import ring_attention as ra
out = {}
for dim in (64, 128):
    t = ra.tile_for(dim, torch.bfloat16, 4096)
    types = {n: "*bf16" for n in ("q", "k_ctx", "v_ctx", "k_mem", "v_mem", "out")}
    types.update({n: "i32" for n in ("H", "T", "M", "D", "s_qb", "s_qh", "s_qt", "s_kb", "s_kh",
                                     "s_kt", "s_vb", "s_vh", "s_vt")})
    types.update(count="*i64", qk_scale="fp32")
    k = lower(ra.ring_attention_kernel, types,
              dict(HAS_MEM=True, PRECISION="tf32", UPCAST=False,
                   **{n: t[n] for n in ("BLOCK_M", "BLOCK_N", "BLOCK_C", "BLOCK_D")}),
              num_warps=t["num_warps"], values={"D": dim})
    st = sass_stats(k)
    out[dim] = dict(stack=st["stack_bytes"], wgmma=k.asm["ptx"].count("wgmma.mma_async"),
                    cp_async=k.asm["ptx"].count("cp.async.cg"))
json.dump(out, sys.stdout)
"""


def test_fused_kernel_compiles_for_sm90():
    """The bf16 tiles of ``attention_tiles`` compile for an H100/H200 (``sm_90``, on the CPU through
    ``pmll_lab.lowering``) to Hopper tensor-core products (wgmma) fed by cp.async, without
    register spills: what the interpreter cannot show."""
    import json
    import os
    import subprocess
    import sys
    root = ROOT
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PMLL_LAB_DEVICE"] = "lower"
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    run = subprocess.run([sys.executable, "-c", LOWER_SCRIPT], capture_output=True, text=True,
                         env=env, cwd=root, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout)
    for dim, st in got.items():
        assert st["stack"] == 0, f"D={dim}: {st['stack']} bytes spilled"
        assert st["wgmma"] > 0 and st["cp_async"] > 0, f"D={dim}: {st}"


# ---- the notebook's headline ------------------------------------------------------------------

def _gpu_rows(times_us: dict) -> "pd.DataFrame":
    """Sweep rows as a GPU run stores them: per (M, T) point and provider a cuda_graph and a
    do_bench time (the latter 5 us slower) and a TFLOP/s row."""
    import pandas as pd

    rows = []
    for (M, T), per in times_us.items():
        pid = f"M{M}T{T}"
        for kernel, us in per.items():
            for timer, t in (("cuda_graph", us), ("do_bench", us + 5)):
                base = dict(point_id=pid, status="ok", B=8, H=12, D=64, dtype="bfloat16", M=M,
                            T=T, kernel=kernel, timer=timer, device="NVIDIA H200")
                rows.append(dict(base, metric="time_us", value=t, p20=t, p80=t))
                rows.append(dict(base, metric="tflops", value=1.0))
        rows.append(dict(point_id=pid, status="ok", B=8, H=12, D=64, dtype="bfloat16", M=M, T=T,
                         kernel="fused", metric="rel_l2", value=1e-3, tolerance=1.6e-2,
                         passed=True, device="NVIDIA H200"))
    return pd.DataFrame(rows)


def test_headline_from_gpu_rows():
    """Ratios, met/missed and the worst cell, computed from graph-replay times; T > 1024 is left
    out of the contiguous-keys target, M = 0 out of the gather and pmll_step targets."""
    from pmll_lab.experiments import pmll_attention as rp
    from pmll_lab.experiments import targets as T

    df = _gpu_rows({
        (0, 1024): {"fused": 50.0, "sdpa_contiguous": 48.0, "sdpa_causal": 48.0},
        (1024, 1024): {"fused": 100.0, "gather_sdpa_mask": 210.0, "sdpa_contiguous": 95.0,
                       "sdpa_causal": 48.0, "pmll_step": 115.0},
        (1024, 2048): {"fused": 300.0, "gather_sdpa_mask": 550.0, "sdpa_contiguous": 200.0,
                       "sdpa_causal": 150.0, "pmll_step": 310.0},
    })
    head = T.headline(df, rp.TARGETS).set_index("ours")
    assert (head["timer"] == "cuda_graph").all()
    assert (head["H"] == 12).all() and (head["D"] == 64).all()
    gather = head.loc["fused"].set_index("peer").loc["gather_sdpa_mask"]
    assert (gather["cells"], gather["met_cells"], gather["status"]) == (2, 1, "missed")
    assert gather["ratio"] == round(300 / 550, 3) and "M=1024, T=2048" in gather["note"]
    contig = head.loc["fused"].set_index("peer").loc["sdpa_contiguous"]
    assert (contig["cells"], contig["met_cells"], contig["status"]) == (2, 2, "met")
    assert contig["ratio"] == round(100 / 95, 3)                  # T = 2048 not counted
    step = head.loc["pmll_step"]
    assert (step["cells"], step["met_cells"], step["status"]) == (2, 1, "missed")
    assert step["ratio"] == round(115 / 100, 3) and "T=1024" in step["note"]
    wide = rp.times(df)
    assert set(wide["do_bench_us"] - wide["time_us"]) == {5.0}
    r = rp.ratio_table(df, "fused", "sdpa_causal")
    assert list(r.columns) == ["H", "D", "M", 1024, 2048]


def test_fused_is_forward_only_and_says_so():
    """Inputs that require grad: the reference path differentiates, the fused kernel refuses
    (naming impl) rather than return a result cut off from autograd; under no_grad it runs."""
    mem, q, k, v, _, _ = _bad_cases()
    qg = q.clone().requires_grad_(True)
    out = memory_attention(qg, k, v, mem, impl="reference")
    assert out.requires_grad
    out.float().sum().backward()
    assert qg.grad is not None and torch.isfinite(qg.grad).all() and qg.grad.abs().sum() > 0
    with pytest.raises(ValueError, match=r"^impl: the fused kernel is forward-only"):
        memory_attention(qg, k, v, mem, impl="fused")
    with pytest.raises(ValueError, match=r"^impl: the fused kernel is forward-only"):
        pmll_step(None, qg, k, v, impl="fused")
    with torch.no_grad():
        fused = memory_attention(qg, k, v, mem, impl="fused")
    assert errors(fused, out.detach())["rel_l2"] < 1e-5          # fp32 inputs


def test_negative_count_and_empty_head_refused():
    with pytest.raises(ValueError, match=r"^mem.count: must be >= 0"):
        RingMemory(torch.zeros(2, 1, 4, 8), torch.zeros(2, 1, 4, 8), torch.tensor([-3, 0]))
    q = torch.zeros(1, 1, 2, 0)
    for impl in ("fused", "reference"):
        with pytest.raises(ValueError, match=r"^q: head size must be >= 1"):
            memory_attention(q, q, q, None, impl=impl)


def test_gpt2_bad_input_names_the_argument(gpt2):
    G, model, ids, _ = gpt2
    cases = [("ids", dict(ids=ids[:, :0])), ("ids", dict(ids=ids + 1000)),
             ("ids", dict(ids=ids - 1000)), ("mem_dtype", dict(mem_dtype=torch.bfloat16)),
             ("gate", dict(capacity=0, gate=0.5))]
    for name, kw in cases:
        args = dict(ids=ids, segment=16, capacity=16)
        args.update(kw)
        with pytest.raises(ValueError, match=rf"^{name}:"):
            G.segmented_logits(model, args.pop("ids"), **args)


def test_eviction_grid_pairs_no_ring_with_no_gate():
    from pmll_lab.experiments import pmll_attention as ex

    pts = ex.points([dict(capacity=[0, 8], gate=["none", "0.5"], tokens=[16])], sweep="eviction")
    assert sorted((p["capacity"], p["gate"]) for p in pts) == [(0, "none"), (8, "0.5"),
                                                               (8, "none")]
