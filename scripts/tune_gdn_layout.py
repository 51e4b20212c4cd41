"""GPU-only exploration: which block shape / warp count makes the shared GDN row fastest?

Times a K-row chain kernel built on pmll_lab.ops.gdn.recurrence.gdn_row for several
(BV, num_warps) configs, in three variants: decode-like (read + write state), chain-like
(read + write state, K rows) and read-only (lazy carry-like: state read once, outputs written).
Also measures the copy roofline and FLA's fused_recurrent_gated_delta_rule for comparison.
Results go to reports/perf-notes.md by hand; raw table printed and written to $OUT if set.

Usage on the H200:  python3 scripts/tune_gdn_layout.py
"""

import os
import sys

import torch
import triton
import triton.language as tl
import triton.testing

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import pmll_lab  # noqa: E402,F401
from pmll_lab.bench import copy_bandwidth  # noqa: E402
from pmll_lab.ops.gdn.recurrence import gdn_row, qk_prepare  # noqa: E402


@triton.jit
def _chain(h_ptr, q_ptr, k_ptr, v_ptr, g_ptr, b_ptr, o_ptr, K, HK, HV, scale,
           KD: tl.constexpr, VD: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
           WRITE_STATE: tl.constexpr):
    i_bh = tl.program_id(0)
    i_v = tl.program_id(1)
    b = i_bh // HV
    hv = i_bh % HV
    hk = hv // (HV // HK)
    rk = tl.arange(0, BK)
    rv = i_v * BV + tl.arange(0, BV)
    mk = rk < KD
    mv = rv < VD
    hp = h_ptr + (b * HV + hv).to(tl.int64) * KD * VD + rk[:, None] * VD + rv[None, :]
    h = tl.load(hp, mask=mk[:, None] & mv[None, :], other=0.0)
    for t in range(K):
        row = b * K + t
        q = tl.load(q_ptr + (row * HK + hk) * KD + rk, mask=mk, other=0.0).to(tl.float32)
        k = tl.load(k_ptr + (row * HK + hk) * KD + rk, mask=mk, other=0.0).to(tl.float32)
        v = tl.load(v_ptr + (row * HV + hv) * VD + rv, mask=mv, other=0.0).to(tl.float32)
        g = tl.load(g_ptr + row * HV + hv)
        beta = tl.load(b_ptr + row * HV + hv)
        q, k = qk_prepare(q, k, scale, True)
        h, o, u = gdn_row(h, q, k, v, g, beta)
        tl.store(o_ptr + (row * HV + hv) * VD + rv, o.to(o_ptr.dtype.element_ty), mask=mv)
    if WRITE_STATE:
        tl.store(hp, h, mask=mk[:, None] & mv[None, :])


def run(B, K, HK, HV, D, BV, W, write_state, dtype=torch.bfloat16):
    dev = "cuda"
    torch.manual_seed(0)
    h = torch.randn(B, HV, D, D, device=dev) * 0.1
    q = torch.randn(B, K, HK, D, device=dev, dtype=dtype)
    k = torch.randn(B, K, HK, D, device=dev, dtype=dtype)
    v = torch.randn(B, K, HV, D, device=dev, dtype=dtype)
    g = -torch.rand(B, K, HV, device=dev)
    beta = torch.rand(B, K, HV, device=dev)
    o = torch.empty_like(v)
    grid = (B * HV, triton.cdiv(D, BV))

    def f():
        _chain[grid](h, q, k, v, g, beta, o, K, HK, HV, D ** -0.5, KD=D, VD=D, BK=D, BV=BV,
                     WRITE_STATE=write_state, num_warps=W)
    f()
    ms = triton.testing.do_bench(f, warmup=25, rep=100, return_mode="median")
    hb = HV * D * D * 4
    nbytes = B * (hb * (2 if write_state else 1) + K * (2 * HK * D * 2 + 2 * HV * D * 2 + 8 * HV))
    return ms * 1e3, nbytes / (ms * 1e-3) / 1e9


def fla_time(B, K, HK, HV, D):
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
    dev = "cuda"
    q = torch.randn(B, K, HK, D, device=dev, dtype=torch.bfloat16)
    k = torch.randn(B, K, HK, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn(B, K, HV, D, device=dev, dtype=torch.bfloat16)
    g = -torch.rand(B, K, HV, device=dev)
    beta = torch.rand(B, K, HV, device=dev)
    h0 = torch.randn(B, HV, D, D, device=dev) * 0.1
    q = q.repeat_interleave(HV // HK, dim=2)
    k = k.repeat_interleave(HV // HK, dim=2)

    def f():
        return fused_recurrent_gated_delta_rule(q=q, k=k, v=v, g=g, beta=beta, initial_state=h0,
                                                output_final_state=True, use_qk_l2norm_in_kernel=True)
    f()
    return triton.testing.do_bench(f, warmup=25, rep=100, return_mode="median") * 1e3


def main():
    roof = copy_bandwidth()
    print(f"device {torch.cuda.get_device_name()}  copy roofline {roof:.0f} GB/s", flush=True)
    HK, HV, D = 16, 32, 128
    lines = []
    for B, K, ws in [(64, 1, True), (64, 4, True), (64, 4, False), (128, 4, False)]:
        for BV in (8, 16, 32, 64):
            for W in (1, 2, 4, 8):
                if BV * D // (32 * W) < 4:
                    continue
                try:
                    us, gbps = run(B, K, HK, HV, D, BV, W, ws)
                except Exception as e:  # noqa: BLE001
                    print(f"B={B} K={K} write={ws} BV={BV} W={W} FAILED {type(e).__name__}: {str(e)[:80]}")
                    continue
                line = f"B={B:3d} K={K} write={int(ws)} BV={BV:3d} W={W}  {us:8.1f} us  {gbps:6.0f} GB/s  {gbps/roof:5.1%}"
                print(line, flush=True)
                lines.append(line)
    for B, K in [(1, 1), (64, 1), (64, 4), (128, 4)]:
        try:
            us = fla_time(B, K, HK, HV, D)
            print(f"FLA fused_recurrent B={B} K={K}: {us:.1f} us", flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"FLA failed: {type(e).__name__}: {e}")
            break


if __name__ == "__main__":
    main()
