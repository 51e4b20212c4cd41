"""Qwen3-Next and Qwen3.5 Gated DeltaNet layers, as transformers defines them, on our kernels.

A hybrid Qwen3-Next / Qwen3.5 decoder interleaves Gated DeltaNet ("linear_attention") layers with
gated full-attention layers. Each GDN layer projects the hidden state to the fused ``qkv``
channels (``dim = 2*HK*kd + HV*vd``), the output gate ``z`` and the per-head ``b`` (-> ``beta =
sigmoid(b)``) and ``a`` (-> ``g = -exp(A_log) * softplus(a + dt_bias)``), runs a depthwise
causal conv (width ``d_conv = 4``, SiLU) over ``qkv``, the delta rule over the l2-normalised
``q, k`` (SPEC §2), a gated RMSNorm with ``z`` and the output projection. Qwen3-Next packs the
projections as ``in_proj_qkvz`` / ``in_proj_ba`` grouped by key head
(``fix_query_key_value_ordering``); Qwen3.5 (dense and MoE) has separate ``in_proj_qkv``,
``in_proj_z``, ``in_proj_b``, ``in_proj_a``. Source: transformers 5.24,
``models/qwen3_next/modeling_qwen3_next.py`` and ``models/qwen3_5/modeling_qwen3_5.py``.

This module finds those layers in any such model (random or a real checkpoint), reproduces
their projections and gating exactly (the same torch expressions), and redirects their forward
to ``pmll_lab.models.cache.ServingCache`` whenever that cache is passed (``patch_model``);
with any other cache the layer runs transformers' own code, untouched. Attention layers,
MLP/MoE blocks, norms, embeddings and the LM head are never replaced.

The oracle: with fla-core installed, transformers binds the layer's four kernel entry points
(``torch_recurrent_gated_delta_rule``, ``torch_chunk_gated_delta_rule``, ``causal_conv1d_update``,
``causal_conv1d_fn``) to FLA's Triton kernels at import time, which fail on a CPU ("0 active
drivers"). ``hf_torch_path(model)`` rebinds them, for the duration of a ``with`` block, to the
pure-PyTorch functions transformers wraps (``__wrapped__``), so ``model.generate`` runs the
reference torch path on any device.
"""

from __future__ import annotations

import contextlib
import sys
import types
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from pmll_lab.models.common import GdnCache, check_transformers

TORCH_PATH_FUNCTIONS = ("torch_recurrent_gated_delta_rule", "torch_chunk_gated_delta_rule",
                        "causal_conv1d_update", "causal_conv1d_fn")
"""The names a GDN modeling module binds to FLA / causal-conv1d kernels when those are installed."""

_QWEN3_NEXT_PROJ = ("in_proj_qkvz", "in_proj_ba")
_QWEN3_5_PROJ = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")
_COMMON = ("A_log", "dt_bias", "conv1d", "norm", "out_proj")


def is_gdn_layer(module: nn.Module) -> bool:
    """True for a transformers Qwen3-Next / Qwen3.5 Gated DeltaNet module (by its parameters,
    so the dense, MoE and vision-language variants all match)."""
    if not all(hasattr(module, n) for n in _COMMON):
        return False
    return all(hasattr(module, n) for n in _QWEN3_NEXT_PROJ) or \
        all(hasattr(module, n) for n in _QWEN3_5_PROJ)


