"""Float64 references for Gated DeltaNet decode and the K-row chain with snapshots.

Written for clarity, not speed (SPEC §2, §3a): every kernel in ``pmll_lab.ops.gdn`` answers to
these. One token of one value head ``h`` (key head ``h // (HV // HK)``, as ``repeat_interleave``
does in Qwen3-Next), state ``H [kd, vd]`` (FLA's layout, ``state_layout="kv"``); the default
``state_layout="vk"`` (every GDN launcher's) reads and returns the same ``H`` stored
``[vd, kd]``::

    q, k <- l2norm(q), l2norm(k)        if use_qk_l2norm   (x * rsqrt(sum(x*x) + 1e-6))
    q    <- q * scale                                          (scale = kd**-0.5 unless given)
    H    <- exp(g) * H                                         (g: log decay, <= 0)
    u    <- beta * (v - H^T k)
    H    <- H + k u^T
    o    <- H^T q

The chain reference is literally the decode reference applied K times, in order, with the
state after each row ``t < K-1`` kept as a snapshot (the intermediate buffer of §3a). Inputs are
never mutated; everything is computed in float64 on the inputs' device.

Slot tables are read as the kernels read them: a slot of -1 is a padding lane (zero outputs; no
slot read or written; in the snapshots the chain reference returns, a fresh tensor, its rows are
zeros, where the kernels leave the caller's buffer as it was), any other slot outside ``[0, S)``
a ``ValueError`` naming ``state_indices``.
"""

from __future__ import annotations

import torch

from pmll_lab.reference._slots import PAD, slot_list

L2NORM_EPS = 1e-6


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + L2NORM_EPS)


