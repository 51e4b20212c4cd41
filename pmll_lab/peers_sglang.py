"""SGLang's Gated DeltaNet speculative-verify kernels as peers (optional, imported at run time).

Read from SGLang 0.5.23 (``pip install --no-deps sglang==0.5.23``). Three Triton modules of
``sglang/kernels/ops/attention/linear/`` are loaded, nothing else of SGLang:
``fused_sigmoid_gating_recurrent.py`` (the recurrent kernel), ``gdn_replayssm_spec_fold.py`` (the
exact fold) and ``gdn_replayssm_spec_decode.py`` (the ReplaySSM ring). The state pool is
``temporal [layers, slots, HV, V, K]`` (V-major, K contiguous: our ``state_layout="vk"``), fp32
by default under ``--enable-linear-replayssm-spec`` (``--mamba-ssm-dtype`` bf16 or fp16 allowed);
padding lanes carry slot -1 (``null_block_id=-1``); ``A_log, dt_bias [HV]`` fp32, ``a, b`` per
token; the gates are formed in the kernels (softplus threshold 20, ``beta = 1/(1+exp(-b))``),
q and k l2-normalised there; ``accept_lens`` count the accepted rows with the bonus token
(``1..K``). How its backend drives them (``GDNAttnBackend.forward_extend`` in
``srt/layers/attention/linear/gdn_backend.py``, the commit in ``commit_mamba_states_after_verify``
of ``srt/speculative/spec_utils.py``, buffers in ``MambaPool`` of ``srt/mem_cache/memory_pool.py``):

(a) **Fold-every-commit** (exact carried state), ``form="sglang_exact_fold"``. Per layer the
verify is ``fused_sigmoid_gating_delta_rule_update(q, k, v [1, B*K, heads, dim], a, b
[B*K, HV], cu_seqlens=arange(0, B*K+1, K), use_qk_l2norm_in_kernel=True, softplus_beta=1.0,
softplus_threshold=20.0, is_kda=False, disable_state_update=True, cache_ring=True,
replayssm_rawv, replayssm_rawk, replayssm_g, replayssm_beta)``: the recurrence over the ``K``
rows from the stored state, never written, each row's raw ``v [S, HV, K, V]``, pre-norm ``k
[S, HK, K, K]`` (activation dtype) and the fp32 ``g, beta [S, HV, K]`` stored at rows ``0..K-1``
of a window keyed by the state slot. After acceptance, once for all layers,
``commit_gdn_replayssm_fold_all_layers(temporal, rawv, rawk, g, beta, slots, accept_lens,
max_cache_len=K, num_k_heads, null_block_id=-1)`` replays rows ``0..a-1`` into the state
(``gdn_replayssm_exact_fold_kernel``, one program per 32 columns of a (sequence, head)). No
cursor: every verify starts from the committed state. Its docstring states the fold equals the
recurrent kernel's update bit for bit. In 0.5.23 ``MambaPool`` sets ``replayssm_spec_fold`` for
KDA models only, so a GDN model never reaches this path (the flag's help text still describes
it); we drive its code as written. The verify keeps the state in fp32 registers across the
``K`` rows and the fold rounds it to the pool's dtype once per commit: a bf16 pool is taken,
but rounded once per commit where its decode rounds once per token.

(b) **ReplaySSM ring** (its GDN serving path), ``form="sglang_replayssm"``, ring length ``L``
(``--linear-replayssm-cache-len``, a power of two, default 16). Per request (``replay_indices``,
the request-pool slot) ``d [R, HV, L, V]`` and the normalised ``k [R, HK, L, K]`` in the
activation dtype, ``g [R, HV, L]`` fp32, and where the activation dtype is not fp32 their low
parts (``rawv``, ``rawk``: ``d - d_hi``, ``k - k_hi``); cursors ``write_pos``, ``cache_base``
int32 and ``is_flush`` int8. Per layer the verify is ``gdn_replayssm_spec_decode(q, k, v
[B*K, heads, dim], a, b [B*K, HV], A_log, dt_bias, temporal, d, k, g, rawv, rawk, None, out,
query_start_loc, slots, replay_indices, write_pos, cache_base, is_flush, max_cache_len=L,
max_spec_len=K, scale=K**-0.5, null_block_id=-1, launch_mode="verify")``: one launch, outputs
from the checkpoint plus the window ``[cache_base, cache_base + write_pos)`` by the ``(I + A)^-1``
transform, the ``K`` new rows appended at ``cache_base + write_pos + t`` (mod ``L``); the
checkpoint is read in fp32 with TF32 dots on a GPU (IEEE on the CPU), a 16-bit one on the
tensor cores with the low parts. After acceptance, once for all layers:
``commit_gdn_replayssm_spec(write_pos, cache_base, is_flush, accept_lens, replay_indices, L, K,
fold_every_commit=temporal.dtype != fp32, null_block_id=-1)`` (``write_pos += a``; ``is_flush =
write_pos + 2K > L``, or ``write_pos > 0`` with fold-every-commit), then
``commit_gdn_replayssm_circular(temporal, d, k, g, rawv, rawk, slots, replay_indices, write_pos,
cache_base, is_flush, accept_lens, null_block_id=-1)``: flagged requests get their window
materialised into the state (``exp(G) H0 + sum_j exp(G - G_j) k_j d_j^T``, hi and lo parts on the
tensor cores, rounded once), ``cache_base += write_pos``, ``write_pos = is_flush = 0``. So an
fp32 pool folds once the window holds more than ``L - 2K`` rows (every ``L - 2K + 1`` to
``L - K`` committed tokens), a bf16 or fp16 pool after every commit.

(c) **The ring with its exact fold**, ``form="sglang_replayssm_rawfold"``: the same module's
own default, ``launch_mode="both"``, with raw ``v``, pre-norm ``k`` and ``beta`` stored beside
``d, k, g`` (so, by its docstring, no error is carried from one window to the next): three
launches per layer, (1) the requests flagged by the previous commit get their window replayed
row by row into the checkpoint (that module's ``gdn_replayssm_exact_fold_kernel``, the replay of
(a)'s fold, rounded once), (2) the verify of the others, (3) the flagged ones' verify from the
folded checkpoint; the commit is ``commit_gdn_replayssm_spec(..., fold_every_commit=False)``
alone (a flagged request's window restarts at ``cache_base + write_pos``). 0.5.23's GDN
backend does not drive this one.

Loading: from ``$PMLL_LAB_SGLANG_DIR`` (a directory holding the three files and a ``VERSION``
line, as ``scripts/fetch-sglang.sh`` writes it into ``.sgl/``), else an installed ``sglang``
distribution (its files are read, its package never imported), else the project's ``.sgl/``.
The modules import seven device queries from SGLang's server package; stand-ins for them
(``stand_ins``) are put into ``sys.modules`` for the import only and the previous entries
restored. Under the Triton interpreter their ``range`` loops get tensor loop variables
(``pmll_lab._interpreter.tensor_loop_variables``). Every helper returns ``None``/``False``/
``""`` where SGLang is absent, so sweeps run without it.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import os
import sys
import types
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

from pmll_lab import sizes
from pmll_lab.backend import DEVICE, INTERPRET
from pmll_lab.reference.carry import decode_row, prepare_qk

SGLANG_VERSION = "0.5.23"
"""The release these wrappers were read from and checked against."""
SGLANG_DIR_ENV = "PMLL_LAB_SGLANG_DIR"
KERNEL_PACKAGE = "sglang/kernels/ops/attention/linear"
KERNEL_FILES = {"recurrent": "fused_sigmoid_gating_recurrent.py",
                "fold": "gdn_replayssm_spec_fold.py", "spec": "gdn_replayssm_spec_decode.py"}
"""The modules loaded, by the name this module gives them."""
PROJECT_DIR = Path(__file__).resolve().parent.parent / ".sgl"
RING_LENGTHS = (16, 32)
"""Ring lengths ``L`` measured (powers of two, ``L >= 2K``)."""
STATE_DTYPES = ("float32", "bfloat16")
INPUT_DTYPES = ("bfloat16", "float16", "float32")


@dataclass(frozen=True)
class SglangKernels:
    """The loaded modules (``recurrent``, ``fold``, ``spec``), SGLang's version, and where the
    files came from."""

    recurrent: types.ModuleType
    fold: types.ModuleType
    spec: types.ModuleType
    version: str
    source: str


def stand_ins() -> dict[str, dict[str, object]]:
    """What the kernel modules import from SGLang's server package, answered for the device the
    kernels run on (``pmll_lab.backend``; under the interpreter: no GPU), by module:
    ``sglang.srt.utils``: ``is_cuda()``, ``is_hip()``, ``is_gfx95_supported()`` (AMD gfx95),
    ``get_device_sm()`` (``10 * major + minor``, 0 without CUDA), ``is_sm90_supported()``
    (capability 9.x and CUDA >= 12.3); ``sglang.kernels.jit.utils``: ``is_arch_support_pdl()``
    (programmatic dependent launch: NVIDIA from sm_90); ``sglang.kernels.ops.attention.fla.utils``:
    ``is_tf32_supported`` (a bool: NVIDIA from sm_80). The same answers SGLang's own functions
    give there."""
    gpu = DEVICE.type == "cuda" and not INTERPRET
    hip = gpu and torch.version.hip is not None
    cuda = gpu and torch.version.cuda is not None
    major, minor = torch.cuda.get_device_capability(DEVICE) if gpu else (0, 0)
    arch = torch.cuda.get_device_properties(DEVICE).gcnArchName if hip else ""
    cuda_ver = tuple(int(x) for x in torch.version.cuda.split(".")[:2]) if cuda else (0, 0)
    return {
        "sglang.srt.utils": dict(
            is_cuda=lambda: cuda, is_hip=lambda: hip,
            is_gfx95_supported=lambda: "gfx95" in arch,
            get_device_sm=lambda: 10 * major + minor if gpu else 0,
            is_sm90_supported=lambda: cuda and major == 9 and cuda_ver >= (12, 3)),
        "sglang.kernels.jit.utils": dict(is_arch_support_pdl=lambda: cuda and major >= 9),
        "sglang.kernels.ops.attention.fla.utils": dict(is_tf32_supported=cuda and major >= 8),
    }


@contextlib.contextmanager
def _stand_ins_installed():
    """``sys.modules`` holds the stand-ins (and empty parent packages) inside the block only;
    whatever was there before is put back, also on an error."""
    mods = stand_ins()
    names = set(mods)
    for name in mods:
        parts = name.split(".")
        names.update(".".join(parts[:i]) for i in range(1, len(parts)))
    saved = {n: sys.modules.get(n) for n in names}
    try:
        for n in sorted(names):
            m = types.ModuleType(n, "pmll_lab.peers_sglang stand-in")
            m.__path__ = []
            m.__dict__.update(mods.get(n, {}))
            sys.modules[n] = m
        yield
    finally:
        for n, old in saved.items():
            if old is None:
                sys.modules.pop(n, None)
            else:
                sys.modules[n] = old


def _locate() -> tuple[Path, str, str] | str:
    """``(directory, version, source)`` of the kernel files, or the status line saying why
    there are none."""
    env = os.environ.get(SGLANG_DIR_ENV, "").strip()
    if env:
        d = Path(env)
        missing = [f for f in KERNEL_FILES.values() if not (d / f).is_file()]
        if missing:
            return f"SGLang: {SGLANG_DIR_ENV}={env} lacks {', '.join(missing)}"
        return d, _dir_version(d), f"{SGLANG_DIR_ENV}={env}"
    try:
        dist = importlib.metadata.distribution("sglang")
    except importlib.metadata.PackageNotFoundError:
        dist = None
    if dist is not None:
        d = Path(dist.locate_file(KERNEL_PACKAGE))
        if all((d / f).is_file() for f in KERNEL_FILES.values()):
            return d, dist.version, f"installed sglang ({d})"
    if all((PROJECT_DIR / f).is_file() for f in KERNEL_FILES.values()):
        return PROJECT_DIR, _dir_version(PROJECT_DIR), f"{PROJECT_DIR}"
    return "SGLang: not installed"


def _dir_version(d: Path) -> str:
    v = d / "VERSION"
    return v.read_text().strip() if v.is_file() else "unknown"


@lru_cache(maxsize=1)
def load_kernels() -> tuple[SglangKernels | None, str]:
    where = _locate()
    if isinstance(where, str):
        return None, where
    d, version, source = where
    loaded = {}
    try:
        with _stand_ins_installed():
            for key, fname in KERNEL_FILES.items():
                name = f"pmll_lab_sglang_{Path(fname).stem}"
                spec = importlib.util.spec_from_file_location(name, d / fname)
                mod = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(mod)
                sys.modules[name] = mod          # inspect (Triton's source reader) finds it
                loaded[key] = mod
    except Exception as exc:  # noqa: BLE001 - another release, or a device it cannot start on
        return None, (f"SGLang {version}: its kernel modules do not import "
                      f"({type(exc).__name__}: {exc})")
    if INTERPRET:
        from triton.runtime.interpreter import InterpretedFunction

        from pmll_lab._interpreter import tensor_loop_variables

        for mod in loaded.values():
            for fn in vars(mod).values():
                if isinstance(fn, InterpretedFunction):
                    tensor_loop_variables(fn)
    return SglangKernels(version=version, source=source, **loaded), ""


def sglang_kernels() -> SglangKernels | None:
    """The loaded kernel modules, or None where they are absent or do not import."""
    return load_kernels()[0]


def sglang_available() -> bool:
    """SGLang's kernels load here (on a GPU, or on the CPU through the Triton interpreter)."""
    return sglang_kernels() is not None


