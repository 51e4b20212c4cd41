"""Seeded input generators with realistic statistics (never zeros).

Every test, sweep point and notebook draws its inputs here, from an explicit ``seed``, so a
failing point can be re-created exactly. Statistics follow Qwen3-Next's GDN layer (STYLE.md,
gpu-mode habit): log-decay gates ``g = -exp(A_log) * softplus(a)`` (so ``g <= 0``),
``beta = sigmoid(b)``, keys and queries of unit scale (the kernels l2-normalise them), states of
random scale. Tensors are created on the CPU from a ``torch.Generator`` and then moved, so the
same seed gives the same values on every device.
"""

from __future__ import annotations

import numbers

import torch
import torch.nn.functional as F

from pmll_lab import _checks
from pmll_lab.backend import DEVICE
from pmll_lab.ops.gdn.recurrence import DEFAULT_STATE_LAYOUT, check_layout


def generator(seed: int) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed(int(seed))


def _checked(seed, dtype, device, zero_ok=(), **sizes) -> torch.device:
    """Arguments of an input maker, checked before anything is drawn: ``seed`` an int >= 0,
    every size an int >= 1 (>= 0 for the names in ``zero_ok``; a NumPy integer too, as grids
    give them; ``None`` where the maker has a default), ``dtype`` a
    floating torch dtype; returns the device (``None``: the session's). ``ValueError`` naming
    the argument otherwise."""
    for name, value, least in (("seed", seed, 0),
                               *((n, v, 0 if n in zero_ok else 1) for n, v in sizes.items())):
        if value is None and name != "seed":
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least \
                or value >= 2 ** 63:
            raise ValueError(f"{name}: must be an int >= {least} (and < 2**63), got {value!r}")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype: expected a floating torch.dtype (e.g. torch.bfloat16), got "
                         f"{dtype!r}")
    return _checks.device("device", device, DEVICE)


def _randn(gen, *shape, scale=1.0):
    return torch.randn(*shape, generator=gen, dtype=torch.float32) * scale


def gdn_inputs(
    seed: int,
    batch: int,
    num_k_heads: int,
    num_v_heads: int,
    k_dim: int,
    v_dim: int,
    *,
    rows: int | None = None,
    slots: int | None = None,
    dtype: torch.dtype = torch.bfloat16,
    device: torch.device | str | None = None,
    state_layout: str = DEFAULT_STATE_LAYOUT,
) -> dict[str, torch.Tensor]:
    """Inputs for one GDN decode (``rows=None``) or a K-row verify (``rows=K``).

    Returns a dict with ``q, k [B, (K,) HK, kd]`` and ``v [B, (K,) HV, vd]`` in ``dtype``;
    ``g, beta [B, (K,) HV]`` fp32 (``g`` log decay <= 0, ``beta`` in (0, 1));
    ``state`` fp32 with entries of scale ~0.1 (``S = slots or batch``) in ``state_layout``:
    ``[S, HV, vd, kd]`` for ``"vk"`` (the default, as every GDN launcher's), ``[S, HV, kd, vd]``
    for ``"kv"``; one seed gives the same ``H`` in both (the V-major state is the K-major draw
    transposed, contiguous), so the two layouts can be compared on one state;
    ``state_indices [B]`` int32: a seeded permutation of ``S`` slots, so launches skip and
    permute slots. Raises ``ValueError`` naming the argument for a size that is not an int
    >= 1, ``slots < batch``, a ``dtype`` that is not a floating torch dtype or a
    ``state_layout`` not in ``STATE_LAYOUTS`` (heads that do not group are drawn: the launchers'
    own check is tested with them).
    """
    check_layout("state_layout", state_layout)
    dev = _checked(seed, dtype, device, batch=batch, num_k_heads=num_k_heads,
                   num_v_heads=num_v_heads, k_dim=k_dim, v_dim=v_dim, rows=rows, slots=slots)
    gen = generator(seed)
    lead = (batch,) if rows is None else (batch, rows)
    slots = batch if slots is None else slots
    if slots < batch:
        raise ValueError(f"slots: must be >= batch ({batch}), got {slots}")
    q = _randn(gen, *lead, num_k_heads, k_dim)
    k = _randn(gen, *lead, num_k_heads, k_dim)
    v = _randn(gen, *lead, num_v_heads, v_dim)
    a_log = torch.rand(num_v_heads, generator=gen) * 2.0 - 1.0          # A_log ~ U(-1, 1)
    a = _randn(gen, *lead, num_v_heads)
    g = -torch.exp(a_log) * F.softplus(a)
    beta = torch.sigmoid(_randn(gen, *lead, num_v_heads))
    state = _randn(gen, slots, num_v_heads, k_dim, v_dim, scale=0.1)
    if state_layout == "vk":
        state = state.transpose(-1, -2).contiguous()
    state_indices = torch.randperm(slots, generator=gen)[:batch].to(torch.int32)
    out = dict(q=q.to(dtype), k=k.to(dtype), v=v.to(dtype), g=g, beta=beta,
               state=state, state_indices=state_indices)
    return {name: t.to(dev) for name, t in out.items()}


