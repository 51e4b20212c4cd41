"""What the model modules share, below all of them: the LM head's vocabulary size (checked) and
the base class of the cache the patched GDN layers hand their forward to. ``qwen3_next``,
``cache`` and ``generate`` import it; it imports none of them."""

from __future__ import annotations

import abc
import re
from functools import lru_cache

import torch
from torch import nn

TRANSFORMERS_RANGE = ((5, 24), (6, 0))
"""The transformers releases these modules run on, ``[low, high)`` (pyproject's ``models``
extra says the same: a test holds them equal): the cache and attention-mask interfaces they
drive changed across 5.x (5.17, the GPU image's, builds masks that do not match the cache)."""


@lru_cache(maxsize=1)
def check_transformers() -> str:
    """The installed transformers version, if within ``TRANSFORMERS_RANGE``; else
    ``RuntimeError`` naming it and the range (``ImportError`` when not installed), so a model
    run fails with the reason before any step, not with a shape error inside one."""
    try:
        import transformers
    except ImportError as e:
        raise ImportError("pmll_lab.models needs transformers (pip install 'pmll_lab[models]')"
                          ) from e
    found = transformers.__version__
    parts = tuple(int(x) for x in re.findall(r"\d+", found)[:2])
    (lo, hi) = TRANSFORMERS_RANGE
    if not lo <= parts < hi:
        raise RuntimeError(
            f"transformers {found}: pmll_lab.models needs >={lo[0]}.{lo[1]},<{hi[0]}.{hi[1]} "
            "(pip install 'pmll_lab[models]'; on the GPU machine carry the .whlm wheels, "
            "docs/h200-runs.md)")
    return found


def vocab_size(model) -> int:
    """The LM head's vocabulary size. Raises ``TypeError`` naming ``model`` when it is not a
    transformers causal LM (a torch module with an output embedding), before any step runs."""
    check_transformers()
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a transformers Qwen3-Next / Qwen3.5 causal LM, got "
                        f"{type(model).__name__}")
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    weight = getattr(head, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        raise TypeError(f"model: {type(model).__name__} is not a transformers causal LM (no "
                        "output embedding / LM head); expected a Qwen3-Next / Qwen3.5 model")
    return weight.shape[0]


class GdnCache(abc.ABC):
    """A cache whose ``gdn_forward(module, hidden_states)`` runs a GDN layer patched by
    ``pmll_lab.models.qwen3_next.patch_model`` (``pmll_lab.models.cache.ServingCache``); the
    patched layer runs transformers' forward for any other cache."""

    @abc.abstractmethod
    def gdn_forward(self, module: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
        """The GDN layer ``module``'s output for ``hidden_states`` ``[B, T, hidden]``, its
        state kept by this cache."""