def sglang_version() -> str:
    """The version of the SGLang the kernels came from ("" where they do not load)."""
    k = sglang_kernels()
    return k.version if k is not None else ""


def sglang_status() -> str:
    """One line for a report: ``"SGLang <version>"``, ``"SGLang: not installed"``, or why its
    kernels do not load (``"SGLang: $PMLL_LAB_SGLANG_DIR=... lacks ..."``, ``"SGLang <version>:
    its kernel modules do not import (...)"``)."""
    k, why = load_kernels()
    return why if k is None else f"SGLang {k.version}"


def require() -> SglangKernels:
    """``sglang_kernels()``, or ``RuntimeError`` saying why not and how to install it."""
    k, why = load_kernels()
    if k is None:
        raise RuntimeError(f"{why} (pip install --no-deps sglang=={SGLANG_VERSION}, or "
                           f"scripts/fetch-sglang.sh into .sgl/)")
    return k


def _name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def exact_fold_supports(head_dim: int, rows: int, dtype, state_dtype) -> bool:
    """Whether SGLang's fold-every-commit takes this case: any head size and ``K >= 1``,
    inputs in ``INPUT_DTYPES``, an fp32 or bf16 pool (``STATE_DTYPES``)."""
    return (int(head_dim) >= 1 and int(rows) >= 1 and _name(dtype) in INPUT_DTYPES
            and _name(state_dtype) in STATE_DTYPES)


