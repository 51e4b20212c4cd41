"""The PMLL ring's CUDA C++ twins (``impl="cuda"``, ``kernels/pmll_ring.cu``) against the float64
reference, against a float32 PyTorch replay, and against the Triton kernels (SPEC §1).

Tolerances (as in ``tests/pmll/test_pmll.py``; inputs already rounded to the tested dtype): a gated
blend rounds to the memory dtype once per token landing on a slot, ``8u`` relative L2 against
float64 (fp32 1e-6, bf16 1.6e-2, fp16 2e-3). Bitwise: ungated writes and every read (copies)
against float64 and against Triton; every write against ``_fp32_replay``, the rows applied one
at a time by PyTorch in fp32 (two rounded products and a rounded sum, rounded to the memory
dtype), which is what the twin's unfused blend promises. Gated CUDA and Triton results are held
to the tolerance, not bitwise: Triton may contract the blend into an FMA on a GPU.

Where the kernels' device is the CPU (no GPU, or the interpreter was asked for) the GPU tests
check, with the same inputs, that ``impl="cuda"`` refuses with its error instead, as the other
device-dependent tests of this suite branch on ``DEVICE``. The CPU tests at the end run
everywhere: the no-GPU ``RuntimeError``, the ``ValueError`` of a bad ``impl``, and the argument
checks running before the CUDA path is even looked for.
"""

from __future__ import annotations

import pmll_lab  # noqa: F401  (first: picks GPU or the Triton interpreter)

import pytest
import torch

from _cuda_refusal import _refused
from pmll_lab import cuda_ext
from pmll_lab.backend import DEVICE
from pmll_lab.bench import errors
from pmll_lab.inputs import pmll_inputs
from pmll_lab.pmll import RingMemory, memory_attention, pmll_read, pmll_write
from pmll_lab.reference import pmll as ref

pytestmark = pytest.mark.filterwarnings(
    "ignore:Conversion of an array with ndim > 0 to a scalar:DeprecationWarning")

TOL = {torch.float32: 1e-6, torch.bfloat16: 1.6e-2, torch.float16: 2e-3}
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
ON_GPU = DEVICE.type == "cuda"


def _memory(seed, batch, heads, capacity, dim, dtype, count):
    gen = torch.Generator().manual_seed(seed)
    shape = (batch, heads, capacity, dim)
    k = torch.randn(shape, generator=gen).to(dtype).to(DEVICE)
    v = torch.randn(shape, generator=gen).to(dtype).to(DEVICE)
    return RingMemory(k, v, torch.tensor(count, dtype=torch.int64, device=DEVICE))


def _fp32_replay(k, v, count, k_new, v_new, gate):
    """The write as PyTorch computes it row by row in fp32 (CPU), stored in the ring's dtype."""
    k, v, n = k.cpu().clone(), v.cpu().clone(), count.cpu().clone()
    kn, vn = k_new.cpu(), v_new.cpu()
    batch, heads, capacity, _ = k.shape
    for b in range(batch):
        for t in range(kn.shape[2]):
            s = int((n[b] + t) % capacity)
            if gate is None:
                k[b, :, s], v[b, :, s] = kn[b, :, t], vn[b, :, t]
                continue
            g = (gate[b, t] if gate.dim() == 2 else gate[b, :, t]).cpu().float().reshape(-1, 1)
            keep = 1.0 - g
            k[b, :, s] = (g * kn[b, :, t].float() + keep * k[b, :, s].float()).to(k.dtype)
            v[b, :, s] = (g * vn[b, :, t].float() + keep * v[b, :, s].float()).to(v.dtype)
    return k, v, n + kn.shape[2]


def _close(out, want, tol, what):
    e = errors(out, want)
    assert e["rel_l2"] <= tol, f"{what}: rel_l2 {e['rel_l2']:.3g} > {tol:g}"


# ---- GPU: write ---------------------------------------------------------------------------------

@pytest.mark.parametrize("dim", [6, 16, 100, 128])   # 6: rows off 16 bytes, the general kernel
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gate,gate_dtype", [(None, None), ("bt", torch.float32),
                                             ("bht", torch.float32), ("bht", torch.bfloat16),
                                             ("bt", torch.float16)])
