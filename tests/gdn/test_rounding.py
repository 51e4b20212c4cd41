"""bf16 / fp16 stores round to nearest, ties to even, on both backends.

Every kernel computes in fp32 and rounds once when it stores a 16-bit value. A GPU rounds to
nearest even; Triton 3.6's interpreter truncated fp32 -> bf16 until ``pmll_lab._interpreter``
patched it. Each test compares a 16-bit store with torch's round-to-nearest-even of the fp32
value the same kernel stores with an fp32 destination (same arithmetic, only the store differs),
bitwise, and checks that truncation would have given other bits (the test can fail).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import pmll_lab  # noqa: F401  (first: picks GPU or the Triton interpreter)
from pmll_lab._interpreter import rne_bf16_bits
from pmll_lab.backend import DEVICE
from pmll_lab.bench import bitwise_equal
from pmll_lab.carry import GdnCarry, gdn_carry_verify
from pmll_lab.conv import conv_chain, conv_update
from pmll_lab.gdn import gdn_chain, gdn_decode
from pmll_lab.inputs import conv_inputs, gdn_inputs
from pmll_lab.pmll import RingMemory, pmll_write

HALF = [torch.bfloat16, torch.float16]


def _truncated_bf16(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> bf16 by dropping the low 16 bits (what the unpatched interpreter stored)."""
    bits = x.float().cpu().contiguous().view(torch.int32) >> 16
    return bits.to(torch.int16).view(torch.bfloat16)


def _check_rounded(got: torch.Tensor, exact32: torch.Tensor) -> None:
    """``got`` (16-bit) equals torch's RNE rounding of ``exact32`` (fp32) bitwise, and for bf16
    differs from truncation somewhere (so the check has teeth)."""
    assert exact32.dtype == torch.float32
    want = exact32.to(got.dtype)
    assert bitwise_equal(got, want), (
        f"{int((got != want).sum())} of {got.numel()} {got.dtype} stores differ from "
        "round-to-nearest-even")
    if got.dtype == torch.bfloat16:
        assert not bitwise_equal(_truncated_bf16(exact32), want), "no element tells RNE apart"


def test_rne_helper_matches_torch():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(4096, generator=gen) * torch.logspace(-40, 38, 4096)
    ties = (0x3F808000 + torch.arange(0, 128, dtype=torch.int32) * 0x10000).view(torch.float32)
    ties = torch.cat([ties, -ties])                         # halfway: even and odd last bits
    special = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), 3.4e38, -3.4e38, 1e-45,
                            -1e-41, 1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8])
    x = torch.cat([x, ties, special])
    got = torch.from_numpy(rne_bf16_bits(x.numpy()).view(np.int16)).view(torch.bfloat16)
    assert bitwise_equal(got, x.to(torch.bfloat16))
    nan = rne_bf16_bits(np.array([np.nan, -np.nan], dtype=np.float32))
    assert all(int(b) & 0x7F80 == 0x7F80 and int(b) & 0x7F for b in nan), "NaN stays NaN"


@pytest.mark.parametrize("layout", ["kv", "vk"])
@pytest.mark.parametrize("dtype", HALF)
def test_gdn_decode_and_chain_outputs_round_to_nearest_even(layout, dtype):
    x = gdn_inputs(3, 3, 2, 4, 32, 32, rows=3, dtype=dtype, state_layout="kv")
    st = x["state"] if layout == "kv" else x["state"].transpose(-1, -2).contiguous()
    rows = [x[n] for n in ("q", "k", "v", "g", "beta")]
    a, b = st.clone(), st.clone()
    o16 = gdn_chain(a, *rows, state_layout=layout)
    o32 = gdn_chain(b, *rows, out_dtype=torch.float32, state_layout=layout)
    assert bitwise_equal(a, b)
    _check_rounded(o16, o32)
    dec = [t[:, 0].contiguous() for t in rows]
    o16 = gdn_decode(st.clone(), *dec, state_layout=layout)
    o32 = gdn_decode(st.clone(), *dec, out_dtype=torch.float32, state_layout=layout)
    _check_rounded(o16, o32)


