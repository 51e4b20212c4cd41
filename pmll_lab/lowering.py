"""Lower Triton kernels for a GPU target without a GPU, and check what decides bitwise agreement.

Why: the GDN kernels that must agree to the bit (decode, the chain, the exact carried-state
verify; SPEC §2 "Exactness") share their arithmetic (``pmll_lab.ops.gdn.recurrence``), but on a
GPU the order of a ``tl.sum`` also depends on the register layout the compiler gives its operand,
and that layout follows what the launch specialised (16-byte pointer alignment, integer
divisibility by 16). The Triton interpreter, which CI runs, has no layouts, so it cannot see a
kernel that reduces on another layout than decode. This module compiles kernels for ``sm_90``
on the CPU (Triton's own compiler and ptxas) with the specialisation a launch would give, and
compares the layouts of every reduction (``tt.reduce``) in the Triton GPU IR (TTGIR).

Seen on an NVIDIA H200, 2026-11-29 (reports/h200-2026-11-29b): the exact carry kernels, then
specialised on the row pointers, loaded ``q``/``k`` with 4 elements per thread where decode has 1,
so the l2norm and ``k.q`` sums ran in another order and outputs differed from decode in the last
bits. ``python -m pmll_lab.lowering`` prints the comparison; tests/cuda/test_lowering.py asserts it.

Run with ``PMLL_LAB_DEVICE=lower`` set before ``pmll_lab`` is imported (kernels are then compiled,
never interpreted); :func:`lower` raises ``RuntimeError`` otherwise.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping

import triton.language as tl

from pmll_lab.backend import INTERPRET
from pmll_lab.lowering_ir import lane_split_fma_sums, reduction_layouts, sass_stats  # noqa: F401
from pmll_lab.ops.setting_rows import STATE_DTYPES

_TRITON_TYPES = {"i1", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "fp8e4nv", "fp8e5",
                 "fp16", "bf16", "fp32", "fp64"}
_NEEDS_LOWER = ("pmll_lab.lowering needs compiled kernels, but kernels are interpreted here: set "
                "PMLL_LAB_DEVICE=lower (and leave TRITON_INTERPRET unset) before pmll_lab is first "
                "imported, e.g. `PMLL_LAB_DEVICE=lower python -m pmll_lab.lowering`")


STAGES = ("ttir", "ttgir", "llir", "ptx", "cubin")
"""Triton's lowering stages for CUDA, in order (``lower(stage=...)`` stops after one)."""