def ring_supports(head_dim: int, rows: int, dtype, state_dtype, length: int) -> bool:
    """Whether SGLang's ReplaySSM ring takes this case: ``kd = vd`` a power of two >= 32 (its
    verify splits ``K`` in two ``tl.dot`` tiles of >= 16), ``L`` a power of two >= 16 (its
    commit's ``tl.dot`` over the ring) with ``L >= 2K`` (its early-flush margin), inputs in
    ``INPUT_DTYPES``, an fp32 or bf16 pool."""
    d, L = int(head_dim), int(length)
    return (d >= 32 and d & (d - 1) == 0 and L >= 16 and L & (L - 1) == 0
            and 1 <= int(rows) and 2 * int(rows) <= L and _name(dtype) in INPUT_DTYPES
            and _name(state_dtype) in STATE_DTYPES)


@dataclass(eq=False)
class SglangFoldWindow:
    """The fold-every-commit window of ``S`` state slots (keyed by slot, as its verify keys
    it): raw ``v [S, HV, K, vd]``, pre-norm ``k [S, HK, K, kd]`` in the activation dtype,
    ``g, beta [S, HV, K]`` fp32."""

    v: torch.Tensor
    k: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor

    @classmethod
    def empty(cls, slots, num_k_heads, num_v_heads, k_dim, v_dim, rows, dtype, device=None):
        dev = DEVICE if device is None else device
        z = lambda *s, dt=torch.float32: torch.zeros(*s, dtype=dt, device=dev)  # noqa: E731
        return cls(v=z(slots, num_v_heads, rows, v_dim, dt=dtype),
                   k=z(slots, num_k_heads, rows, k_dim, dt=dtype),
                   g=z(slots, num_v_heads, rows), beta=z(slots, num_v_heads, rows))

    @property
    def bytes_per_slot(self) -> int:
        return sum(t[0].numel() * t.element_size() for t in (self.v, self.k, self.g, self.beta))