def test_carry_verify_outputs_round_to_nearest_even():
    """The verify stores in v's dtype. Its fp32 outputs are the chain's (one family, bitwise), so
    its bf16 outputs are the RNE rounding of the chain's fp32 ones."""
    x = gdn_inputs(5, 2, 1, 2, 16, 16, rows=3, dtype=torch.bfloat16, state_layout="kv")
    rows = [x[n] for n in ("q", "k", "v", "g", "beta")]
    carry = GdnCarry.empty(2, 2, 16, 16, state_layout="kv")
    o16, _ = gdn_carry_verify(x["state"].clone(), carry, *rows,
                              slot_tab=torch.arange(2, dtype=torch.int32, device=DEVICE),
                              form="exact", state_layout="kv")
    want32 = gdn_chain(x["state"].clone(), *rows, out_dtype=torch.float32, state_layout="kv")
    _check_rounded(o16, want32)


@pytest.mark.parametrize("out_dtype", [None, torch.float32])
def test_conv_outputs_round_to_nearest_even(out_dtype):
    dim, head = 96, 16
    c = conv_inputs(7, 3, dim, rows=2, dtype=torch.bfloat16)
    kw = dict(qk_channels=32, head_dim=head)
    y16 = conv_chain(c["conv_state"].clone(), c["x"], c["weight"], c["bias"], **kw)
    y32 = conv_chain(c["conv_state"].clone(), c["x"], c["weight"], c["bias"],
                     out_dtype=torch.float32, **kw)
    _check_rounded(y16, y32)
    u16 = conv_update(c["conv_state"].clone(), c["x"][:, 0], c["weight"], c["bias"], **kw)
    _check_rounded(u16, y32[:, 0])


@pytest.mark.parametrize("dtype", HALF)
def test_gated_ring_writes_round_to_nearest_even(dtype):
    """A gated write blends in fp32 and stores in the memory dtype: the 16-bit ring holds the
    RNE rounding of what an fp32 ring holding the same (16-bit-exact) values computes. Two
    passes over the ring (T = 2M) round after each token."""
    B, H, M, D = 2, 2, 8, 32
    gen = torch.Generator().manual_seed(11)
    old = (torch.randn(B, H, M, D, generator=gen)).to(dtype)
    kn = torch.randn(B, H, 2 * M, D, generator=gen).to(dtype)
    vn = torch.randn(B, H, 2 * M, D, generator=gen).to(dtype)
    gate = torch.rand(B, 2 * M, generator=gen)
    count = torch.tensor([3, 0], dtype=torch.int64)

    def ring(dt):
        return RingMemory(old.to(DEVICE, dt, copy=True), old.to(DEVICE, dt, copy=True),
                          count.to(DEVICE, copy=True))

    m16 = pmll_write(ring(dtype), kn.to(DEVICE), vn.to(DEVICE), gate.to(DEVICE))
    # the fp32 reference: token by token, rounded to the 16-bit dtype after each one
    m32 = ring(torch.float32)
    for t in range(2 * M):
        pmll_write(m32, kn[:, :, t:t + 1].float().to(DEVICE), vn[:, :, t:t + 1].float().to(DEVICE),
                   gate[:, t:t + 1].to(DEVICE))
        m32.k.copy_(m32.k.to(dtype).float())
        m32.v.copy_(m32.v.to(dtype).float())
    assert bitwise_equal(m16.k, m32.k.to(dtype)) and bitwise_equal(m16.v, m32.v.to(dtype))
    one = pmll_write(ring(dtype), kn[:, :, :1].to(DEVICE), vn[:, :, :1].to(DEVICE),
                     gate[:, :1].to(DEVICE))
    one32 = pmll_write(ring(torch.float32), kn[:, :, :1].float().to(DEVICE),
                       vn[:, :, :1].float().to(DEVICE), gate[:, :1].to(DEVICE))
    _check_rounded(one.k, one32.k)
