"""One GDN layer of a carried-state stack (``CarryLayer``) and what a step hands each layer: the
checks of its fields and of the stack, its gating keywords, the q, k, v views of its conv output,
and the argument checks of its verify run before anything launches (SPEC §3b, §3c).

Driven by ``SpecDecodeStep`` (``pmll_lab.serving.spec_decode_step``); both are public through
``pmll_lab.carry``. Every check raises ``ValueError`` naming the field or argument.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from pmll_lab import _checks
from pmll_lab.ops.carry.common import check_form, check_state
from pmll_lab.ops.carry.exact import check_verify
from pmll_lab.ops.carry.stash import GdnCarry, check_carry
from pmll_lab.ops.conv.carry import ConvCarry, check_verify_args
from pmll_lab.ops.gdn.gating import split_gating
from pmll_lab.ops.gdn.recurrence import DEFAULT_STATE_LAYOUT, check_layout


@dataclass(eq=False)
class CarryLayer:
    """One GDN layer of a stack driven by ``SpecDecodeStep``.

    ``state`` (fp32, bf16 or fp16) in ``state_layout`` (``[S, HV, vd, kd]`` for ``"vk"``, the
    default, ``[S, HV, kd, vd]`` for ``"kv"``) and its ``carry`` (``GdnCarry`` made for the same
    ``state_layout``: refused otherwise, naming ``carry``). Optionally the causal conv
    that feeds it (SPEC §3c): ``conv_state [S, dim, state_len]``, ``conv_carry`` (``ConvCarry``),
    ``conv_weight [dim, d_conv]``, ``conv_bias [dim]`` or None, with
    ``dim = 2*HK*kd + HV*vd`` (``num_k_heads`` = HK required). With a conv the layer's input is
    ``x [B, K, dim]`` and q, k, v are views of the conv output's channels ``[q | k | v]``
    (Qwen3-Next's order). ``qk_l2norm_in_conv``: the conv l2-normalises the q and k channels
    (the seed's fused conv) and the GDN kernel does not; else the GDN kernel does.
    Without a conv, ``use_qk_l2norm`` is passed to the GDN kernel. ``state_layout`` is passed
    to every launch of the layer.
    ``A_log``, ``dt_bias``: optional ``[HV]`` gating parameters of the layer, used when a step
    passes ``a, b`` instead of ``g, beta`` (the gating computed in the verify kernel).

    Construction checks the fields (``ValueError`` naming the field): ``state`` and ``carry``
    as ``gdn_carry_verify`` needs them, and with ``conv_state`` given a ``ConvCarry``, a
    ``conv_weight`` tensor and ``num_k_heads``.
    """

    state: torch.Tensor
    carry: GdnCarry
    conv_state: torch.Tensor | None = None
    conv_carry: object | None = None
    conv_weight: torch.Tensor | None = None
    conv_bias: torch.Tensor | None = None
    num_k_heads: int | None = None
    qk_l2norm_in_conv: bool = True
    use_qk_l2norm: bool = True
    state_layout: str = DEFAULT_STATE_LAYOUT
    A_log: torch.Tensor | None = None
    dt_bias: torch.Tensor | None = None

    @property
    def has_conv(self) -> bool:
        return self.conv_state is not None

    def carries(self) -> list:
        return [self.carry] + ([self.conv_carry] if self.has_conv else [])

    def __post_init__(self):
        _check_layer("", self)


def _check_layer(prefix: str, lay: CarryLayer) -> None:
    """The fields a ``SpecDecodeStep`` relies on; errors name ``prefix + field``."""
    check_layout(f"{prefix}state_layout", lay.state_layout)
    check_state(f"{prefix}state", lay.state)
    check_carry(f"{prefix}carry", lay.carry, lay.state, lay.state_layout)
    for name in ("A_log", "dt_bias"):
        if getattr(lay, name) is not None:
            _checks.tensor(f"{prefix}{name}", getattr(lay, name), shape=(lay.state.shape[1],),
                           dtype=_checks.FLOAT_DTYPES, device=lay.state.device, contiguous=True)
    if lay.conv_state is not None:
        _checks.tensor(f"{prefix}conv_state", lay.conv_state, ndim=3)
        if not isinstance(lay.conv_carry, ConvCarry):
            raise ValueError(f"{prefix}conv_carry: a conv needs a ConvCarry, got "
                             f"{type(lay.conv_carry).__name__}")
        _checks.tensor(f"{prefix}conv_weight", lay.conv_weight, ndim=2)
        if lay.num_k_heads is None:
            raise ValueError(f"{prefix}num_k_heads: required with a conv")
        _checks.positive_int(f"{prefix}num_k_heads", lay.num_k_heads)
        if lay.conv_carry.cap != lay.carry.cap:
            raise ValueError(f"{prefix}conv_carry: cap {lay.conv_carry.cap} differs from "
                             f"carry.cap {lay.carry.cap}")
        c = lay.carry
        dim = 2 * lay.num_k_heads * c.k_dim + c.num_v_heads * c.v_dim
        if lay.conv_state.shape[1] != dim:
            raise ValueError(f"{prefix}conv_state: {lay.conv_state.shape[1]} channels, but the "
                             f"conv feeds q, k, v: 2*HK*kd + HV*vd = {dim}")


def check_stack(layers: Sequence[CarryLayer], form: str) -> list[CarryLayer]:
    """``SpecDecodeStep``'s checks of a stack: at least one ``CarryLayer``, ``form`` in ``FORMS``,
    every layer's fields (they may have changed since construction), one state shape, ``CAP`` and
    ``state_layout`` for all, a conv in every layer or in none, and no two buffers a step writes (states, stashes, ``pend``, conv windows) sharing memory.
    Returns ``layers`` as a list."""
    layers = list(layers)
    if not layers:
        raise ValueError("layers: need at least one CarryLayer")
    check_form("form", form)
    for i, lay in enumerate(layers):
        if not isinstance(lay, CarryLayer):
            raise ValueError(f"layers[{i}]: expected a CarryLayer, got {type(lay).__name__}")
        _check_layer(f"layers[{i}].", lay)      # fields may have changed since construction
        if lay.state.shape != layers[0].state.shape or lay.carry.cap != layers[0].carry.cap:
            raise ValueError(f"layers[{i}]: state shape / CAP differ from layers[0]")
        if lay.state_layout != layers[0].state_layout:
            raise ValueError(f"layers[{i}]: state_layout differs from layers[0]")
        if lay.has_conv != layers[0].has_conv:
            raise ValueError(f"layers[{i}]: every layer has a conv or none does")
    # a step writes every layer's state, stash, pend (and conv window, stash, pend): no two
    # of them may share memory (two layers on one state would fold each other's rows)
    written = {}
    for i, lay in enumerate(layers):
        written.update({f"layers[{i}].state": lay.state, f"layers[{i}].carry.buf": lay.carry.buf,
                        f"layers[{i}].carry.pend": lay.carry.pend})
        if lay.has_conv:
            written.update({f"layers[{i}].conv_state": lay.conv_state,
                            f"layers[{i}].conv_carry.stash": lay.conv_carry.stash,
                            f"layers[{i}].conv_carry.pend": lay.conv_carry.pend})
    _checks.apart(written)
    return layers


def layer_gates(lay: CarryLayer, g, beta, A_log, a, dt_bias, b) -> dict:
    """The gating keywords of layer ``lay``'s verify: with ``a, b`` given, ``A_log`` and
    ``dt_bias`` default to the layer's fields."""
    if g is None and beta is None and (a is not None or b is not None):
        A_log = lay.A_log if A_log is None else A_log
        dt_bias = lay.dt_bias if dt_bias is None else dt_bias
    return dict(g=g, beta=beta, A_log=A_log, a=a, dt_bias=dt_bias, b=b)


def conv_qkv(lay: CarryLayer, y: torch.Tensor) -> tuple:
    """``q, k [B, K, HK, kd]`` and ``v [B, K, HV, vd]``: views of the conv output ``y``."""
    HK, kd, vd, HV = lay.num_k_heads, lay.carry.k_dim, lay.carry.v_dim, lay.carry.num_v_heads
    qk = 2 * HK * kd
    return (y[..., :HK * kd].unflatten(-1, (HK, kd)),
            y[..., HK * kd:qk].unflatten(-1, (HK, kd)),
            y[..., qk:].unflatten(-1, (HV, vd)))


def check_input_keys(inputs, layers: Sequence[CarryLayer]) -> None:
    """``inputs`` holds one dict per layer, each with exactly the keys its layer takes: ``x``
    (a conv layer) or ``q, k, v``, and ``g, beta`` or ``a, b`` (optionally ``A_log``,
    ``dt_bias``)."""
    if not isinstance(inputs, (list, tuple)) or len(inputs) != len(layers):
        got = len(inputs) if isinstance(inputs, (list, tuple)) else type(inputs).__name__
        raise ValueError(f"inputs: need one dict per layer ({len(layers)}), got {got}")
    for i, (inp, lay) in enumerate(zip(inputs, layers)):
        if not isinstance(inp, dict):
            raise ValueError(f"inputs[{i}]: expected a dict, got {type(inp).__name__}")
        base = {"x"} if lay.has_conv else {"q", "k", "v"}
        extra = set(inp) - base
        if not base <= set(inp) or not (extra == {"g", "beta"} or
                                         {"a", "b"} <= extra <= {"a", "b", "A_log", "dt_bias"}):
            raise ValueError(f"inputs[{i}]: expected keys {sorted(base)} and g, beta (or a, b "
                             f"and optionally A_log, dt_bias), got {sorted(inp)}")


def check_layer_inputs(lay: CarryLayer, dev_tab, lazy, rows, form, scale, validate, *, g=None,
                       beta=None, q=None, k=None, v=None, x=None, A_log=None, a=None,
                       dt_bias=None, b=None) -> None:
    """``SpecDecodeStep.verify_layer``'s launches' argument checks for layer ``lay``, with
    nothing launched: the conv verify's (``check_verify_args``), then the GDN verify's on a
    stand-in for the conv output (a zero ``[B, K, dim]`` tensor of its dtype: finite, so
    ``validate``'s value checks hold the real inputs, the conv's ``x`` and the states, not it)."""
    g, beta, gating = split_gating(**layer_gates(lay, g, beta, A_log, a, dt_bias, b))
    if lay.has_conv:
        kd = lay.carry.k_dim
        qk = 2 * lay.num_k_heads * kd
        B, K, dim, _, _, out_dtype = check_verify_args(
            lay.conv_state, lay.conv_carry, x, lay.conv_weight, lay.conv_bias,
            slot_tab=dev_tab, lazy=lazy, qk_channels=qk if lay.qk_l2norm_in_conv else 0,
            head_dim=kd, validate=validate)
        q, k, v = conv_qkv(lay, torch.zeros(B, K, dim, dtype=out_dtype, device=x.device))
        lead = "x"
    else:
        lead = "q"
    check_verify(lay.state, lay.carry, q, k, v, g, beta, dev_tab, form, lazy, scale, validate,
                 None, lay.state_layout, gating)
    if q.shape[1] != rows:
        raise ValueError(f"{lead}: {q.shape[1]} rows, but inputs[0] has {rows}")