def _slots(state_indices, batch: int, size: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(live [B] bool, slots [n_live] int64)``: which lanes are live (slot != -1) and their
    slots, checked by ``slot_list`` (``ValueError`` naming ``state_indices``)."""
    idx = slot_list("state_indices", state_indices, batch, size)
    live = torch.tensor([s != PAD for s in idx], dtype=torch.bool, device=device)
    slots = torch.tensor([s for s in idx if s != PAD], dtype=torch.long, device=device)
    return live, slots


def round_state(H: torch.Tensor, state_dtype) -> torch.Tensor:
    """``H`` (float64) rounded to ``state_dtype`` and back to float64: the rounding point of a
    bf16/fp16 state pool, applied where a decode stores the state (``None`` or float32:
    unchanged, the fp32 kernels' rounding being below the references' tolerances). A dtype
    may be named (``"bfloat16"``); ``ValueError`` naming ``state_dtype`` for anything else."""
    if isinstance(state_dtype, str):
        state_dtype = getattr(torch, state_dtype, None) if state_dtype in (
            "float32", "float64", "bfloat16", "float16") else state_dtype
    if state_dtype is None or state_dtype in (torch.float32, torch.float64):
        return H
    if state_dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"state_dtype: expected None, float32, bfloat16 or float16, got "
                         f"{state_dtype!r}")
    return H.to(state_dtype).to(torch.float64)


def _shapes(state, q, k, v, g, beta, rows: bool) -> None:
    """``ValueError`` naming the first argument whose shape does not fit a decode (``rows``
    False: ``q, k [B, HK, kd]``, ``v [B, HV, vd]``, ``g, beta [B, HV]``) or a chain (a rows
    axis after ``B``) on a K-major ``state [S, HV, kd, vd]``."""
    lead = 2 if rows else 1
    what = "[B, K, " if rows else "[B, "
    if not isinstance(state, torch.Tensor) or state.dim() != 4:
        raise ValueError(f"state: expected a tensor [S, HV, kd, vd], got "
                         f"{tuple(state.shape) if isinstance(state, torch.Tensor) else state!r}")
    _, HV, kd, vd = state.shape
    for name, t, tail in (("q", q, None), ("k", k, None), ("v", v, (HV, vd)), ("g", g, (HV,)),
                          ("beta", beta, (HV,))):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name}: expected a tensor, got {type(t).__name__}")
        want = len(tail) if tail is not None else 2
        if t.dim() != lead + want or t.shape[:lead] != q.shape[:lead] or (
                tail is not None and tuple(t.shape[lead:]) != tail):
            dims = {"q": "HK, kd", "k": "HK, kd", "v": "HV, vd", "g": "HV", "beta": "HV"}[name]
            raise ValueError(f"{name}: expected {what}{dims}] with the state's HV={HV}, "
                             f"kd={kd}, vd={vd}, got {tuple(t.shape)}")
    if q.shape[lead + 1] != kd:
        raise ValueError(f"q: expected kd={kd} (the state's) in its last dim, got "
                         f"{tuple(q.shape)}")
    if k.shape != q.shape:
        raise ValueError(f"k: expected q's shape {tuple(q.shape)}, got {tuple(k.shape)}")
    if HV % q.shape[lead]:
        raise ValueError(f"q: {q.shape[lead]} key heads do not divide the state's {HV} value "
                         f"heads")


def _to_kv(state, state_layout: str):
    """The state as ``[S, HV, kd, vd]`` (a transposed view of a V-major state)."""
    if state_layout not in ("kv", "vk"):
        raise ValueError(f"state_layout: expected 'kv' or 'vk', got {state_layout!r}")
    return state if state_layout == "kv" else state.transpose(-1, -2)


def gdn_decode_ref(state, q, k, v, g, beta, *, state_indices=None, scale=None,
                   use_qk_l2norm=True, state_layout="vk", state_dtype=None):
    """One decode token per sequence, in float64.

    Args: ``state [S, HV, vd, kd]`` (``state_layout="vk"``, the default as in every GDN launcher) or
    ``[S, HV, kd, vd]`` (``"kv"``); ``q, k [B, HK, kd]``; ``v [B, HV, vd]``; ``g, beta [B, HV]``
    (any float dtypes: values are read exactly, then computed in float64); ``state_indices [B]``
    (default ``arange(B)``; ints or an int tensor) selects each sequence's slot, -1 marking a
    padding lane as in the kernels: its output row is zeros and no slot is read or written for
    it. Any other slot outside ``[0, S)``: ``ValueError`` naming ``state_indices``.

    Returns ``(o [B, HV, vd], new_state)``, both float64: ``new_state`` is a copy of ``state`` (same
    layout) with the addressed slots advanced by one token and every other slot unchanged (the
    layouts hold the same ``H`` transposed; a layout is only a pair of strides here).
    ``state_dtype``: a bf16/fp16 state pool's dtype: the new state is rounded to it (and held in
    float64), where the kernels store it (``round_state``); ``None`` keeps float64.
    """
    if state_layout != "kv":
        o, new = gdn_decode_ref(_to_kv(state, state_layout), q, k, v, g, beta,
                                state_indices=state_indices, scale=scale,
                                use_qk_l2norm=use_qk_l2norm, state_layout="kv",
                                state_dtype=state_dtype)
        return o, new.transpose(-1, -2).contiguous()
    _shapes(state, q, k, v, g, beta, rows=False)
    B, HK, kd = q.shape
    HV = v.shape[1]
    group = HV // HK
    scale = kd ** -0.5 if scale is None else float(scale)
    f64 = torch.float64
    q, k, v, g, beta = (t.to(f64) for t in (q, k, v, g, beta))
    if use_qk_l2norm:
        q, k = _l2norm(q), _l2norm(k)
    q = q * scale
    # GVA: value head h reads key head h // group.
    q = q.repeat_interleave(group, dim=1)               # [B, HV, kd]
    k = k.repeat_interleave(group, dim=1)

    new_state = state.to(f64).clone()
    live, slots = _slots(state_indices, B, state.shape[0], state.device)
    q, k, v, g, beta = (t[live] for t in (q, k, v, g, beta))   # padding lanes dropped
    H = new_state[slots]                                # [n_live, HV, kd, vd] (a copy)
    H = torch.exp(g)[..., None, None] * H
    u = beta[..., None] * (v - torch.einsum("bhkv,bhk->bhv", H, k))
    H = H + k[..., :, None] * u[..., None, :]
    o = torch.zeros(B, HV, v.shape[-1], dtype=f64, device=state.device)
    o[live] = torch.einsum("bhkv,bhk->bhv", H, q)
    new_state[slots] = round_state(H, state_dtype)
    return o, new_state


def gdn_chain_ref(state, q, k, v, g, beta, *, state_indices=None, scale=None,
                  use_qk_l2norm=True, state_layout="vk", state_dtype=None):
    """K rows per sequence: the decode reference applied row by row, in float64.

    Args: as ``gdn_decode_ref`` with a rows axis after ``B``: ``q, k [B, K, HK, kd]``,
    ``v [B, K, HV, vd]``, ``g, beta [B, K, HV]``.

    Returns ``(o [B, K, HV, vd], new_state, intermediate [B, K-1, *state.shape[1:]])`` (float64,
    states in ``state_layout``): ``new_state`` holds the state after the last row in the addressed
    slots; ``intermediate[b, t]`` is sequence ``b``'s state after row ``t`` (``t < K-1``). A padding
    lane (slot -1) has zero outputs and zero snapshots (the kernels write none: compare live lanes'
    snapshots only), and touches no slot. ``state_dtype``: the state rounded to it after every row
    (``gdn_decode_ref``), snapshots included.
    """
    if state_layout != "kv":
        o, new, inter = gdn_chain_ref(_to_kv(state, state_layout), q, k, v, g, beta,
                                      state_indices=state_indices, scale=scale,
                                      use_qk_l2norm=use_qk_l2norm, state_layout="kv",
                                      state_dtype=state_dtype)
        return o, new.transpose(-1, -2).contiguous(), inter.transpose(-1, -2).contiguous()
    _shapes(state, q, k, v, g, beta, rows=True)
    B, K = q.shape[:2]
    HV, kd, vd = state.shape[1:]
    idx = slot_list("state_indices", state_indices, B, state.shape[0])
    live, slots = _slots(idx, B, state.shape[0], state.device)
    cur = state
    outs, snaps = [], []
    for t in range(K):
        o_t, cur = gdn_decode_ref(cur, q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t],
                                  state_indices=idx, scale=scale, use_qk_l2norm=use_qk_l2norm,
                                  state_layout="kv", state_dtype=state_dtype)
        outs.append(o_t)
        if t < K - 1:
            snap = torch.zeros(B, HV, kd, vd, dtype=torch.float64, device=state.device)
            snap[live] = cur[slots]
            snaps.append(snap)
    inter = (torch.stack(snaps, dim=1) if snaps
             else torch.empty(B, 0, HV, kd, vd, dtype=torch.float64, device=state.device))
    return torch.stack(outs, dim=1), cur.to(torch.float64), inter


def gdn_gating_ref(A_log, a, dt_bias, b):
    """Qwen3-Next's gates in float64: ``g = -exp(A_log) * softplus(a + dt_bias)`` (PyTorch's
    softplus, threshold 20), ``beta = sigmoid(b)``. ``A_log, dt_bias [HV]``, ``a, b [..., HV]``
    (any float dtypes, read exactly). Returns ``(g, beta)`` float64 of ``a``'s shape; the
    reference of ``pmll_lab.gdn.gdn_gating`` and of every launcher's fused gating."""
    import torch.nn.functional as F

    f64 = torch.float64
    g = -torch.exp(A_log.to(f64)) * F.softplus(a.to(f64) + dt_bias.to(f64), threshold=20.0)
    return g, torch.sigmoid(b.to(f64))
