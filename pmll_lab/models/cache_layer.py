"""One GDN layer of a ``ServingCache``: its buffers, the kernels a step runs on them, their size.

``GdnLayer`` holds, for every slot, the layer's conv window ``[S, conv_dim, d_conv]`` (conv
dtype), its recurrent state (the pool's dtype, ``[S, HV, vd, kd]`` with ``state_layout="vk"``,
the default, ``[S, HV, kd, vd]`` with ``"kv"``), the conv weights in the conv dtype, and the
carried-state stashes or the chain's snapshot buffers once the cache sets them; its ``prefill`` /
``decode`` / ``chain`` run a
step's conv and delta rule on the slots given (the carried forms run in
``pmll_lab.carry.SpecDecodeStep``; the ring form's stack, ``ring_stack``, in
``pmll_lab.serving.ring_step.RingStep``). ``state_bytes_per_sequence``: what one sequence holds in the
cache, from the model's config alone. Both are reachable from ``pmll_lab.models.cache``, whose
docstring describes the steps.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pmll_lab.carry import (GDN_CARRY_CAP, ConvCarry, GdnRing, snapshot_bytes_per_slot,
                            stash_bytes_per_slot)
from pmll_lab.conv import conv_chain, conv_update
from pmll_lab.gdn import gdn_chain, gdn_decode
from pmll_lab.models.qwen3_next import GdnDims, torch_functions
from pmll_lab.models.timing import StepTimer
from pmll_lab.serving.ring_step import RingLayer, RingStep


class GdnLayer:
    """One GDN layer's buffers in the cache (``layout`` and ``conv_dtype`` as the cache's), and
    the kernels of a step on them: ``slot`` / ``slot_tab`` (int32 on the device) name the slots
    of the step's sequences, ``timer`` times the kernel sections."""

    def __init__(self, module, dims: GdnDims, slots, layout, conv_dtype, device,
                 state_dtype=torch.float32):
        self.module, self.dims = module, dims
        self.layout, self.conv_dtype = layout, conv_dtype
        HV, kd, vd = dims.num_v_heads, dims.k_dim, dims.v_dim
        shape = (slots, HV, kd, vd) if layout == "kv" else (slots, HV, vd, kd)
        self.state = torch.zeros(shape, dtype=state_dtype, device=device)
        self.conv_state = torch.zeros(slots, dims.conv_dim, dims.d_conv, dtype=conv_dtype,
                                      device=device)
        w = module.conv1d.weight.detach()
        self.conv_weight = w.reshape(w.shape[0], w.shape[-1]).to(conv_dtype).contiguous()
        bias = module.conv1d.bias
        self.conv_bias = None if bias is None else bias.detach().to(conv_dtype).contiguous()
        self.torch_fns = torch_functions(module)
        self.carry = self.conv_carry = None
        self.inter = self.conv_inter = None

    def qkv(self, y):
        """Views ``q [.., HK, kd]``, ``k``, ``v [.., HV, vd]`` of the conv output's channels."""
        d = self.dims
        nk = d.num_k_heads * d.k_dim
        q = y[..., :nk].unflatten(-1, (d.num_k_heads, d.k_dim))
        k = y[..., nk:2 * nk].unflatten(-1, (d.num_k_heads, d.k_dim))
        v = y[..., 2 * nk:].unflatten(-1, (d.num_v_heads, d.v_dim))
        return q, k, v

    def prefill(self, mixed, g, beta, slot: int):
        """transformers' own prefill (no previous state): conv window from the raw inputs,
        ``causal_conv1d_fn``, ``torch_chunk_gated_delta_rule``; final state into the slot."""
        module, fns = self.module, self.torch_fns
        x = mixed.transpose(1, 2)                                   # [1, dim, T]
        T, dc = x.shape[-1], self.dims.d_conv
        full = F.pad(x, (dc - T, 0)) if T < dc else x
        self.conv_state[slot] = full[0, :, -dc:].to(self.conv_dtype)
        w = module.conv1d.weight
        y = fns["causal_conv1d_fn"](full, w.reshape(w.shape[0], w.shape[-1]), module.conv1d.bias,
                                    activation=module.activation)[:, :, -T:]
        q, k, v = self.qkv(y.transpose(1, 2))
        core, final = fns["torch_chunk_gated_delta_rule"](
            q, k, v, g=g, beta=beta, initial_state=None, output_final_state=True,
            use_qk_l2norm_in_kernel=True)
        final = final[0].to(torch.float32)
        self.state[slot] = final if self.layout == "kv" else final.transpose(-1, -2)
        return core

    def decode(self, x, g, beta, slot_tab: torch.Tensor, timer: StepTimer):
        """One row per sequence: ``conv_update`` + ``gdn_decode`` (SPEC §2), states in place."""
        with timer("conv_update"):
            y = conv_update(self.conv_state, x, self.conv_weight, self.conv_bias,
                            state_indices=slot_tab)
        q, k, v = self.qkv(y)
        with timer("gdn_decode"):
            return gdn_decode(self.state, q, k, v, g, beta, state_indices=slot_tab,
                              use_qk_l2norm=True, state_layout=self.layout)

    def chain(self, x, g, beta, slot_tab: torch.Tensor, timer: StepTimer):
        """``K`` rows per sequence: ``conv_chain`` + ``gdn_chain`` (SPEC §3a); the windows and
        states after rows ``0 .. K-2`` (snapshots) into ``conv_inter`` / ``inter``."""
        B, K = x.shape[:2]
        with timer("conv_chain"):
            y = conv_chain(self.conv_state, x, self.conv_weight, self.conv_bias,
                           state_indices=slot_tab,
                           intermediate=self.conv_inter[:B, :K - 1] if K > 1 else None)
        q, k, v = self.qkv(y)
        with timer("gdn_chain"):
            return gdn_chain(self.state, q, k, v, g, beta, state_indices=slot_tab,
                             intermediate=self.inter[:B, :K - 1] if K > 1 else None,
                             use_qk_l2norm=True, state_layout=self.layout)