@dataclass(eq=False)
class SglangRing:
    """The ReplaySSM ring of ``R`` requests: ``d [R, HV, L, vd]``, normalised ``k [R, HK, L,
    kd]`` (activation dtype), ``g [R, HV, L]`` fp32; ``rawv, rawk`` (same shapes as ``d, k``):
    the low parts (``layout="compact"``, absent for fp32 activations) or the raw ``v`` and
    pre-norm ``k`` (``"raw"``, with ``beta [R, HV, L]`` fp32); cursors ``write_pos,
    cache_base [R]`` int32, ``is_flush [R]`` int8; all zero to start (a fresh request)."""

    d: torch.Tensor
    k: torch.Tensor
    g: torch.Tensor
    rawv: torch.Tensor | None
    rawk: torch.Tensor | None
    beta: torch.Tensor | None
    write_pos: torch.Tensor
    cache_base: torch.Tensor
    is_flush: torch.Tensor
    layout: str

    @classmethod
    def empty(cls, requests, num_k_heads, num_v_heads, k_dim, v_dim, length, dtype,
              layout="compact", device=None):
        if layout not in sizes.SGLANG_RING_LAYOUTS:
            raise ValueError(f"layout: must be one of {sizes.SGLANG_RING_LAYOUTS}, got {layout!r}")
        dev = DEVICE if device is None else device
        z = lambda *s, dt=torch.float32: torch.zeros(*s, dtype=dt, device=dev)  # noqa: E731
        R, L = requests, length
        two = layout == "raw" or dtype != torch.float32
        return cls(d=z(R, num_v_heads, L, v_dim, dt=dtype), k=z(R, num_k_heads, L, k_dim, dt=dtype),
                   g=z(R, num_v_heads, L),
                   rawv=z(R, num_v_heads, L, v_dim, dt=dtype) if two else None,
                   rawk=z(R, num_k_heads, L, k_dim, dt=dtype) if two else None,
                   beta=z(R, num_v_heads, L) if layout == "raw" else None,
                   write_pos=z(R, dt=torch.int32), cache_base=z(R, dt=torch.int32),
                   is_flush=z(R, dt=torch.int8), layout=layout)

    @property
    def length(self) -> int:
        return self.d.shape[2]

    @property
    def bytes_per_slot(self) -> int:
        bufs = [t for t in (self.d, self.k, self.g, self.rawv, self.rawk, self.beta,
                            self.write_pos, self.cache_base, self.is_flush) if t is not None]
        return sum(t[0].numel() * t.element_size() for t in bufs)


