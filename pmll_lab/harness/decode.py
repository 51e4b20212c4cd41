"""The ``gdn_decode`` family: one Gated DeltaNet decode token per sequence (SPEC §2).

The case (``DecodeCase``): Qwen3-Next's gating inputs (``A_log, a, dt_bias, b``: the decay and
write strength computed in the kernel), bf16 ``q, k [B, HK, kd]``, ``v [B, HV, vd]``, a V-major
state pool ``[B, HV, vd, kd]`` in ``state_dtype``, slots a permutation (``StepCase``'s draw at
one row). The check: outputs and the addressed states after one token against
``reference.gdn.gdn_decode_ref`` in float64 (the state rounded to a 2-byte pool where the kernels
round it), within ``O_TOL`` and ``STATE_TOL`` / ``HALF_STATE_TOL``. The timed unit: one launch
(the state advances on every call, as in serving).

Implementations: ours (Triton, and the CUDA C++ twin) and FlashInfer's; a researcher's own with
``decode_run`` (``docs/adding-a-kernel.md``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from pmll_lab import sizes
from pmll_lab.bench import errors
from pmll_lab.gdn import gdn_decode
from pmll_lab.harness.registry import Family, Implementation, add_family, register
from pmll_lab.harness.step import StepCase
from pmll_lab.harness.step_forms import cuda_supports, fi_available, fi_supports
from pmll_lab.peers import flashinfer_decode_runner, flashinfer_version, fused_gating
from pmll_lab.reference.gdn import gdn_decode_ref
from pmll_lab.tolerances import HALF_STATE_TOL, O_TOL, STATE_TOL


class DecodeCase(StepCase):
    """A ``StepCase`` of one step of one row: ``inputs()`` gives the decode's arguments."""

    def inputs(self) -> dict:
        """``q, k [B, HK, kd]``, ``v [B, HV, vd]``, ``a, b [B, HV]`` in ``dtype``; ``A_log,
        dt_bias [HV]`` fp32; ``state_indices [B]`` int32; ``scale``."""
        r = self.rows_of(0)
        out = {n: r[n][:, 0] for n in ("q", "k", "v", "a", "b")}
        return dict(out, A_log=r["A_log"], dt_bias=r["dt_bias"],
                    state_indices=self.tensors["slots"], scale=self.scale)


class DecodeRun:
    """One implementation's decode on its own copy of the case's state pool: ``run()`` one
    launch (graph-capturable, advancing the pool), ``o`` its last output ``[B, HV, vd]``,
    ``state`` the pool. ``launch(state, **inputs) -> o`` is the implementation's call."""

    def __init__(self, case: DecodeCase, launch: Callable):
        self.case, self._launch = case, launch
        self.state = case.tensors["state"].clone()
        self.inputs = case.inputs()
        self.o = None

    def run(self):
        self.o = self._launch(self.state, **self.inputs)
        return self.o

    def outputs(self):
        return [self.o] if self.o is not None else []

    def cursors(self):
        return []


def decode_run(launch: Callable) -> Callable[[DecodeCase], DecodeRun]:
    """An implementation's ``build`` from its launch ``launch(state, q, k, v, a, b, A_log,
    dt_bias, state_indices, scale) -> o [B, HV, vd]`` (keywords), which advances the V-major
    ``state [S, HV, vd, kd]`` pool's addressed slots by one token in place."""
    return lambda case: DecodeRun(case, launch)


