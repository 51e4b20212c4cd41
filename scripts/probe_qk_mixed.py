"""Does the V-major chain stay bitwise equal to decodes of its rows when their q/k alignment
hints differ? q/k as views of a fused buffer whose row stride is 8 bytes off 16 every other
row: the chain launches with ``QK_ALIGNED=False``, the decode of row 0 with True, row 1 with
False (``recurrence.vk_qk_aligned``). The interpreter has no layouts (always bitwise); on a GPU
this prints the answer. Usage: python3 scripts/probe_qk_mixed.py
"""
import sys, os
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import pmll_lab, torch  # noqa: E401
from pmll_lab.backend import DEVICE
from pmll_lab.bench import bitwise_equal
from pmll_lab.gdn import gdn_chain, gdn_decode
from pmll_lab.inputs import gdn_inputs
from pmll_lab.ops.gdn.recurrence import vk_qk_aligned
for dtype, kd, B, HK, HV, vd in ((torch.bfloat16, 128, 64, 16, 32, 128), (torch.float32, 64, 64, 16, 32, 64)):
    if DEVICE.type == "cpu": B, HK, HV, kd, vd = 2, 1, 2, 16, 8
    x = gdn_inputs(3, B, HK, HV, kd, vd, rows=2, dtype=dtype)
    pad = 8 // x["q"].element_size()                  # rows 8 bytes off 16 every other K row
    W = 2 * HK * kd + pad
    buf = torch.zeros(B, 2, W, device=DEVICE, dtype=dtype)
    buf[..., :HK * kd] = x["q"].flatten(-2); buf[..., HK * kd:2 * HK * kd] = x["k"].flatten(-2)
    q = buf[..., :HK * kd].unflatten(-1, (HK, kd)); k = buf[..., HK * kd:2 * HK * kd].unflatten(-1, (HK, kd))
    st0 = x["state"].transpose(-1, -2).contiguous()
    st = st0.clone(); o = gdn_chain(st, q, k, x["v"], x["g"], x["beta"], state_layout="vk")
    dec = st0.clone(); same = []
    for t in range(2):
        od = gdn_decode(dec, q[:, t], k[:, t], x["v"][:, t], x["g"][:, t], x["beta"][:, t], state_layout="vk")
        same.append(bitwise_equal(od, o[:, t]))
    print(dtype, "flags chain", vk_qk_aligned(kd, q, k), "rows", [vk_qk_aligned(kd, q[:, t], k[:, t]) for t in range(2)],
          "| chain==decode per row", same, "state", bitwise_equal(st, dec))