def _layered(t):
    """``t`` with a layer axis in front (the commits take every layer at once)."""
    return None if t is None else t.unsqueeze(0)


def _recurrent(kern: SglangKernels, state, slots, q, k, v, a, b, A_log, dt_bias, *, scale,
               query_start_loc, use_qk_l2norm, **ring) -> torch.Tensor:
    """SGLang's recurrent kernel over ``T`` rows per sequence (``q, k [B, T, HK, kd]``, ...),
    varlen as its backend calls it; returns ``o [B, T, HV, vd]`` in q's dtype."""
    B, T, HK, kd = q.shape
    HV, vd = v.shape[2:]
    o = kern.recurrent.fused_sigmoid_gating_delta_rule_update(
        A_log=A_log, dt_bias=dt_bias, q=q.reshape(1, B * T, HK, kd),
        k=k.reshape(1, B * T, HK, kd), v=v.reshape(1, B * T, HV, vd),
        a=a.reshape(B * T, HV), b=b.reshape(B * T, HV), initial_state_source=state,
        initial_state_indices=slots, cu_seqlens=query_start_loc, scale=scale,
        use_qk_l2norm_in_kernel=use_qk_l2norm, softplus_beta=1.0, softplus_threshold=20.0,
        is_kda=False, **ring)
    return o.reshape(B, T, HV, vd)