def conv_inputs(
    seed: int,
    batch: int,
    dim: int,
    *,
    rows: int | None = None,
    d_conv: int = 4,
    state_len: int | None = None,
    slots: int | None = None,
    dtype: torch.dtype = torch.bfloat16,
    device: torch.device | str | None = None,
) -> dict[str, torch.Tensor]:
    """Inputs for the causal conv: ``x [B, (K,) dim]``, ``weight [dim, d_conv]`` (scale
    ``d_conv**-0.5``), ``bias [dim]``, ``conv_state [S, dim, state_len]`` (default
    ``state_len = max(1, d_conv - 1)``), all in ``dtype``; ``state_indices [B]`` int32 permuted slots.
    Raises ``ValueError`` naming the argument as ``gdn_inputs`` does."""
    dev = _checked(seed, dtype, device, batch=batch, dim=dim, rows=rows, d_conv=d_conv,
                   state_len=state_len, slots=slots)
    if slots is not None and slots < batch:
        raise ValueError(f"slots: must be >= batch ({batch}), got {slots}")
    least = max(1, d_conv - 1)             # what conv_update takes (a 1-wide window at least)
    if state_len is not None and state_len < least:
        raise ValueError(f"state_len: must be >= max(1, d_conv - 1) = {least} (the window the "
                         f"conv keeps), got {state_len}")
    gen = generator(seed)
    lead = (batch,) if rows is None else (batch, rows)
    slots = batch if slots is None else slots
    state_len = least if state_len is None else state_len
    x = _randn(gen, *lead, dim)
    weight = _randn(gen, dim, d_conv, scale=d_conv ** -0.5)
    bias = _randn(gen, dim, scale=0.1)
    conv_state = _randn(gen, slots, dim, state_len)
    state_indices = torch.randperm(slots, generator=gen)[:batch].to(torch.int32)
    out = dict(x=x.to(dtype), weight=weight.to(dtype), bias=bias.to(dtype),
               conv_state=conv_state.to(dtype), state_indices=state_indices)
    return {name: t.to(dev) for name, t in out.items()}


def pmll_inputs(
    seed: int,
    batch: int,
    heads: int,
    tokens: int,
    head_dim: int,
    *,
    gate: str | None = None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> dict[str, torch.Tensor | None]:
    """Inputs for one PMLL segment: ``k_new, v_new, q [B, H, T, D]`` in ``dtype``; ``gate``
    None, ``"bt"`` -> ``[B, T]`` or ``"bht"`` -> ``[B, H, T]`` fp32 in (0, 1). Raises
    ``ValueError`` naming the argument as ``gdn_inputs`` does."""
    dev = _checked(seed, dtype, device, zero_ok=("tokens",), batch=batch, heads=heads,
                   tokens=tokens, head_dim=head_dim)     # tokens = 0: an empty segment
    gen = generator(seed)
    shape = (batch, heads, tokens, head_dim)
    out = dict(k_new=_randn(gen, *shape).to(dtype), v_new=_randn(gen, *shape).to(dtype),
               q=_randn(gen, *shape).to(dtype))
    if gate is None:
        out["gate"] = None
    elif gate == "bt":
        out["gate"] = torch.rand(batch, tokens, generator=gen)
    elif gate == "bht":
        out["gate"] = torch.rand(batch, heads, tokens, generator=gen)
    else:
        raise ValueError(f"gate: must be None, 'bt' or 'bht', got {gate!r}")
    return {name: (None if t is None else t.to(dev)) for name, t in out.items()}