def lower(kernel, types: Mapping[str, str], constexprs: Mapping[str, object], *,
          num_warps: int = 1, arch: int = 90, unaligned: tuple[str, ...] = (),
          values: Mapping[str, int] | None = None, maxnreg: int | None = None,
          enable_fp_fusion: bool = True, stage: str = "cubin"):
    """Compile ``kernel`` (a ``@triton.jit`` function) for CUDA ``sm_<arch>`` without launching it.

    ``types``: Triton type of every non-constexpr argument by name (``"*bf16"``, ``"i32"``,
    ``"fp32"``...); ``constexprs``: value of every ``tl.constexpr`` argument (one left out
    takes its default, if it has one). Specialisation as a
    launch gives it (Triton 3.6): every pointer 16-byte aligned, unless named in ``unaligned``;
    an integer argument with its value in ``values`` is specialised as a launch would (1 becomes
    a constant, a multiple of 16 gets the divisibility hint), one without is taken as a multiple
    of 16 unless named in ``unaligned``. Arguments the kernel lists in ``do_not_specialize`` get
    nothing; in ``do_not_specialize_on_alignment``, no alignment or divisibility hint.
    ``maxnreg``: a register cap per thread (Triton's launch option), as the V-major kernels may
    launch with. ``enable_fp_fusion``: Triton's launch option (the exact family launches with
    it off, ``recurrence.EXACT_LAUNCH``). Returns Triton's compiled kernel; ``.asm`` holds
    ``"ttir"``, ``"ttgir"``, ``"ptx"``... ``stage``: the last stage run (``STAGES``); before
    ``"cubin"`` the result is an object whose ``.asm`` holds the stages run, nothing cached
    (the register layouts are fixed in ``"ttgir"``: a reduction-layout check needs no more,
    and the later stages are most of the time of a large kernel).
    Raises ``RuntimeError`` when kernels are interpreted (set ``PMLL_LAB_DEVICE=lower``) and
    ``ValueError`` naming an argument missing from ``types``/``constexprs``, a name in ``types``
    or ``unaligned`` that is not a non-constexpr argument of ``kernel``, a type Triton does
    not know, or a ``stage`` not in ``STAGES``.
    """
    if INTERPRET:
        raise RuntimeError(_NEEDS_LOWER)
    if stage not in STAGES:
        raise ValueError(f"stage: expected one of {STAGES}, got {stage!r}")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    runtime_args = {p.name for p in kernel.params if not p.is_constexpr}
    values = dict(values or {})
    for what, names in (("types", types), ("unaligned", unaligned), ("values", values)):
        unknown = sorted(set(names) - runtime_args)
        if unknown:
            raise ValueError(f"{what}: {unknown} are not non-constexpr arguments of "
                             f"{getattr(kernel, '__name__', kernel)}")
    for name, ty in types.items():
        base = ty[1:] if ty.startswith("*") else ty
        if base not in _TRITON_TYPES:
            raise ValueError(f"types: {name!r} has type {ty!r}; expected one of "
                             f"{sorted(_TRITON_TYPES)}, optionally behind '*' for a pointer")

    sig, attrs, consts = {}, {}, {}
    for i, param in enumerate(kernel.params):
        name = param.name
        if param.is_constexpr:
            if name not in constexprs and not param.has_default:
                raise ValueError(f"constexprs: no value for the constexpr argument {name!r}")
            sig[name] = "constexpr"
            consts[(i,)] = constexprs[name] if name in constexprs else param.default
            continue
        if name not in types:
            raise ValueError(f"types: no Triton type for argument {name!r}")
        sig[name] = types[name]
        pointer = types[name].startswith("*")
        integer = types[name] in ("i32", "i64")
        if param.do_not_specialize or not (pointer or integer):
            continue
        if integer and values.get(name) == 1:
            sig[name] = "constexpr"
            consts[(i,)] = 1
            continue
        aligned = (name not in unaligned and not param.do_not_specialize_on_alignment
                   and (pointer or values.get(name, 16) % 16 == 0))
        if aligned:
            attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(fn=kernel, signature=sig, constexprs=consts, attrs=attrs)
    options = {"num_warps": num_warps, "enable_fp_fusion": bool(enable_fp_fusion)}
    if maxnreg is not None:
        options["maxnreg"] = maxnreg
    target = GPUTarget("cuda", arch, 32)
    if stage == "cubin":
        return triton.compile(src, target=target, options=options)
    return _lower_until(src, target, options, stage)


def _lower_until(src, target, options: dict, stage: str):
    """Triton's pipeline (``triton.compile`` without its cache) up to ``stage``; returns an
    object with ``.asm`` ``{stage name: IR text}`` of the stages run."""
    import types as _types

    from triton._C.libtriton import ir
    from triton.compiler.compiler import make_backend

    backend = make_backend(target)
    opts = backend.parse_options(dict(options))
    stages: dict = {}
    backend.add_stages(stages, opts, src.language)
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    module = src.make_ir(target, opts, backend.get_codegen_implementation(opts),
                         backend.get_module_map(), context)
    metadata = {"target": target, **opts.__dict__}
    asm = {}
    for ext, run in stages.items():
        module = run(module, metadata)
        asm[ext] = str(module)
        if ext == stage:
            break
    return _types.SimpleNamespace(asm=asm, metadata=metadata)