def gdn_layers(model: nn.Module) -> list[nn.Module]:
    """The model's GDN modules in layer order. Raises ``ValueError`` naming ``model`` when it
    has none."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    found = [m for m in model.modules() if is_gdn_layer(m)]
    if not found:
        raise ValueError(f"model: {type(model).__name__} has no Qwen3-Next / Qwen3.5 Gated "
                         "DeltaNet layers (modules with A_log, dt_bias, conv1d and in_proj_qkvz "
                         "or in_proj_qkv)")
    return sorted(found, key=lambda m: m.layer_idx)


@dataclass(frozen=True)
class GdnDims:
    """Sizes of one GDN layer: ``num_k_heads`` (HK), ``num_v_heads`` (HV), ``k_dim`` (kd),
    ``v_dim`` (vd), ``conv_dim = 2*HK*kd + HV*vd``, ``d_conv`` (conv width), its decoder
    ``layer_idx``."""

    num_k_heads: int
    num_v_heads: int
    k_dim: int
    v_dim: int
    conv_dim: int
    d_conv: int
    layer_idx: int

    @classmethod
    def of(cls, module: nn.Module) -> "GdnDims":
        """Read from a transformers GDN module; ``ValueError`` if its activation is not SiLU or
        its conv has a bias layout our conv kernel does not take."""
        if getattr(module, "activation", "silu") != "silu":
            raise ValueError(f"model: GDN layer {module.layer_idx} uses activation "
                             f"{module.activation!r}; the conv kernels implement SiLU only")
        return cls(module.num_k_heads, module.num_v_heads, module.head_k_dim, module.head_v_dim,
                   module.conv_dim, module.conv_kernel_size, module.layer_idx)


def modeling_module(module: nn.Module) -> types.ModuleType:
    """The Python module that defines ``module``'s class (where transformers bound its kernels)."""
    return sys.modules[type(module).__module__]


def torch_functions(module: nn.Module) -> dict:
    """transformers' own pure-PyTorch versions of the layer's kernel entry points (name ->
    function): the function each wrapper was made from (``__wrapped__``), or the module's
    function when it is not wrapped."""
    mod = modeling_module(module)
    out = {}
    for name in TORCH_PATH_FUNCTIONS:
        fn = getattr(mod, name)
        out[name] = getattr(fn, "__wrapped__", fn)
    return out


@contextlib.contextmanager
def hf_torch_path(model: nn.Module):
    """Within the block, the model's GDN layers run transformers' pure-PyTorch path
    (``torch_chunk_gated_delta_rule`` for prefill, ``torch_recurrent_gated_delta_rule`` for one
    token, the torch causal conv) whatever kernels are installed; restored on exit.

    Why: with fla-core installed transformers binds FLA's Triton kernels at import, which fail
    without a GPU driver and are not the reference we want to compare against. Affects the
    modeling modules of this model's GDN classes (process-wide while the block runs)."""
    saved = []
    for mod_obj in {modeling_module(m) for m in gdn_layers(model)}:
        for name in TORCH_PATH_FUNCTIONS:
            fn = getattr(mod_obj, name, None)
            if fn is not None and hasattr(fn, "__wrapped__"):
                saved.append((mod_obj, name, fn))
                setattr(mod_obj, name, fn.__wrapped__)
    try:
        yield model
    finally:
        for mod_obj, name, fn in reversed(saved):
            setattr(mod_obj, name, fn)


# ---- the layer's own arithmetic, as transformers writes it -------------------------------------

def project(module: nn.Module, hidden_states: torch.Tensor):
    """The layer's input projections, exactly as its forward computes them.

    ``hidden_states [B, T, hidden]`` -> ``(mixed_qkv [B, T, conv_dim], z [B, T, HV, vd],
    b [B, T, HV], a [B, T, HV])`` in the model's dtype; ``mixed_qkv`` holds ``[q | k | v]``
    (head-major within each), the conv's input."""
    B, T, _ = hidden_states.shape
    if hasattr(module, "in_proj_qkvz"):
        qkvz = module.in_proj_qkvz(hidden_states)
        ba = module.in_proj_ba(hidden_states)
        q, k, v, z, b, a = module.fix_query_key_value_ordering(qkvz, ba)
        q, k, v = (t.reshape(B, T, -1) for t in (q, k, v))
        mixed = torch.cat((q, k, v), dim=-1)
        return mixed, z, b, a
    mixed = module.in_proj_qkv(hidden_states)
    z = module.in_proj_z(hidden_states).reshape(B, T, -1, module.head_v_dim)
    return mixed, z, module.in_proj_b(hidden_states), module.in_proj_a(hidden_states)


def gating(module: nn.Module, a: torch.Tensor, b: torch.Tensor):
    """``(g, beta)`` fp32 ``[B, T, HV]``: ``beta = sigmoid(b)`` and ``g = -exp(A_log) *
    softplus(a + dt_bias)``, the layer's own expressions, then cast to fp32 as its delta-rule
    functions do on entry (SPEC §2 "Gating")."""
    beta = b.sigmoid()
    g = -module.A_log.float().exp() * F.softplus(a.float() + module.dt_bias)
    return g.to(torch.float32), beta.to(torch.float32)