def ring_stack(cache) -> RingStep:
    """The ring form's driver over ``cache``'s GDN layers (``cache.gdn``, V-major states): a
    ``GdnRing`` of ``cache.ring_length`` rows in the state pool's dtype and a conv carry per
    layer (stored on the layer as ``ring`` / ``conv_carry``); the conv carry is lazy unless
    ``cache.lazy_min_seqs`` is None (always eager)."""
    layers = []
    for lay in cache.gdn:
        d = lay.dims
        lay.ring = GdnRing.empty(cache.slots, d.num_k_heads, d.num_v_heads, d.k_dim, d.v_dim,
                                 length=cache.ring_length, dtype=lay.state.dtype,
                                 device=cache.device)
        lay.conv_carry = ConvCarry.empty(cache.slots, d.conv_dim, cap=cache.cap,
                                         dtype=cache.conv_dtype, device=cache.device)
        layers.append(RingLayer(lay.state, lay.ring, lay.conv_state, lay.conv_carry,
                                lay.conv_weight, lay.conv_bias, d.num_k_heads))
    return RingStep(layers, conv_lazy=cache.lazy_min_seqs is not None, timer=cache.timer)


def state_bytes_per_sequence(model_or_config, *, rows: int, cap: int = GDN_CARRY_CAP,
                             dtype: torch.dtype | None = None) -> dict:
    """Bytes one sequence holds in a ``ServingCache``, summed over the GDN layers:
    ``gdn_state`` (fp32), ``conv_window`` (``conv_dim * d_conv`` in the conv dtype: bf16 for a
    bf16 model, else fp32), the carried forms' ``carry_stash`` (GDN ``CAP*(HV*vd + HV + HV*kd)``
    fp32 + conv ``CAP*conv_dim``), the chain's ``snapshots`` for ``rows`` (K): ``(K-1)`` states
    and windows; and ``kv_per_token`` over the attention layers (model dtype).

    ``model_or_config``: a model (its config and parameter dtype) or a transformers Qwen3-Next /
    Qwen3.5 config (then ``dtype``, default bf16, is the model dtype): no weights needed, so real
    model sizes can be tabulated. ``ValueError`` if it has no GDN layers."""
    if isinstance(model_or_config, nn.Module):
        cfg = model_or_config.config.get_text_config()
        dtype = dtype or next(model_or_config.parameters()).dtype
    else:
        cfg = model_or_config.get_text_config()
        dtype = dtype or torch.bfloat16
    n_gdn = sum(t == "linear_attention" for t in cfg.layer_types)
    if not n_gdn:
        raise ValueError("model_or_config: no linear_attention (Gated DeltaNet) layers")
    HK, HV = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    kd, vd, dc = cfg.linear_key_head_dim, cfg.linear_value_head_dim, cfg.linear_conv_kernel_dim
    dim = 2 * HK * kd + HV * vd
    ce = 2 if dtype == torch.bfloat16 else 4
    hb = 4 * HV * kd * vd
    win = dim * dc * ce
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    n_attn = cfg.num_hidden_layers - n_gdn
    return dict(
        gdn_state=n_gdn * hb, conv_window=n_gdn * win,
        carry_stash=n_gdn * (stash_bytes_per_slot(HV, kd, vd, cap) + cap * dim * ce),
        snapshots=n_gdn * (snapshot_bytes_per_slot(HV, kd, vd, rows) + (rows - 1) * win),
        kv_per_token=n_attn * 2 * cfg.num_key_value_heads * head_dim
        * torch.empty((), dtype=dtype).element_size())