def fold_verify(kern: SglangKernels, state, slots, window: SglangFoldWindow, q, k, v, a, b,
                A_log, dt_bias, *, scale: float, query_start_loc,
                use_qk_l2norm: bool = True) -> torch.Tensor:
    """(a)'s verify on one layer: ``q, k [B, K, HK, kd]``, ``v [B, K, HV, vd]``, ``a, b
    [B, K, HV]`` (contiguous), ``state [S, HV, vd, kd]`` (read only), ``slots [B]`` int32 (-1: a
    padding lane), ``query_start_loc [B+1]`` int32 (``arange(0, B*K+1, K)``). Returns ``o [B,
    K, HV, vd]`` in q's dtype. ``use_qk_l2norm=False``: a diagnostic (SGLang normalises)."""
    return _recurrent(kern, state, slots, q, k, v, a, b, A_log, dt_bias, scale=scale,
                      query_start_loc=query_start_loc, use_qk_l2norm=use_qk_l2norm,
                      disable_state_update=True, cache_ring=True, replayssm_rawv=window.v,
                      replayssm_rawk=window.k, replayssm_g=window.g,
                      replayssm_beta=window.beta)


def fold_commit(kern: SglangKernels, state, window: SglangFoldWindow, slots, accepted, *,
                use_qk_l2norm: bool = True) -> None:
    """(a)'s commit: rows ``0..a-1`` of each slot's window replayed into ``state`` (one layer;
    ``accepted [B]`` int32, the accepted rows with the bonus token)."""
    kern.fold.commit_gdn_replayssm_fold_all_layers(
        state.unsqueeze(0), window.v.unsqueeze(0), window.k.unsqueeze(0),
        window.g.unsqueeze(0), window.beta.unsqueeze(0), slots, accepted,
        max_cache_len=window.v.shape[2], num_k_heads=window.k.shape[1],
        use_qk_l2norm_in_kernel=use_qk_l2norm, null_block_id=-1)


def recurrent_decode(kern: SglangKernels, state, slots, q, k, v, a, b, A_log, dt_bias, *,
                     scale: float, use_qk_l2norm: bool = True) -> torch.Tensor:
    """SGLang's decode of one token per sequence with the recurrent kernel (its
    ``TritonGDNKernel.decode``, the kernel its fold claims to equal), ``state`` updated in place:
    ``q, k [B, HK, kd]``, ``v [B, HV, vd]``, ``a, b [B, HV]``; ``slots [B]`` int32 (-1: nothing
    read or written, the row's output meaningless). Returns ``o [B, HV, vd]``. (Its CUDA serving
    decode is another kernel, ``fused_recurrent_gated_delta_rule_packed_decode``.)"""
    qsl = torch.arange(q.shape[0] + 1, dtype=torch.int32, device=q.device)
    one = lambda x: x.unsqueeze(1).contiguous()  # noqa: E731
    return _recurrent(kern, state, slots, one(q), one(k), one(v), one(a), one(b), A_log,
                      dt_bias, scale=scale, query_start_loc=qsl,
                      use_qk_l2norm=use_qk_l2norm)[:, 0]


