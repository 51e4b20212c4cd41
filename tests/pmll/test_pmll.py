"""PMLL memory ring (SPEC §1): Triton write/read kernels and memory attention against the
float64 references in ``pmll_lab.reference.pmll``.

Tolerances (relative L2 against float64, inputs already rounded to the tested dtype so only the
kernel's own rounding counts): a gated blend rounds to the memory dtype once per token that
lands on a slot, so the error is a few unit roundoffs ``u`` of the stored values. We allow
``8u``: fp32 ``u = 2**-24`` -> 1e-6, bf16 ``u = 2**-9`` -> 1.6e-2, fp16 ``u = 2**-12`` -> 2e-3.
Ungated writes and every read are copies: bitwise equal to the reference.
Attention is computed in fp32 from the dtype's values: 1e-5 relative L2 for fp32 inputs.
"""

from __future__ import annotations

import pmll_lab  # noqa: F401  (first: picks GPU or the Triton interpreter)

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pmll_lab.bench import errors
from pmll_lab.inputs import pmll_inputs
from pmll_lab.pmll import (RingMemory, memory_attention, pmll_read, pmll_write, read_bytes,
                           write_bytes)
from pmll_lab.reference import pmll as ref

# The Triton interpreter turns a runtime loop bound (the write kernel's ``n_pass``) into a
# scalar through a 1-element numpy array, which NumPy >= 1.25 warns about; not our code.
pytestmark = pytest.mark.filterwarnings(
    "ignore:Conversion of an array with ndim > 0 to a scalar:DeprecationWarning")

TOL = {torch.float32: 1e-6, torch.bfloat16: 1.6e-2, torch.float16: 2e-3}
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _ref_state(mem: RingMemory):
    return (mem.k.to("cpu", torch.float64), mem.v.to("cpu", torch.float64),
            mem.count.to("cpu").clone())


def _seeded_memory(seed, batch, heads, capacity, head_dim, dtype, count=None):
    """A ring with random (non-zero) rows and a chosen count per sequence."""
    gen = torch.Generator().manual_seed(seed)
    shape = (batch, heads, capacity, head_dim)
    k = torch.randn(shape, generator=gen).to(dtype).to(pmll_lab.DEVICE)
    v = torch.randn(shape, generator=gen).to(dtype).to(pmll_lab.DEVICE)
    if count is None:
        count = torch.randint(0, 3 * capacity, (batch,), generator=gen)
    return RingMemory(k, v, torch.as_tensor(count, dtype=torch.int64).to(pmll_lab.DEVICE))


def _assert_close(out, want, tol, what):
    e = errors(out, want)
    assert e["rel_l2"] <= tol, f"{what}: rel_l2 {e['rel_l2']:.3g} > {tol:g} (max_abs {e['max_abs']:.3g})"


def _assert_state(mem, rk, rv, rc, tol, what=""):
    assert torch.equal(mem.count.cpu(), rc), f"{what}: count {mem.count.tolist()} != {rc.tolist()}"
    if tol == 0:
        assert torch.equal(mem.k.cpu().double(), rk), f"{what}: k not bitwise equal"
        assert torch.equal(mem.v.cpu().double(), rv), f"{what}: v not bitwise equal"
    else:
        _assert_close(mem.k, rk, tol, f"{what} k")
        _assert_close(mem.v, rv, tol, f"{what} v")