def gdn_exact_family(*, head_dim: int = 128, rows: int = 4, heads: tuple[int, int] = (16, 32),
                     input_type: str = "bf16", arch: int = 90,
                     resources: dict | None = None, layout: str = "kv",
                     batch: int = 64, gate: bool = False,
                     state_type: str = "fp32",
                     carry_constexprs: Mapping[str, object] | None = None,
                     stage: str = "cubin", lane_split: dict | None = None
                     ) -> dict[str, set[str]]:
    """Reduction layouts of the kernels that must agree bitwise with GDN decode (SPEC §2):
    ``gdn_rows_kernel`` (decode and the chain), the exact carried-state verify per head and with
    split columns. ``gdn_rows_kernel`` is lowered twice: as decode (``K = 1``, the reference,
    first in the result) and as the chain with snapshots (``K = rows``, ``intermediate`` given;
    key ``"<name>[chain]"``, left out when ``rows == 1``), since Triton lays a block out for
    its widest access and the snapshot store is one more. Each kernel as the launchers launch it (``block_config`` shapes and warps,
    lazy form, l2norm in kernel; contiguous state of ``head_dim x head_dim`` per head, the
    decode launch's integer values). Returns ``{kernel name: set of reduction layouts}``: the
    family agrees when every set equals decode's. A dict passed as ``resources`` is filled with
    each kernel's :func:`sass_stats`. ``layout="vk"`` lowers the V-major family instead
    (``gdn_rows_vk_kernel``, ``gdn_carry_exact_vk_kernel``; tile from ``vk_config`` for
    ``batch * HV`` work units). ``gate=True`` lowers every kernel with the gating computed in
    it (``GATE``, ``a, b`` in the input type); ``state_type`` ("fp32", "bf16", "fp16") is the
    state pool's element type (snapshots too). ``carry_constexprs`` overrides constexprs of the
    verify kernels only (a test of the check itself: a V-major verify lowered with
    ``QK_ALIGNED=False`` under a hinted decode must show another layout). ``stage``: the last
    lowering stage run (:func:`lower`; ``"ttgir"`` holds the layouts and is all the check
    needs; ``"cubin"``, the default, also has ptxas accept every kernel). A dict passed as
    ``lane_split`` is filled with each kernel's ``lane_split_fma_sums`` (should be empty:
    lanes that round a key sum differently break replay even on decode's layouts). Raises
    ``ValueError`` for ``rows`` outside ``1..8``, ``head_dim < 1``, value heads not a
    multiple of key heads, a ``state_type`` not in ``STATE_TYPES``, or ``resources`` with a
    ``stage`` before ``"cubin"``, and
    ``RuntimeError`` as :func:`lower` does."""
    from pmll_lab.ops.carry import exact_kernels as E
    from pmll_lab.ops.carry.stash import GDN_CARRY_CAP

    if not 1 <= rows <= GDN_CARRY_CAP:
        raise ValueError(f"rows: must lie in 1..{GDN_CARRY_CAP}, got {rows}")
    if head_dim < 1:
        raise ValueError(f"head_dim: must be >= 1, got {head_dim}")
    if heads[0] < 1 or heads[1] % heads[0]:
        raise ValueError(f"heads: value heads {heads[1]} must be a multiple of key heads {heads[0]}")
    if state_type not in _STATE_DTYPES:
        raise ValueError(f"state_type: expected one of {', '.join(_STATE_DTYPES)}, got "
                         f"{state_type!r}")
    if resources is not None and stage != "cubin":
        raise ValueError(f"resources: SASS statistics need stage='cubin', got stage={stage!r}")
    if INTERPRET:
        raise RuntimeError(_NEEDS_LOWER)
    from pmll_lab.ops import settings
    from pmll_lab.ops.gdn import decode as D
    from pmll_lab.ops.gdn.recurrence import (EXACT_LAUNCH, block_config, check_layout,
                                             kv_state_vector, vk_chunk_meta, vk_config,
                                             vk_qk_rows_fit, vk_state_vector)

    check_layout("layout", layout)
    HK, HV = heads
    state_dtype = _STATE_DTYPES[state_type]
    if layout == "vk":
        from pmll_lab.ops.gdn.decode_vk import gdn_rows_vk_kernel

        BK, BV, warps = vk_config(head_dim, head_dim, batch * HV, state_dtype=state_dtype)
        BV_carry = vk_config(head_dim, head_dim, batch * HV, "carry", state_dtype=state_dtype)[1]
        rows_kernel, carry_kernels = gdn_rows_vk_kernel, (E.gdn_carry_exact_vk_kernel,)
        chunks = vk_chunk_meta(BK)
    else:
        BK, BV, warps = block_config(head_dim, head_dim)
        BV_carry = BV
        chunks = {}
        rows_kernel = D.gdn_rows_kernel
        carry_kernels = (E.gdn_carry_exact_kernel, E.gdn_carry_exact_split_kernel)
    gate_t = f"*{input_type}" if gate else "*fp32"
    rows_t = {n: f"*{input_type}" for n in ("q", "k", "v", "o")} | {"g": gate_t, "beta": gate_t}
    dec_types = {"state": f"*{state_type}", "inter": f"*{state_type}", "slot_idx": "*i32",
                 "out_idx": "*i32",
                 "A_log": "*fp32", "dt_bias": "*fp32", "scale": "fp32", **rows_t}
    dec_types = {p.name: dec_types.get(p.name, "i32") for p in rows_kernel.params
                 if not p.is_constexpr}
    # V-major: the value-row strides are constexprs and q/k rows carry the alignment hint
    # (``recurrence.vk_qk_aligned``), as the launchers pass them.
    itemsize = {"bf16": 2, "fp16": 2, "fp32": 4}.get(input_type, 4)
    ahead = settings.vk_ahead_row(batch * HV)
    vk_meta = (dict(s_row=head_dim, i_r=head_dim, AHEAD=ahead.rows_ahead,
                    QK_ALIGNED=vk_qk_rows_fit(head_dim, itemsize)) if layout == "vk" else {})
    if layout == "kv":              # decode's state vector cap, in every K-major exact kernel
        vk_meta = dict(STATE_VEC=kv_state_vector(head_dim, head_dim,
                                                 settings.state_bytes(state_dtype)))
    vk_carry = (dict(AHEAD=ahead.verify_rows_ahead(state_dtype),
                     STASH_AHEAD=ahead.stash_rows_ahead, QK_ALIGNED=vk_meta["QK_ALIGNED"],
                     STATE_VEC=vk_state_vector(head_dim, head_dim, batch * HV, state_dtype))
                if layout == "vk" else dict(vk_meta))
    rows_values = dict(HV=HV, GROUP=HV // HK, s_slot=HV * head_dim * head_dim,
                       s_head=head_dim * head_dim,
                       **({"s_key": head_dim} if layout == "kv" else {}))

    def lower_rows(k_rows: int, snapshots: bool):
        # decode: K = 1, no snapshots; the chain: K rows, snapshots [B, K-1, HV, ...] as
        # gdn_chain(intermediate=...) passes them (their strides are specialised)
        values = dict(rows_values)
        if snapshots:
            values.update(i_h=head_dim * head_dim, i_t=HV * head_dim * head_dim,
                          i_b=(k_rows - 1) * HV * head_dim * head_dim,
                          **({"i_k": head_dim} if layout == "kv" else {}))
        return lower(rows_kernel, dec_types,
                     dict(KD=head_dim, VD=head_dim, K=k_rows, BK=BK, BV=BV, HAS_IDX=True,
                          STORE_INTER=snapshots, USE_QK_L2NORM=True,
                          UNROLL=k_rows <= settings.gdn().chain_unroll_max_rows,
                          HAS_OUT_IDX=False, GATE=gate, **chunks, **vk_meta),
                     num_warps=warps, arch=arch, stage=stage, **EXACT_LAUNCH, values=values)

    dec = lower_rows(1, False)
    chain = lower_rows(rows, True) if rows > 1 else None
    carry_types = {f"{n}_ptr": t for n, t in rows_t.items()} | {
        "state_ptr": f"*{state_type}", "stash_ptr": "*fp32", "pend_ptr": "*i32", "slot_ptr": "*i32",
        "engaged_ptr": "*i32", "arrive_ptr": "*i32", "spec_slot_ptr": "*i32", "alog_ptr": "*fp32", "dtb_ptr": "*fp32",
        "scale": "fp32"}
    meta = dict(K=rows, CAP=GDN_CARRY_CAP, HV=HV, GROUP=HV // HK, KD=head_dim, VD=head_dim,
                BK=BK, BV=BV_carry, NV=-(-head_dim // BV_carry), LAZY=True, USE_QK_L2NORM=True,
                PREFETCH=settings.carry().carry_prefetch_rows,
                UNROLL=rows <= settings.carry().exact_unroll_max_rows, GATE=gate,
                **chunks, **vk_carry, **({"SPEC_STORE": False} if layout == "vk" else {}))
    meta.update(carry_constexprs or {})
    def layouts_of(low) -> set[str]:
        # V-major tiles may differ in their row count (vk_tiles: decode and the carry), never in
        # how a row is spread over threads: compare with the leading dim written as BR.
        found = set(reduction_layouts(low.asm["ttgir"]))
        return {re.sub(r"^\d+x", "BRx", lay) for lay in found} if layout == "vk" else found

    compiled = {rows_kernel.__name__: dec}
    if chain is not None:
        compiled[f"{rows_kernel.__name__}[chain]"] = chain
    out = {name: layouts_of(low) for name, low in compiled.items()}
    for kern in carry_kernels:
        types = dict(carry_types)
        for p in kern.params:
            types.setdefault(p.name, "i32")
        types = {p.name: types[p.name] for p in kern.params if not p.is_constexpr}
        low = lower(kern, types, meta, num_warps=warps, arch=arch, stage=stage, **EXACT_LAUNCH,
                    values=dict(stride_state=HV * head_dim * head_dim))
        out[kern.__name__] = layouts_of(low)
        compiled[kern.__name__] = low
    if resources is not None:
        resources.update({name: sass_stats(k) for name, k in compiled.items()})
    if lane_split is not None:
        lane_split.update({name: lane_split_fma_sums(k.asm["ttgir"])
                           for name, k in compiled.items()})
    return out


HEAD_DIMS = (16, 32, 64, 128, 256)
"""Head sizes (``kd = vd``) the launch-table check (``launch_cases``) lowers: every size
Qwen3-Next-style models and the notebooks' grids use."""
_STATE_DTYPES = {str(getattr(tl, name)): name for name in STATE_DTYPES}
"""The state pool types the launch tables have rows for (``settings.STATE_DTYPES``), Triton's
names (``fp32``) to torch's (``float32``)."""
STATE_TYPES = tuple(_STATE_DTYPES)


def table_batches(num_v_heads: int = 32) -> tuple[int, ...]:
    """One batch ``B`` per range of work units ``B * num_v_heads`` in which the V-major launch
    tables (``settings.gdn().vk_tiles``, ``.vk_ahead``, ``.vk_rows_half``) pick a different row: the largest
    ``B`` inside each closed range and the smallest beyond the last bound (a range holding no
    multiple of ``num_v_heads`` is left out). K-major launches depend on the head size only
    (``block_config``). Read from the tables now, so a new row is checked without an edit."""
    from pmll_lab.ops import settings

    gdn = settings.gdn()
    bounds = sorted({row.max_work for table in (gdn.vk_tiles, gdn.vk_ahead, gdn.vk_rows_half)
                     for row in table})
    out, lo = [], 0
    for hi in bounds:
        if hi == bounds[-1]:                  # the open last row: past every closed bound
            out.append(lo // num_v_heads + 1)
            break
        if hi // num_v_heads * num_v_heads > lo:
            out.append(hi // num_v_heads)
        lo = hi
    return tuple(dict.fromkeys(out))


def launch_cases(head_dims=HEAD_DIMS, state_types=STATE_TYPES, heads: tuple[int, int] = (16, 32)
                 ) -> list[dict]:
    """Every (layout, head size, state type, tile) the launch tables can pick, as keyword
    arguments of :func:`gdn_exact_family`: K-major once per head size and state type, V-major
    at each of ``table_batches`` too. The largest lowerings first (kd = 256 K-major's per-head
    verify unrolls its 16 column blocks: the longest by far)."""
    cases = [dict(layout="kv", head_dim=d, state_type=t, heads=heads)
             for d in head_dims for t in state_types]
    cases += [dict(layout="vk", head_dim=d, state_type=t, batch=b, heads=heads)
              for d in head_dims for t in state_types for b in table_batches(heads[1])]
    return sorted(cases, key=lambda c: (-c["head_dim"] * (4 if c["layout"] == "kv" else 1)))


def family_mismatches(case: Mapping) -> dict[str, list[str]]:
    """``gdn_exact_family(**case, stage="ttgir")``'s kernels that reduce on a layout decode does
    not use (or on none), or split an FMA key sum's first combine across lanes
    (``lane_split_fma_sums``, decode included): ``{kernel: what}``, empty when the family
    agrees."""
    split: dict = {}
    fam = gdn_exact_family(**case, stage="ttgir", lane_split=split)
    ref = next(iter(fam.values()))
    out = {name: sorted(lay - ref) or ["no reduction"] for name, lay in fam.items()
           if lay - ref or not lay}
    for name, sums in split.items():
        if sums:
            out.setdefault(name, []).extend(f"lane-split fma sum: {x}" for x in sums)
    return out


def check_launch_cases(cases: list[dict], jobs: int = 1) -> list[tuple[dict, dict]]:
    """``(case, family_mismatches(case))`` for every case, lowered in ``jobs`` processes (each
    lowering is one CPU core's work; ``jobs > 1`` spawns fresh interpreters, which inherit
    ``PMLL_LAB_DEVICE``). Raises ``ValueError`` naming ``jobs`` unless it is a positive int."""
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs: must be a positive int, got {jobs!r}")
    if jobs == 1:
        return [(c, family_mismatches(c)) for c in cases]
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        return list(zip(cases, pool.map(family_mismatches, cases)))


def _main_all(jobs: int) -> int:
    """``--all``: every launch case (``launch_cases``), one line each; exit 1 on a mismatch."""
    bad = 0
    for case, miss in check_launch_cases(launch_cases(), jobs):
        what = " ".join(f"{k}={v}" for k, v in case.items() if k != "heads")
        bad += bool(miss)
        print(f"{what}: " + (f"NOT as decode: {miss}" if miss else "all as in decode"),
              flush=True)
    print(f"{len(launch_cases()) - bad} of {len(launch_cases())} launch cases reduce on "
          "decode's layouts")
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    """``python -m pmll_lab.lowering [--head-dim D] [--rows K] [--input-type T] ...``: print the
    GDN exact family's reduction layouts (``--all [--jobs N]``: of every launch case); exit 1 when a kernel reduces on a layout decode does not
    use, or has no reduction at all (a lowering that lost the recurrence); exit 2, with a
    one-line message, when kernels are interpreted (``PMLL_LAB_DEVICE=lower`` not set)."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m pmll_lab.lowering",
                                 description="Compare the sm_90 reduction layouts of the GDN "
                                             "kernels that must agree bitwise with decode "
                                             "(run with PMLL_LAB_DEVICE=lower).")
    ap.add_argument("--head-dim", type=int, default=128, help="kd = vd (default 128)")
    ap.add_argument("--rows", type=int, default=4, help="draft rows K (default 4)")
    ap.add_argument("--input-type", default="bf16", help="q/k/v/o type: bf16, fp16, fp32")
    ap.add_argument("--layout", default="kv", help="state layout: kv (K-major) or vk (V-major)")
    ap.add_argument("--batch", type=int, default=64, help="B for the V-major tile (default 64)")
    ap.add_argument("--state-type", default="fp32", help="state pool type: fp32, bf16, fp16")
    ap.add_argument("--gate", action="store_true",
                    help="lower the kernels with the gating computed in them (a, b inputs)")
    ap.add_argument("--resources", action="store_true",
                    help="also print registers, stack (spills) and SASS instruction counts")
    ap.add_argument("--all", action="store_true",
                    help="check every head size, layout, state type and tile the launch tables "
                         "can pick (launch_cases; the other options are ignored)")
    ap.add_argument("--jobs", type=int, default=1, help="processes for --all (default 1)")
    args = ap.parse_args(argv)
    if INTERPRET:       # a one-line error, not a traceback from deep in the lowering
        print(f"error: {_NEEDS_LOWER}", file=sys.stderr)
        return 2
    if args.all:
        return _main_all(args.jobs)
    res = {} if args.resources else None
    split: dict = {}
    fam = gdn_exact_family(head_dim=args.head_dim, rows=args.rows, input_type=args.input_type,
                           resources=res, layout=args.layout, batch=args.batch,
                           gate=args.gate, state_type=args.state_type, lane_split=split)
    ref = next(iter(fam.values()))
    bad = 0
    for name, layouts in fam.items():
        extra = layouts - ref
        bad += bool(extra) or not layouts or bool(split.get(name))
        print(f"{name}: {len(layouts)} reduction layouts"
              + (f", NOT in decode: {sorted(extra)}" if extra else ", all as in decode")
              + (f"; lane-split FMA sums: {split[name]}" if split.get(name) else ""))
    for name, st in (res or {}).items():
        mix = st["mix"]
        print(f"{name}: {st['registers']} registers, {st['stack_bytes']} B stack, "
              f"{st['instructions']} SASS instructions (FFMA {mix.get('FFMA', 0)}, "
              f"FMUL {mix.get('FMUL', 0)}, FADD {mix.get('FADD', 0)}, SHFL {mix.get('SHFL', 0)})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