def ring_verify(kern: SglangKernels, state, slots, replay, ring: SglangRing, q, k, v, a, b,
                A_log, dt_bias, *, scale: float, query_start_loc, out) -> None:
    """(b)'s verify (``launch_mode="verify"``) or (c)'s three launches (``ring.layout ==
    "raw"``) on one layer, writing ``out [B*K, HV, vd]``; inputs as ``fold_verify``,
    ``replay [B]`` the requests' ring rows."""
    B, K, HK, kd = q.shape
    HV, vd = v.shape[2:]
    kern.spec.gdn_replayssm_spec_decode(
        q=q.reshape(B * K, HK, kd), k=k.reshape(B * K, HK, kd), v=v.reshape(B * K, HV, vd),
        a=a.reshape(B * K, HV), b=b.reshape(B * K, HV), A_log=A_log, dt_bias=dt_bias,
        checkpoint_state=state, d_cache=ring.d, k_cache=ring.k, g_cache=ring.g,
        rawv_cache=ring.rawv, rawk_cache=ring.rawk, beta_cache=ring.beta, out=out,
        query_start_loc=query_start_loc, ssm_state_indices=slots, replay_indices=replay,
        write_pos=ring.write_pos, cache_base=ring.cache_base, is_flush=ring.is_flush,
        max_cache_len=ring.length, max_spec_len=K, scale=scale, use_qk_l2norm_in_kernel=True,
        null_block_id=-1, launch_mode="both" if ring.layout == "raw" else "verify")


def ring_advance(kern: SglangKernels, ring: SglangRing, replay, accepted, rows: int,
                 fold_every_commit: bool) -> None:
    """The cursor advance after acceptance (``commit_gdn_replayssm_spec``)."""
    kern.spec.commit_gdn_replayssm_spec(
        write_pos=ring.write_pos, cache_base=ring.cache_base, is_flush=ring.is_flush,
        num_accepted=accepted, replay_indices=replay, max_cache_len=ring.length,
        max_spec_len=rows, fold_every_commit=fold_every_commit, null_block_id=-1)


def ring_materialize(kern: SglangKernels, state, slots, replay, ring: SglangRing,
                     accepted) -> None:
    """(b)'s fold of the flagged requests' windows and their cursor reset
    (``commit_gdn_replayssm_circular``, one layer)."""
    kern.spec.commit_gdn_replayssm_circular(
        checkpoint_state=state.unsqueeze(0), d_cache=_layered(ring.d),
        k_cache=_layered(ring.k), g_cache=_layered(ring.g),
        d_residual_cache=_layered(ring.rawv), k_residual_cache=_layered(ring.rawk),
        state_batch_indices=slots, replay_indices=replay, write_pos=ring.write_pos,
        cache_base=ring.cache_base, is_flush=ring.is_flush, accept_lens=accepted,
        null_block_id=-1)


def ring_state(state_v, ring: SglangRing, request: int, slot: int) -> torch.Tensor:
    """Float64 K-major ``[HV, kd, vd]`` that request ``request``'s window stands for over its
    slot's V-major state: for ``compact``, ``exp(G) H0 + sum_j exp(G - G_j) k_j d_j^T`` from
    the stored parts (hi + lo); for ``raw``, the window's raw rows replayed by the recurrence
    (what its exact fold computes)."""
    L = ring.length
    P, base = int(ring.write_pos[request]), int(ring.cache_base[request])
    H = state_v[slot].double().transpose(-1, -2).cpu()
    if P == 0:
        return H
    rows = [(base + i) % L for i in range(P)]
    HV, HK = ring.g.shape[1], ring.k.shape[1]
    f64 = lambda t: t[request][:, rows].double().cpu()  # noqa: E731
    g = f64(ring.g)                                                        # [HV, P]
    if ring.layout == "raw":
        v, kr, beta = f64(ring.rawv), f64(ring.rawk), f64(ring.beta)
        for j in range(P):
            _, kn = prepare_qk(kr[:, j], kr[:, j], HV)
            H, _, _ = decode_row(H, kn, kn, v[:, j], g[:, j], beta[:, j])
        return H
    kk, d = f64(ring.k), f64(ring.d)
    if ring.rawk is not None:
        kk, d = kk + f64(ring.rawk), d + f64(ring.rawv)
    kk = kk.repeat_interleave(HV // HK, 0)                                 # [HV, P, kd]
    total = g.sum(1)
    decay = torch.exp(total[:, None] - torch.cumsum(g, 1))
    return (torch.exp(total)[:, None, None] * H
            + torch.einsum("hp,hpk,hpv->hkv", decay, kk, d))
