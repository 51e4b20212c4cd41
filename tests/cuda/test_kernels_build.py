"""The CUDA twins compile for sm_90a and their hot kernels do not spill (``kernels/build_check.py``).

Runs without a GPU (nvcc only), on CI as everywhere. Without nvcc the test fails, it does not
skip: CI has CUDA 13.0's nvcc, so a missing one means the check would silently stop checking.
The torch bindings' syntax check (``build_check.py --binding``, 40-50 s each) is not run here.
"""

from __future__ import annotations

import importlib.util
import io
import sys

import pytest
from _paths import ROOT

_spec = importlib.util.spec_from_file_location("build_check", ROOT / "kernels" / "build_check.py")
build_check = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("build_check", build_check)     # its dataclass looks itself up there
_spec.loader.exec_module(build_check)


def _nvcc():
    try:
        return build_check.find_nvcc()
    except FileNotFoundError as exc:
        pytest.fail(str(exc))


def test_every_cu_compiles_for_sm90a_without_hot_spills():
    _nvcc()
    out = io.StringIO()
    failures = build_check.run("sm_90a", out=out)
    text = out.getvalue()
    assert failures == [], "\n".join(failures) + "\n" + text
    # the ring: 3 reads (one per dtype) + 9 gated writes (ring x gate dtype) + 3 plain copies
    ring = [line for line in text.splitlines() if "pmll::" in line or "_ZN4pmll" in line]
    assert "pmll_ring.cu (sm_90a): 30 kernels" in text, text     # each in a 16-byte form too
    assert sum("ring_read_kernel" in line for line in ring) == 3, text
    assert sum("ring_write_kernel" in line for line in ring) == 12, text
    assert sum("ring_read_vec_kernel" in line for line in ring) == 3, text
    assert sum("ring_write_vec_kernel" in line for line in ring) == 12, text
    # the GDN twins: one instantiation per (keys per lane, rows per group) pair -- (4, 8, 16) x
    # (1, 4) and (32, 1) -- x state dtype x input dtype (fp32, bf16, fp16): 7 x 9
    assert "gdn_decode.cu (sm_90a): 63 kernels" in text, text
    assert sum("gdn_decode_vk_kernel" in line for line in ring) == 63, text
    assert "gdn_chain.cu (sm_90a): 63 kernels" in text, text
    assert sum("gdn_chain_vk_kernel" in line for line in ring) == 63, text
    # the carried-state verify likewise; the flush (one row per group) per keys-per-lane value
    # x state dtype
    assert "gdn_carry.cu (sm_90a): 75 kernels" in text, text
    assert sum("gdn_carry_verify_vk_kernel" in line for line in ring) == 63, text
    assert sum("gdn_carry_flush_vk_kernel" in line for line in ring) == 12, text
    assert all(line.lstrip().startswith("hot") for line in ring), text


PTXAS = """\
ptxas info    : Compiling entry function '_Z4fastv' for 'sm_90a'
ptxas info    : Function properties for _Z4fastv
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 30 registers, used 0 barriers, 352 bytes cmem[0]
ptxas info    : Compiling entry function '_Z16ring_write_kernelv' for 'sm_90a'
ptxas info    : Function properties for _Z16ring_write_kernelv
    24 bytes stack frame, 16 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 255 registers, used 0 barriers, 352 bytes cmem[0]
"""


def test_ptxas_report_parsed_and_hot_spill_flagged():
    fast, slow = build_check.parse_ptxas("x.cu", PTXAS)
    assert (fast.kernel, fast.registers, fast.spills, fast.hot) == ("_Z4fastv", 30, False, False)
    assert (slow.registers, slow.spill_stores, slow.spill_loads, slow.stack) == (255, 16, 12, 24)
    assert slow.hot and slow.spills


def test_compile_error_is_reported(tmp_path):
    _nvcc()
    bad = tmp_path / "bad.cu"
    bad.write_text("__global__ void k(float* x) { x[0] = undefined_name; }\n")
    rc, text, kernels = build_check.compile_cu(bad)
    assert rc != 0 and "undefined_name" in text and kernels == []