def finish(module: nn.Module, core: torch.Tensor, z: torch.Tensor, dtype: torch.dtype):
    """The layer's output: gated RMSNorm of the delta-rule output ``core [B, T, HV, vd]`` with
    ``z``, then ``out_proj``. ``core`` is cast to ``dtype`` (the model's) first, as transformers'
    delta-rule functions return it."""
    B, T = core.shape[:2]
    vd = module.head_v_dim
    out = module.norm(core.to(dtype).reshape(-1, vd), z.reshape(-1, vd))
    return module.out_proj(out.reshape(B, T, -1))


# ---- the redirect -----------------------------------------------------------------------------

def _patched_forward(self, hidden_states, cache=None, attention_mask=None, **kwargs):
    """Installed by ``patch_model``: our kernels when ``cache`` is a ``ServingCache`` (a
    ``GdnCache``), else the layer's own forward unchanged."""
    if cache is None:
        cache = kwargs.pop("cache_params", None)
    if isinstance(cache, GdnCache):
        return cache.gdn_forward(self, hidden_states)
    return self._pmll_lab_forward(hidden_states, cache=cache, attention_mask=attention_mask,
                                  **kwargs)


def patch_model(model: nn.Module) -> list[nn.Module]:
    """Route every GDN layer of ``model`` through ``ServingCache.gdn_forward`` when that cache is
    passed (instance attribute ``forward``; idempotent). With any other cache, or none, the layer
    runs transformers' forward as before, so ``model.generate`` is unaffected. Returns the GDN
    modules in layer order."""
    layers = gdn_layers(model)
    for m in layers:
        GdnDims.of(m)
        if not hasattr(m, "_pmll_lab_forward"):
            m._pmll_lab_forward = m.forward
            m.forward = types.MethodType(_patched_forward, m)
    return layers


# ---- small seeded configs -----------------------------------------------------------------------

def _layer_types(gdn_per_attention: int, groups: int) -> list[str]:
    return (["linear_attention"] * gdn_per_attention + ["full_attention"]) * groups


# Set through a config's keyword arguments but stored under another name (``_attn_implementation``...).
_LOADING_KWARGS = ("attn_implementation", "experts_implementation")


def with_overrides(config_cls, base: dict, overrides: dict) -> dict:
    """``base`` updated with ``overrides``, ``num_hidden_layers`` set to ``len(layer_types)``.

    Why: transformers keeps an unknown keyword as an extra attribute that nothing reads (a typo
    would pass unnoticed), and the layer count is the length of ``layer_types``. Raises
    ``ValueError`` naming an override ``config_cls`` has no field for, or a
    ``num_hidden_layers`` that disagrees with ``layer_types``."""
    import inspect

    known = set(inspect.signature(config_cls.__init__).parameters) | set(_LOADING_KWARGS)
    default = None
    for name in overrides:
        if name in known:
            continue
        default = config_cls() if default is None else default
        if not hasattr(default, name):
            raise ValueError(f"{name}: not a field of {config_cls.__name__} (a typo?)")
    out = {**base, **overrides}
    n = len(out["layer_types"])
    if out.get("num_hidden_layers", n) != n:
        raise ValueError(f"num_hidden_layers: {out['num_hidden_layers']} disagrees with "
                         f"layer_types ({n} layers); the layer count is len(layer_types), give "
                         "layer_types instead")
    out["num_hidden_layers"] = n
    return out