def check(run: DecodeRun, case: DecodeCase, plain=None) -> dict:
    """One launch against ``gdn_decode_ref`` in float64: ``errors["o"]`` (every sequence) and
    ``errors["state"]`` (every addressed slot), rel L2 within the dtype's tolerance.
    ``ValueError`` for outputs not ``[B, HV, vd]`` in the inputs' dtype (a kernel that returns
    fp32 outputs would otherwise be held to a tolerance it does not meet the contract of)."""
    x = run.inputs
    g, beta = fused_gating(x["A_log"].cpu(), x["a"].cpu(), x["dt_bias"].cpu(), x["b"].cpu())
    sd = case.state_dtype
    o_ref, s_ref = gdn_decode_ref(
        case.tensors["state"].double().cpu(), x["q"].cpu(), x["k"].cpu(), x["v"].cpu(), g,
        beta, state_indices=x["state_indices"].cpu(), scale=x["scale"], state_layout="vk",
        state_dtype=None if sd == torch.float32 else sd)
    o = run.run()
    v = x["v"]
    if not isinstance(o, torch.Tensor) or o.dtype != v.dtype or tuple(o.shape) != tuple(v.shape):
        got = f"{o.dtype} {tuple(o.shape)}" if isinstance(o, torch.Tensor) else type(o).__name__
        raise ValueError(f"outputs: must be [B, HV, vd] = {tuple(v.shape)} in the inputs' dtype "
                         f"{v.dtype}, got {got}")
    slots = x["state_indices"].long().cpu()
    e_o = errors(o.float().cpu(), o_ref)["rel_l2"]
    e_s = errors(run.state.double().cpu()[slots], s_ref[slots])["rel_l2"]
    tol_o = O_TOL[case.dtype]
    tol_s = STATE_TOL if sd == torch.float32 else HALF_STATE_TOL[sd]
    return {"errors": {"o": e_o, "state": e_s}, "tolerance": {"o": tol_o, "state": tol_s},
            "passed": e_o <= tol_o and e_s <= tol_s}


def make_case(p: dict) -> DecodeCase:
    """A ``DecodeCase`` of a workload row (``B, HK, HV, head_dim, state_dtype``; ``dtype``,
    ``seed`` optional)."""
    return DecodeCase(batch=int(p["B"]), rows=1, num_k_heads=int(p["HK"]),
                      num_v_heads=int(p["HV"]), head_dim=int(p["head_dim"]), steps=1,
                      dtype=getattr(torch, p.get("dtype", "bfloat16")),
                      state_dtype=getattr(torch, p["state_dtype"]), seed=int(p.get("seed", 0)))


def decode_bytes(case: DecodeCase, facts=None) -> int:
    """The fewest bytes one decode moves (``sizes.decode_bytes``): each state read and written
    once, one row in and out."""
    d = case.head_dim
    return sizes.decode_bytes(case.batch, case.num_k_heads, case.num_v_heads, d, d,
                              dtype=case.dtype, state_dtype=case.state_dtype,
                              out_dtype=torch.bfloat16)


FAMILY = add_family(Family(
    name="gdn_decode", label="one GDN decode token per sequence (V-major state pool)",
    axes=("B", "HK", "HV", "head_dim", "state_dtype", "dtype", "seed"), make_case=make_case,
    check=check, doc="SPEC §2: the recurrence every other form must agree with"))


def _ours(impl: str):
    def launch(state, *, state_indices, scale, **x):
        return gdn_decode(state, x["q"], x["k"], x["v"], A_log=x["A_log"], a=x["a"],
                          dt_bias=x["dt_bias"], b=x["b"], state_indices=state_indices,
                          state_layout="vk", scale=scale, impl=impl)
    return launch


def _fi_build(case: DecodeCase) -> DecodeRun:
    run = DecodeRun(case, None)
    x = run.inputs
    call, bufs = flashinfer_decode_runner(
        x["q"][:, None], x["k"][:, None], x["v"][:, None], x["A_log"], x["a"][:, None],
        x["dt_bias"], x["b"][:, None], run.state, x["state_indices"], scale=x["scale"])
    run._launch = lambda state, **_: (call(), bufs["o"][:, 0])[1]
    return run


DECODE = register(Implementation(
    name="decode", family="gdn_decode", label="GDN decode (Triton)", exact=True,
    build=decode_run(_ours("triton")), bytes=decode_bytes, style={"color": "#9467bd"},
    doc="ops/gdn/decode_vk.py: one program per (sequence, value head, row block)"))
DECODE_CUDA = register(Implementation(
    name="decode_cuda", family="gdn_decode", label="GDN decode, CUDA C++ twin", impl="cuda",
    exact=True, gpu_only=True, build=decode_run(_ours("cuda")), supports=cuda_supports,
    style={"color": "#ff7f0e"},
    bytes=decode_bytes, doc="kernels/gdn_decode.cu"))
FLASHINFER_DECODE = register(Implementation(
    name="flashinfer_decode", family="gdn_decode", label="FlashInfer decode (pretranspose)",
    provider="flashinfer", impl="cute-dsl", gpu_only=True, state_dtypes=("float32", "bfloat16"),
    build=_fi_build, supports=fi_supports, version=flashinfer_version, bytes=decode_bytes,
    style={"color": "#8c564b", "panel": "peers"},
    available=fi_available))