def test_write_segments_against_references(dim, dtype, gate, gate_dtype):
    """Segments of 5, 13 (> M = 6), 1 and 6 rows on counts 0, 4 and 11: float64 reference to
    the tolerance (bitwise without a gate), the fp32 replay bitwise, Triton (bitwise ungated)."""
    mem = _memory(1, 3, 2, 6, dim, dtype, [0, 4, 11])
    tri = mem.clone()
    rk, rv, rc = mem.k.cpu().double(), mem.v.cpu().double(), mem.count.cpu().clone()
    pk, pv, pc = mem.k.cpu(), mem.v.cpu(), mem.count.cpu()
    for s, tokens in enumerate([5, 13, 1, 6]):
        x = pmll_inputs(100 + s, 3, 2, tokens, dim, gate=gate, dtype=dtype)
        g = None if gate is None else x["gate"].to(gate_dtype)
        if not ON_GPU:
            _refused(lambda: pmll_write(mem, x["k_new"], x["v_new"], g, impl="cuda"))
            return
        pmll_write(mem, x["k_new"], x["v_new"], g, validate=True, impl="cuda")
        pmll_write(tri, x["k_new"], x["v_new"], g)
        rk, rv, rc = ref.ring_write(rk, rv, rc, x["k_new"], x["v_new"], g)
        pk, pv, pc = _fp32_replay(pk, pv, pc, x["k_new"], x["v_new"], g)
        what = f"segment {s} ({tokens} rows)"
        assert torch.equal(mem.count.cpu(), rc) and torch.equal(mem.count, tri.count), what
        assert torch.equal(mem.k.cpu(), pk) and torch.equal(mem.v.cpu(), pv), \
            f"{what}: not bitwise the fp32 replay"
        if gate is None:
            assert torch.equal(mem.k.cpu().double(), rk) and torch.equal(mem.v.cpu().double(), rv)
            assert torch.equal(mem.k, tri.k) and torch.equal(mem.v, tri.v), f"{what}: != Triton"
        else:
            _close(mem.k, rk, TOL[dtype], f"{what} k")
            _close(mem.v, rv, TOL[dtype], f"{what} v")
            _close(mem.k, tri.k.double().cpu(), TOL[dtype], f"{what} k against Triton")


@pytest.mark.parametrize("dtype", DTYPES)
def test_write_segment_equals_token_by_token_bitwise(dtype):
    """One launch of 17 gated rows on M = 5 stores exactly what 17 one-row launches store."""
    a = _memory(2, 2, 2, 5, 32, dtype, [3, 9])
    b = a.clone()
    x = pmll_inputs(7, 2, 2, 17, 32, gate="bht", dtype=dtype)
    if not ON_GPU:
        _refused(lambda: pmll_write(a, x["k_new"], x["v_new"], x["gate"], impl="cuda"))
        return
    pmll_write(a, x["k_new"], x["v_new"], x["gate"], impl="cuda")
    for t in range(17):
        sl = slice(t, t + 1)
        pmll_write(b, x["k_new"][:, :, sl], x["v_new"][:, :, sl], x["gate"][:, :, sl],
                   impl="cuda")
    assert torch.equal(a.count, b.count) and a.count.tolist() == [20, 26]
    assert torch.equal(a.k, b.k) and torch.equal(a.v, b.v)