def tiny_config(kind: str = "qwen3_next", **overrides):
    """A small config of a real architecture: ``kind`` ``"qwen3_next"`` (MoE MLP, 4 experts top
    2, shared expert) or ``"qwen3_5"`` (dense MLP). Hidden size 64, layers ``linear, linear,
    full`` (two GDN layers, one gated attention), GDN HK=1, HV=2, kd=16, vd=8 (``kd != vd``, so
    a transposed state cannot pass unnoticed; one program per head in both layouts, cheap on
    the interpreter), attention 2 heads
    (1 KV head) of 16, vocab 256, eager attention and experts (float64 capable).
    ``overrides`` replace any field of the config class; the layer count is
    ``len(layer_types)``. Raises ``ValueError`` for another ``kind``, an override that is not a
    field of the config class, or a ``num_hidden_layers`` that disagrees with ``layer_types``."""
    base = dict(vocab_size=256, hidden_size=64, intermediate_size=128,
                layer_types=["linear_attention", "linear_attention", "full_attention"],
                num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=16,
                linear_value_head_dim=8, linear_conv_kernel_dim=4, max_position_embeddings=512,
                attn_implementation="eager")
    if kind == "qwen3_next":
        check_transformers()
        from transformers import Qwen3NextConfig as Config

        base.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                    shared_expert_intermediate_size=32, experts_implementation="eager")
    elif kind == "qwen3_5":
        check_transformers()
        from transformers import Qwen3_5TextConfig as Config
    else:
        raise ValueError(f"kind: expected 'qwen3_next' or 'qwen3_5', got {kind!r}")
    return Config(**with_overrides(Config, base, overrides))


def qwen3_next_sized_config(*, gdn_layers: int = 9, gdn_per_attention: int = 3,
                            hidden_size: int = 2048, vocab_size: int = 32768,
                            intermediate_size: int = 2048, **overrides):
    """A Qwen3-Next-sized GDN stack: Qwen3-Next-80B's GDN layer shape (HK=16, HV=32,
    kd=vd=128, conv width 4, hidden 2048; its attention shape: 16 heads, 2 KV heads of 256) in
    groups of ``gdn_per_attention`` GDN layers and one attention layer (Qwen3-Next's 3:1),
    ``gdn_layers`` GDN layers in all, a dense MLP of ``intermediate_size`` in place of the
    512-expert MoE, a ``vocab_size`` vocabulary. For timing the GDN path at its real size
    with random weights; ``overrides`` replace any field of ``Qwen3NextConfig`` (the layer count
    is ``len(layer_types)``). Raises ``ValueError`` for ``gdn_layers`` not a multiple of
    ``gdn_per_attention``, an override that is not a field, or a ``num_hidden_layers`` that
    disagrees with ``layer_types``."""
    check_transformers()
    from transformers import Qwen3NextConfig

    if gdn_layers % gdn_per_attention:
        raise ValueError(f"gdn_layers: {gdn_layers} is not a multiple of gdn_per_attention "
                         f"= {gdn_per_attention}")
    base = dict(vocab_size=vocab_size, hidden_size=hidden_size,
                intermediate_size=intermediate_size,
                layer_types=_layer_types(gdn_per_attention, gdn_layers // gdn_per_attention),
                num_attention_heads=16, num_key_value_heads=2, head_dim=256,
                linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
                linear_value_head_dim=128, linear_conv_kernel_dim=4, num_experts=0,
                max_position_embeddings=4096)
    return Qwen3NextConfig(**with_overrides(Qwen3NextConfig, base, overrides))


def build_model(config, *, seed: int = 0, dtype: torch.dtype = torch.float32, device=None):
    """A randomly initialised causal LM for ``config`` (Qwen3-Next or Qwen3.5 text), seeded,
    in eval mode, in ``dtype`` on ``device``, with the GDN layers patched (``patch_model``).

    Why random: no weights can be downloaded here; ``A_log`` and ``dt_bias`` keep
    transformers' initialisation (decays of real magnitude). A real checkpoint goes through
    ``patch_model(AutoModelForCausalLM.from_pretrained(...))`` instead."""
    check_transformers()
    from transformers import Qwen3_5ForCausalLM, Qwen3NextForCausalLM

    cls = Qwen3NextForCausalLM if config.model_type == "qwen3_next" else Qwen3_5ForCausalLM
    dev = torch.device(device) if device is not None else torch.device("cpu")
    with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []), dev:
        torch.manual_seed(seed)
        model = cls(config)          # initialised where it will run (fast on a GPU)
    model = model.to(dtype=dtype).eval()
    patch_model(model)
    return model