# ---- write ------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gate", [None, "bt", "bht"])
def test_write_wraps_over_segments(dtype, gate):
    """Several segments of mixed length on a ring with per-sequence counts: wraparound,
    T > M (13 > 6) and a single-token segment, against the sequential reference."""
    batch, heads, capacity, dim = 3, 2, 6, 16
    mem = _seeded_memory(1, batch, heads, capacity, dim, dtype, count=[0, 4, 11])
    rk, rv, rc = _ref_state(mem)
    for s, tokens in enumerate([5, 13, 1, 6, 4]):
        x = pmll_inputs(100 + s, batch, heads, tokens, dim, gate=gate, dtype=dtype)
        pmll_write(mem, x["k_new"], x["v_new"], x["gate"], validate=True)
        rk, rv, rc = ref.ring_write(rk, rv, rc, x["k_new"], x["v_new"], x["gate"])
        _assert_state(mem, rk, rv, rc, 0 if gate is None else TOL[dtype], f"segment {s}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_write_segment_equals_token_by_token_bitwise(dtype):
    """One launch of T > M gated rows stores exactly what T one-token launches store (the
    kernel rounds after every token on a slot, and no two programs share a slot)."""
    batch, heads, capacity, dim, tokens = 2, 2, 5, 32, 17
    a = _seeded_memory(2, batch, heads, capacity, dim, dtype, count=[3, 9])
    b = a.clone()
    x = pmll_inputs(7, batch, heads, tokens, dim, gate="bht", dtype=dtype)
    pmll_write(a, x["k_new"], x["v_new"], x["gate"])
    for t in range(tokens):
        sl = slice(t, t + 1)
        pmll_write(b, x["k_new"][:, :, sl], x["v_new"][:, :, sl], x["gate"][:, :, sl])
    assert torch.equal(a.count, b.count)
    assert torch.equal(a.k, b.k) and torch.equal(a.v, b.v)


def test_write_strided_inputs_and_head_dim_128():
    """Inputs that are views (non-contiguous in T and H), the largest head size tested (128),
    and a gate [B, T] given in bf16."""
    batch, heads, capacity, dim, tokens = 2, 3, 4, 128, 6
    mem = _seeded_memory(3, batch, heads, capacity, dim, torch.float32, count=[2, 5])
    rk, rv, rc = _ref_state(mem)
    x = pmll_inputs(8, batch, tokens, heads, dim, dtype=torch.float32)   # [B, T, H, D] layout
    k_new, v_new = x["k_new"].transpose(1, 2), x["v_new"].transpose(1, 2)
    assert not k_new.is_contiguous()
    gate = torch.rand(batch, tokens, generator=torch.Generator().manual_seed(4))
    gate = gate.to(torch.bfloat16).to(pmll_lab.DEVICE)
    pmll_write(mem, k_new, v_new, gate, validate=True)
    rk, rv, rc = ref.ring_write(rk, rv, rc, k_new, v_new, gate)
    _assert_state(mem, rk, rv, rc, TOL[torch.float32])


def test_write_odd_head_dim_and_empty_segment():
    """Head size 24 (padded tile) and T = 0 (no-op: memory and count unchanged)."""
    mem = _seeded_memory(5, 2, 2, 7, 24, torch.float16, count=[6, 1])
    before = mem.clone()
    x = pmll_inputs(9, 2, 2, 0, 24, dtype=torch.float16)
    pmll_write(mem, x["k_new"], x["v_new"])
    assert torch.equal(mem.k, before.k) and torch.equal(mem.count, before.count)
    rk, rv, rc = _ref_state(mem)
    x = pmll_inputs(10, 2, 2, 9, 24, gate="bt", dtype=torch.float16)
    pmll_write(mem, x["k_new"], x["v_new"], x["gate"])
    rk, rv, rc = ref.ring_write(rk, rv, rc, x["k_new"], x["v_new"], x["gate"])
    _assert_state(mem, rk, rv, rc, TOL[torch.float16])


# ---- read -------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t_ctx", [0, 3])
def test_read_chronological_right_aligned(dtype, t_ctx):
    """Counts below, at and above M (partly filled, full, wrapped several times): bitwise
    equal to the reference gather, zeros before the live rows and in the t_ctx rows."""
    capacity = 6
    mem = _seeded_memory(11, 5, 2, capacity, 16, dtype, count=[0, 2, 6, 9, 31])
    k_out, v_out = pmll_read(mem, t_ctx)
    rk, rv = ref.ring_read(mem.k, mem.v, mem.count, t_ctx)
    assert k_out.shape == (5, 2, capacity + t_ctx, 16) and k_out.dtype == dtype
    assert torch.equal(k_out.cpu().double(), rk) and torch.equal(v_out.cpu().double(), rv)
    # the oldest live row of sequence 3 (count 9) is slot 9 % 6 = 3, the newest slot 2
    assert torch.equal(k_out[3, :, 0], mem.k[3, :, 3]) and torch.equal(k_out[3, :, 5], mem.k[3, :, 2])
    assert not k_out[0].any() and not k_out[1, :, :4].any() and not k_out[:, :, capacity:].any()


def test_read_after_writes_is_chronological_token_order():
    """Tokens numbered 0..N-1 written in segments read back as the last min(N, M) numbers in
    order, right-aligned."""
    capacity, dim = 8, 16
    mem = RingMemory.empty(1, 1, capacity, dim, dtype=torch.float32)
    written = 0
    for tokens in [3, 4, 5, 11, 2]:
        ids = torch.arange(written, written + tokens, dtype=torch.float32)
        rows = ids[None, None, :, None].expand(1, 1, tokens, dim).contiguous().to(pmll_lab.DEVICE)
        pmll_write(mem, rows, -rows)
        written += tokens
        k_out, v_out = pmll_read(mem, 0)
        length = min(written, capacity)
        want = torch.arange(written - length, written, dtype=torch.float32)
        assert torch.equal(k_out[0, 0, capacity - length:, 0].cpu(), want)
        assert torch.equal(v_out[0, 0, capacity - length:, 0].cpu(), -want)
        assert not k_out[0, 0, :capacity - length].any()


# ---- reset ------------------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["mask", "index", "list", "all"])
def test_partial_reset_then_gated_writes(how):
    """Reset some sequences of a wrapped batch, keep writing with a gate: reset rows are zero,
    so later gated writes blend with zeros, not stale rows (the seed's bug); others untouched."""
    batch, heads, capacity, dim = 4, 2, 5, 16
    mem = _seeded_memory(12, batch, heads, capacity, dim, torch.float32, count=[7, 3, 12, 5])
    seqs = {"mask": torch.tensor([True, False, True, False]),
            "index": torch.tensor([2, 0]), "list": [0, 2], "all": None}[how]
    rk, rv, rc = ref.ring_reset(*_ref_state(mem), seqs)
    mem.reset(seqs.to(pmll_lab.DEVICE) if isinstance(seqs, torch.Tensor) else seqs)
    _assert_state(mem, rk, rv, rc, 0, "after reset")
    assert int(mem.lengths[0]) == 0 and (how == "all" or int(mem.lengths[1]) == 3)
    for s, tokens in enumerate([3, 8]):
        x = pmll_inputs(200 + s, batch, heads, tokens, dim, gate="bt")
        pmll_write(mem, x["k_new"], x["v_new"], x["gate"], validate=True)
        rk, rv, rc = ref.ring_write(rk, rv, rc, x["k_new"], x["v_new"], x["gate"])
    _assert_state(mem, rk, rv, rc, TOL[torch.float32], "after writes")
    k_out, _ = pmll_read(mem, 0)
    _assert_close(k_out, ref.ring_read(rk, rv, rc, 0)[0], TOL[torch.float32], "read")


def test_reset_forms_agree():
    """One int, a list, an index tensor and a bool mask (tensor or list) reset the same rows:
    the forms ``GdnCarry.reset`` / ``ConvCarry.reset`` take too."""
    outs = []
    for seqs in (1, [1], torch.tensor([1]), torch.tensor([False, True, False]),
                 [False, True, False]):
        mem = _seeded_memory(13, 3, 2, 4, 16, torch.float32, count=[5, 6, 2])
        before = mem.clone()
        mem.reset(seqs.to(pmll_lab.DEVICE) if isinstance(seqs, torch.Tensor) else seqs)
        assert mem.count.tolist() == [5, 0, 2] and not mem.k[1].any() and not mem.v[1].any()
        assert torch.equal(mem.k[0::2], before.k[0::2]) and torch.equal(mem.v[0::2], before.v[0::2])
        outs.append(mem)
    assert all(torch.equal(m.k, outs[0].k) for m in outs)


def test_empty_and_properties():
    mem = RingMemory.empty(3, 2, 5, 16, dtype=torch.bfloat16)
    assert (mem.batch, mem.heads, mem.capacity, mem.head_dim) == (3, 2, 5, 16)
    assert mem.dtype == torch.bfloat16 and mem.count.dtype == torch.int64
    assert not mem.k.any() and not mem.count.any() and mem.nbytes() == 2 * 3 * 2 * 5 * 16 * 2
    mem.count.copy_(torch.tensor([0, 7, 10]))
    assert mem.lengths.tolist() == [0, 5, 5] and mem.next_slot.tolist() == [0, 2, 0]


# ---- attention --------------------------------------------------------------------------------

@pytest.mark.parametrize("capacity", [16, 40])
def test_segmented_attention_equals_full_causal(capacity):
    """SPEC §1: with gate None and M >= total tokens, attending segment by segment over the
    ring (then writing the segment into it) equals causal attention over the whole sequence."""
    batch, heads, dim, seg = 2, 2, 16, [5, 3, 7, 1]
    total = sum(seg)
    x = pmll_inputs(21, batch, heads, total, dim)
    mem = RingMemory.empty(batch, heads, capacity, dim, dtype=torch.float32)
    outs, start = [], 0
    for tokens in seg:
        sl = slice(start, start + tokens)
        q, k, v = x["q"][:, :, sl], x["k_new"][:, :, sl], x["v_new"][:, :, sl]
        outs.append(memory_attention(q, k, v, mem))
        pmll_write(mem, k, v)
        start += tokens
    full = ref.causal_attention(x["q"], x["k_new"], x["v_new"])
    _assert_close(torch.cat(outs, dim=2), full, 1e-5, "segmented vs full")


def test_memory_attention_matches_reference_after_wrap_and_reset():
    """Wrapped, gated memory with one sequence reset (length 0) and one partly filled: the
    reference path equals the float64 reference."""
    batch, heads, capacity, dim, tokens = 3, 2, 6, 16, 4
    mem = _seeded_memory(22, batch, heads, capacity, dim, torch.float32, count=[14, 9, 2])
    x = pmll_inputs(23, batch, heads, 9, dim, gate="bht")
    pmll_write(mem, x["k_new"], x["v_new"], x["gate"])
    mem.reset(torch.tensor([1]))
    y = pmll_inputs(24, batch, heads, tokens, dim)
    out = memory_attention(y["q"], y["k_new"], y["v_new"], mem)
    want = ref.memory_attention(y["q"], y["k_new"], y["v_new"], mem.k, mem.v, mem.count)
    _assert_close(out, want, 1e-5, "memory attention")
    # sequence 1 was reset: it sees only its own segment, i.e. vanilla causal attention
    van = ref.causal_attention(y["q"][1:2], y["k_new"][1:2], y["v_new"][1:2])
    _assert_close(out[1:2], van, 1e-5, "reset sequence")


@pytest.mark.parametrize("dtype", DTYPES)
def test_no_memory_is_vanilla_attention(dtype):
    x = pmll_inputs(25, 2, 3, 7, 32, dtype=dtype)
    out = memory_attention(x["q"], x["k_new"], x["v_new"], None)
    assert out.dtype == dtype
    want = ref.causal_attention(x["q"], x["k_new"], x["v_new"])
    # fp32 math on the dtype's inputs; the output is rounded once to the dtype
    _assert_close(out, want, {torch.float32: 1e-5, torch.bfloat16: 8e-3, torch.float16: 1e-3}[dtype],
                  "vanilla")
    empty = RingMemory.empty(2, 3, 4, 32, dtype=dtype)
    assert torch.equal(memory_attention(x["q"], x["k_new"], x["v_new"], empty), out)


# ---- bytes ------------------------------------------------------------------------------------

def test_bytes_moved():
    el = 2
    # ungated: last token per slot only -> min(T, M) rows read + written, k and v, plus count
    assert write_bytes(2, 3, 8, 16, 20, dtype=torch.bfloat16) == 8 * 16 * el * 6 * 2 * 2 + 32
    gated = write_bytes(2, 3, 8, 16, 5, dtype=torch.bfloat16, gate="bht")
    assert gated == 5 * 16 * el * 12 + 5 * 16 * el * 12 * 2 + 2 * 3 * 5 * 4 + 32
    assert read_bytes([3, 8], 3, 8, 16, 2, dtype=torch.float32) == \
        11 * 16 * 4 * 3 * 2 + 2 * 10 * 16 * 4 * 3 * 2 + 16


# ---- bad input --------------------------------------------------------------------------------

def _good(dtype=torch.float32):
    mem = RingMemory.empty(2, 3, 4, 16, dtype=dtype)
    x = pmll_inputs(30, 2, 3, 5, 16, gate="bht", dtype=dtype)
    return mem, x


@pytest.mark.parametrize("case, name", [
    ("k_rank", "k_new"), ("v_rank", "v_new"), ("heads", "k_new"), ("head_dim", "k_new"),
    ("batch", "k_new"), ("v_tokens", "v_new"), ("dtype", "k_new"), ("v_dtype", "v_new"),
    ("device", "k_new"), ("gate_shape", "gate"), ("gate_rank", "gate"), ("gate_dtype", "gate"),
    ("gate_range", "gate"), ("gate_nan", "gate"), ("last_stride", "k_new"), ("mem_type", "mem"),
    ("mem_count", "mem.count"), ("mem_v", "mem.v"), ("neg_count", "mem.count"),
    ("gate_list", "gate"), ("count_strided", "mem.count"),
])
def test_write_bad_input_names_argument(case, name):
    mem, x = _good()
    k, v, g = x["k_new"], x["v_new"], x["gate"]
    if case == "k_rank":
        k = k[0]
    elif case == "v_rank":
        v = v[..., None]
    elif case == "heads":
        k, v = k[:, :2], v[:, :2]
    elif case == "head_dim":
        k, v = k[..., :8], v[..., :8]
    elif case == "batch":
        k, v = k[:1], v[:1]
    elif case == "v_tokens":
        v = v[:, :, :4]
    elif case == "dtype":
        k = k.to(torch.float16)
    elif case == "v_dtype":
        v = v.to(torch.int32)
    elif case == "device":
        k = torch.empty(k.shape, device="meta")
    elif case == "gate_shape":
        g = g[:, :, :4]
    elif case == "gate_rank":
        g = g[..., None]
    elif case == "gate_dtype":
        g = (g > 0.5).to(torch.int64)
    elif case == "gate_range":
        g = g.clone()
        g[1, 2, 3] = 1.5
    elif case == "gate_nan":
        g = g.clone()
        g[0, 0, 0] = float("nan")
    elif case == "last_stride":
        k = torch.empty(2, 3, 5, 32, device=k.device)[..., ::2]
    elif case == "mem_type":
        mem = (mem.k, mem.v, mem.count)
    elif case == "mem_count":
        mem.count = mem.count.to(torch.int32)
    elif case == "mem_v":
        mem.v = mem.v[:, :, :3].contiguous()
    elif case == "neg_count":
        mem.count[1] = -1
    elif case == "gate_list":
        g = [0.5] * 5
    elif case == "count_strided":          # counts [1, 2] as a stride-2 view
        mem.count = torch.tensor([1, 7, 2, 7], device=mem.count.device)[::2]
    before = mem.k.clone() if hasattr(mem, "k") else None
    with pytest.raises(ValueError, match=rf"^{name}:"):
        pmll_write(mem, k, v, g, validate=True)
    if before is not None:
        assert torch.equal(mem.k, before), "nothing may be written before the checks pass"


def test_write_refuses_counts_that_would_overflow():
    """``count += T`` past int64 would wrap to a negative count: refused naming ``k_new`` with
    ``validate=True`` (and always on the host), nothing written; a count just below the limit
    still writes, at the slots the float64 reference picks."""
    mem = _seeded_memory(23, 2, 2, 8, 16, torch.float32)
    top = torch.iinfo(torch.int64).max
    x = pmll_inputs(24, 2, 2, 5, 16)
    k, v = x["k_new"], x["v_new"]
    mem.count.copy_(torch.tensor([top - 4, 3]))
    before = (mem.k.clone(), mem.v.clone(), mem.count.clone())
    with pytest.raises(ValueError, match=r"^k_new: 5 rows past counts of up to "
                                         rf"{top - 4} would overflow mem\.count \(int64\)$"):
        pmll_write(mem, k, v, validate=True)
    assert all(torch.equal(a, b) for a, b in zip((mem.k, mem.v, mem.count), before))
    mem.count.copy_(torch.tensor([top - 5, 3]))
    rk, rv, rc = ref.ring_write(mem.k, mem.v, mem.count, k, v)
    pmll_write(mem, k, v, validate=True)
    _assert_state(mem, rk, rv, rc, 0, "count at the limit")


def test_write_messages_say_what_must_match_and_validate_is_a_bool():
    """A dtype unlike the ring's names the ring as what it must match; ``validate`` is a bool
    (a string's truth would be taken silently); nothing written."""
    mem, x = _good(torch.bfloat16)
    k, v, g = x["k_new"], x["v_new"], x["gate"]
    before = mem.k.clone()
    with pytest.raises(ValueError, match=r"^k_new: dtype must match mem\.k's \(bfloat16\), got float32$"):
        pmll_write(mem, k.float(), v, g)
    with pytest.raises(ValueError, match=r"^v_new: dtype must match mem\.k's \(bfloat16\), got float16$"):
        pmll_write(mem, k, v.half(), g)
    for bad in ("yes", 1, None):
        with pytest.raises(ValueError, match="^validate: expected a bool"):
            pmll_write(mem, k, v, g, validate=bad)
    assert torch.equal(mem.k, before) and mem.count.tolist() == [0, 0]


def test_read_and_memory_bad_input():
    mem, x = _good()
    with pytest.raises(ValueError, match=r"^t_ctx:"):
        pmll_read(mem, -1)
    with pytest.raises(ValueError, match=r"^t_ctx:"):
        pmll_read(mem, 2.0)
    with pytest.raises(ValueError, match=r"^mem.k:"):
        RingMemory(mem.k[0], mem.v[0], mem.count)
    with pytest.raises(ValueError, match=r"^mem.k:"):
        RingMemory(mem.k.transpose(2, 3), mem.v, mem.count)
    with pytest.raises(ValueError, match=r"^mem.k:"):
        RingMemory(mem.k.to(torch.int32), mem.v, mem.count)
    with pytest.raises(ValueError, match=r"^mem.v:"):
        RingMemory(mem.k, mem.v.half(), mem.count)
    with pytest.raises(ValueError, match=r"^mem.count:"):
        RingMemory(mem.k, mem.v, mem.count[:1])
    with pytest.raises(ValueError, match=r"^capacity:"):
        RingMemory.empty(2, 3, 0, 16)
    with pytest.raises(ValueError, match=r"^dtype:"):
        RingMemory.empty(2, 3, 4, 16, dtype=torch.float64)
    for seqs in (torch.tensor([True, False, True]), torch.tensor([0, 2]), [0.5], torch.tensor([[0]]),
                 5, -1, True, "ab", [0, 1.0]):
        with pytest.raises(ValueError, match=r"^seqs:"):
            mem.reset(seqs)
    # a device this machine lacks (no CUDA here, or an index past the last GPU), or no device
    for dev in (f"cuda:{torch.cuda.device_count()}", "bogus", 1.5):
        with pytest.raises(ValueError, match=r"^device:"):
            RingMemory.empty(2, 3, 4, 16, device=dev)
    q = x["q"]
    with pytest.raises(ValueError, match=r"^q:"):
        memory_attention(q[0], x["k_new"], x["v_new"], mem)
    with pytest.raises(ValueError, match=r"^k_ctx:"):
        memory_attention(q, x["k_new"][:, :, :2], x["v_new"], mem)
    with pytest.raises(ValueError, match=r"^v_ctx:"):
        memory_attention(q, x["k_new"], x["v_new"].half(), mem)
    with pytest.raises(ValueError, match=r"^mem:"):
        memory_attention(q[:, :2], x["k_new"][:, :2], x["v_new"][:, :2], mem)
    with pytest.raises(ValueError, match=r"^q:"):
        memory_attention(q.half(), x["k_new"].half(), x["v_new"].half(), mem)


def test_sizes_past_the_device_memory_refused_before_any_allocation(monkeypatch):
    """``t_ctx`` (``pmll_read``) and the ring's sizes (``RingMemory.empty``) whose tensors could
    not fit in the device's memory give ``ValueError`` naming them, not an allocator error; at
    the bound (device memory set to what ``t_ctx = 5`` needs) the read still equals the
    reference, one row more is refused. Nothing is allocated or launched first."""
    from pmll_lab import _checks, cuda_ext
    from pmll_lab.ops.pmll import ring

    mem = _seeded_memory(17, 3, 2, 6, 16, torch.float32)
    for t_ctx in (10**12, 2**62):
        with pytest.raises(ValueError, match=r"^t_ctx: the outputs k_out, v_out \[3, 2, 6 \+ \d+, "
                                             r"16\] would take [\d,]+ bytes, more than the whole memory"):
            pmll_read(mem, t_ctx)
    with pytest.raises(ValueError, match=r"^batch, heads, capacity, head_dim: a ring of k, v "
                                         r"\[2, 3, 1000000000000, 16\]"):
        RingMemory.empty(2, 3, 10**12, 16)

    def never(*args, **kwargs):
        raise AssertionError("allocated or launched before the size check")

    monkeypatch.setattr(_checks, "device_memory", lambda dev: 2 * 3 * 2 * (6 + 5) * 16 * 4)
    k_out, v_out = pmll_read(mem, 5)
    rk, rv = ref.ring_read(mem.k, mem.v, mem.count, 5)
    assert torch.equal(k_out.cpu().double(), rk) and torch.equal(v_out.cpu().double(), rv)
    assert k_out.abs().sum() > 0
    monkeypatch.setattr(torch, "empty", never)
    monkeypatch.setattr(torch, "zeros", never)
    monkeypatch.setattr(ring, "ring_read_kernel", None)
    monkeypatch.setattr(cuda_ext, "require_gpu", never)
    for impl in ("triton", "cuda"):
        with pytest.raises(ValueError, match=rf"^t_ctx: .* would take 9,216 bytes, more than "
                                             rf"the whole memory of {mem.k.device} \(8,448 bytes\)$"):
            pmll_read(mem, 6, impl=impl)
    with pytest.raises(ValueError, match=r"^batch, heads, capacity, head_dim: .* would take 9,240 "):
        RingMemory.empty(3, 2, 12, 16)


# ---- property test ----------------------------------------------------------------------------

@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(
    batch=st.integers(1, 3), heads=st.integers(1, 2), capacity=st.integers(1, 9),
    head_dim=st.sampled_from([8, 16, 20]), segments=st.lists(st.integers(1, 12), min_size=1,
                                                            max_size=3),
    gate=st.sampled_from([None, "bt", "bht"]), t_ctx=st.integers(0, 3),
    seed=st.integers(0, 2**16),
)
def test_property_write_read_match_reference(batch, heads, capacity, head_dim, segments, gate,
                                            t_ctx, seed):
    mem = _seeded_memory(seed, batch, heads, capacity, head_dim, torch.float32)
    rk, rv, rc = _ref_state(mem)
    for s, tokens in enumerate(segments):
        x = pmll_inputs(seed + s, batch, heads, tokens, head_dim, gate=gate)
        pmll_write(mem, x["k_new"], x["v_new"], x["gate"], validate=True)
        rk, rv, rc = ref.ring_write(rk, rv, rc, x["k_new"], x["v_new"], x["gate"])
    _assert_state(mem, rk, rv, rc, 0 if gate is None else TOL[torch.float32])
    k_out, v_out = pmll_read(mem, t_ctx)
    want_k, want_v = ref.ring_read(mem.k, mem.v, mem.count, t_ctx)
    assert torch.equal(k_out.cpu().double(), want_k) and torch.equal(v_out.cpu().double(), want_v)