def test_write_strided_inputs_and_empty_segment():
    """k_new, v_new as [B, T, H, D] views (strided in T and H), a bf16 [B, T] gate, D = 128;
    then T = 0 leaves ring and count as they were."""
    mem = _memory(3, 2, 3, 4, 128, torch.float32, [2, 5])
    x = pmll_inputs(8, 2, 6, 3, 128, dtype=torch.float32)
    k_new, v_new = x["k_new"].transpose(1, 2), x["v_new"].transpose(1, 2)
    gate = torch.rand(2, 6, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    gate = gate.to(DEVICE)
    if not ON_GPU:
        _refused(lambda: pmll_write(mem, k_new, v_new, gate, impl="cuda"))
        return
    want = ref.ring_write(mem.k, mem.v, mem.count, k_new, v_new, gate)
    replay = _fp32_replay(mem.k, mem.v, mem.count, k_new, v_new, gate)
    pmll_write(mem, k_new, v_new, gate, impl="cuda")
    assert torch.equal(mem.count.cpu(), want[2])
    assert torch.equal(mem.k.cpu(), replay[0]) and torch.equal(mem.v.cpu(), replay[1])
    _close(mem.k, want[0], TOL[torch.float32], "k")
    before = mem.clone()
    pmll_write(mem, k_new[:, :, :0], v_new[:, :, :0], gate[:, :0], impl="cuda")
    assert torch.equal(mem.k, before.k) and torch.equal(mem.count, before.count)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gate", [None, "bht"])
def test_write_views_off_16_bytes_store_the_same_bits(dtype, gate):
    """New rows as views one element into a wider tensor (their rows off 16 bytes: the general
    kernel) store the bits that contiguous copies of them (the 16-byte kernel) store."""
    a = _memory(5, 2, 2, 6, 32, dtype, [1, 9])
    b = a.clone()
    x = pmll_inputs(9, 2, 2, 9, 33, gate=gate, dtype=dtype)
    k_view, v_view = x["k_new"][..., 1:], x["v_new"][..., 1:]
    if not ON_GPU:
        _refused(lambda: pmll_write(a, k_view, v_view, x["gate"], impl="cuda"))
        return
    pmll_write(a, k_view, v_view, x["gate"], impl="cuda")
    pmll_write(b, k_view.contiguous(), v_view.contiguous(), x["gate"], impl="cuda")
    assert torch.equal(a.k, b.k) and torch.equal(a.v, b.v) and torch.equal(a.count, b.count)
    if gate is None:
        tri = _memory(5, 2, 2, 6, 32, dtype, [1, 9])
        pmll_write(tri, k_view, v_view)
        assert torch.equal(a.k, tri.k) and torch.equal(a.v, tri.v)


# ---- GPU: read ----------------------------------------------------------------------------------

@pytest.mark.parametrize("dim", [6, 8, 12, 24, 128])   # 6 (and 12 at 2 bytes): general kernel
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t_ctx", [0, 3])
def test_read_bitwise(dim, dtype, t_ctx):
    """Counts 0, 3, M, 2M + 5 (empty, partial, full, wrapped): bitwise the float64 reference
    and the Triton read, right-aligned, zeros elsewhere."""
    mem = _memory(4, 4, 2, 7, dim, dtype, [0, 3, 7, 19])
    if not ON_GPU:
        _refused(lambda: pmll_read(mem, t_ctx, impl="cuda"))
        return
    k, v = pmll_read(mem, t_ctx, impl="cuda")
    tk, tv = pmll_read(mem, t_ctx)
    rk, rv = ref.ring_read(mem.k, mem.v, mem.count, t_ctx)
    assert k.shape == (4, 2, 7 + t_ctx, dim) and k.dtype == dtype and k.device == mem.k.device
    assert torch.equal(k.cpu().double(), rk) and torch.equal(v.cpu().double(), rv)
    assert torch.equal(k, tk) and torch.equal(v, tv)


def test_read_after_cuda_writes_is_token_order():
    """Rows written by the twin (ungated, 3 segments wrapping M = 5) read back by the twin in
    the order written: the last five tokens, oldest first."""
    mem = RingMemory.empty(1, 1, 5, 8, dtype=torch.float32, device=DEVICE)
    rows = torch.randn(1, 1, 12, 8, generator=torch.Generator().manual_seed(5)).to(DEVICE)
    if not ON_GPU:
        _refused(lambda: pmll_write(mem, rows, rows, impl="cuda"))
        return
    for a, b in [(0, 4), (4, 11), (11, 12)]:
        pmll_write(mem, rows[:, :, a:b], rows[:, :, a:b], impl="cuda")
    k, _ = pmll_read(mem, impl="cuda")
    assert torch.equal(k, rows[:, :, 7:12])


# ---- everywhere: errors -------------------------------------------------------------------------

def test_no_gpu_runtime_error_before_compiling(monkeypatch):
    """With torch seeing no CUDA device, impl='cuda' raises the RuntimeError naming the
    alternative, and nothing is compiled (the builder is replaced by one that fails)."""
    def never(*a, **k):
        raise AssertionError("compiled without a GPU")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(cuda_ext, "build_extension", never)
    mem = _memory(6, 2, 2, 4, 16, torch.float32, [1, 6])
    x = pmll_inputs(11, 2, 2, 3, 16, gate="bt")
    before = mem.clone()
    for call in (lambda: cuda_ext.load("pmll_ring"),
                 lambda: pmll_write(mem, x["k_new"], x["v_new"], x["gate"], impl="cuda"),
                 lambda: pmll_read(mem, 2, impl="cuda")):
        with pytest.raises(RuntimeError, match="needs an NVIDIA GPU.*impl='triton'"):
            call()
    assert torch.equal(mem.k, before.k) and torch.equal(mem.count, before.count)


@pytest.mark.parametrize("impl", ["CUDA", "fused", None, 1])
def test_bad_impl_names_impl(impl):
    mem = _memory(6, 2, 2, 4, 16, torch.float32, [1, 6])
    x = pmll_inputs(11, 2, 2, 3, 16)
    with pytest.raises(ValueError, match=r"^impl: must be one of \['triton', 'cuda'\]"):
        pmll_write(mem, x["k_new"], x["v_new"], impl=impl)
    with pytest.raises(ValueError, match="^impl:"):
        pmll_read(mem, impl=impl)
    assert mem.count.tolist() == [1, 6]


def test_ring_attention_has_no_cuda_twin():
    x = pmll_inputs(12, 1, 2, 3, 16)
    with pytest.raises(ValueError, match="^impl: the ring attention has no CUDA twin"):
        memory_attention(x["q"], x["k_new"], x["v_new"], impl="cuda")


@pytest.mark.parametrize("case,name", [("heads", "k_new"), ("dtype", "k_new"), ("v_tokens", "v_new"),
                                       ("gate_shape", "gate"), ("mem_count", "mem.count"),
                                       ("gate_range", "gate"), ("t_ctx", "t_ctx")])
def test_argument_checks_run_before_the_cuda_path(case, name, monkeypatch):
    """Bad arguments with impl='cuda' give the Triton path's ValueError naming the argument,
    never the CUDA path's error, and write nothing (the CUDA path would fail if reached)."""
    def reached(*a, **k):
        raise AssertionError("the CUDA path was reached before the checks")
    monkeypatch.setattr(cuda_ext, "require_gpu", reached)
    mem = _memory(6, 2, 3, 4, 16, torch.float32, [1, 6])
    x = pmll_inputs(13, 2, 3, 5, 16, gate="bht")
    k, v, g = x["k_new"], x["v_new"], x["gate"]
    if case == "heads":
        k, v = k[:, :2], v[:, :2]
    elif case == "dtype":
        k = k.to(torch.float16)
    elif case == "v_tokens":
        v = v[:, :, :4]
    elif case == "gate_shape":
        g = g[:, :, :4]
    elif case == "mem_count":
        mem.count = mem.count.to(torch.int32)
    elif case == "gate_range":
        g = g.clone()
        g[1, 2, 3] = 1.5
    before = mem.k.clone()
    with pytest.raises(ValueError, match=rf"^{name}:"):
        if case == "t_ctx":
            pmll_read(mem, -1, impl="cuda")
        else:
            pmll_write(mem, k, v, g, validate=True, impl="cuda")
    assert torch.equal(mem.k, before)


def test_build_settings(monkeypatch, tmp_path):
    """The arch for a device, the build directory's precedence, an unknown twin's error."""
    assert cuda_ext.arch((9, 0)) == "sm_90a" and cuda_ext.arch((8, 6)) == "sm_86"
    assert cuda_ext.arch((10, 0)) == "sm_100"
    monkeypatch.delenv("PMLL_LAB_CUDA_EXT_DIR", raising=False)
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    assert cuda_ext.build_root().parts[-3:] == (".cache", "pmll_lab", "cuda_ext")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "t"))
    assert cuda_ext.build_root() == tmp_path / "t" / "pmll_lab"
    monkeypatch.setenv("PMLL_LAB_CUDA_EXT_DIR", str(tmp_path / "own"))
    assert cuda_ext.build_root() == tmp_path / "own"
    with pytest.raises(ValueError, match="^name: no CUDA twin 'gdn'"):
        cuda_ext.load("gdn")
    for bad in ("wide_rows=2", "-DPMLL_GDN_WIDE_ROWS=2", 2, "PMLL GDN=1"):
        with pytest.raises(ValueError, match="^defines: expected 'NAME=VALUE'"):
            cuda_ext.load("gdn_decode", defines=(bad,))
    assert all((cuda_ext.KERNELS_DIR / s).is_file() for srcs in cuda_ext.TWINS.values()
               for s in srcs)
