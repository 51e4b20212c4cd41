"""Bad arguments of the model-level API are refused up front, naming the argument.

``tiny_config`` / ``qwen3_next_sized_config`` overrides, and ``greedy_generate`` /
``speculative_generate``'s ``model``, ``pad_token_id``, ``max_new_tokens``, ``draft`` (what a
draft callable returns) and the noisy draft's ``draft_accept`` / ``reference``. "Up front" is
checked by making the serving cache's construction fail the test: an argument error must come
before it, so before any prefill or step. One tiny float64 Qwen3-Next (hidden 64, two GDN
layers) runs the few cases that need steps.
"""

from __future__ import annotations

import re

import pytest
import torch

from pmll_lab.models import generate as G
from pmll_lab.models.drafts import make_draft
from pmll_lab.models.generate import greedy_generate, speculative_generate
from pmll_lab.models.qwen3_next import build_model, qwen3_next_sized_config, tiny_config

PROMPTS = [[5, 17, 3], [9, 2], [40, 41, 42, 43]]


@pytest.fixture(scope="module")
def model():
    return build_model(tiny_config("qwen3_next"), seed=0, dtype=torch.float64)


@pytest.fixture
def no_steps(monkeypatch):
    """Any attempt to build the serving cache (the first thing before a prefill) fails."""
    def refuse(*args, **kwargs):
        raise AssertionError("reached the serving cache: the argument was not checked up front")
    monkeypatch.setattr(G, "make_cache", refuse)


# ---- configs ----------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["qwen3_next", "qwen3_5"])
def test_config_overrides_must_be_fields_and_agree_with_layer_types(kind):
    cfg = tiny_config(kind, hidden_size=32, num_hidden_layers=3)
    assert cfg.hidden_size == 32 and cfg.num_hidden_layers == 3
    four = ["linear_attention", "full_attention"] * 2
    assert tiny_config(kind, layer_types=four).num_hidden_layers == 4
    assert tiny_config(kind, layer_types=four, num_hidden_layers=4).num_hidden_layers == 4
    with pytest.raises(ValueError, match=r"^num_hidden_layers: 4 disagrees with layer_types "
                                         r"\(3 layers\)"):
        tiny_config(kind, num_hidden_layers=4)
    with pytest.raises(ValueError, match=r"^hiden_size: not a field of"):
        tiny_config(kind, hiden_size=32)


def test_dense_config_refuses_moe_fields_and_sized_config_checks_too():
    with pytest.raises(ValueError, match=r"^num_experts: not a field of Qwen3_5TextConfig"):
        tiny_config("qwen3_5", num_experts=4)
    assert tiny_config("qwen3_next", num_experts=8).num_experts == 8
    assert qwen3_next_sized_config(gdn_layers=3).num_hidden_layers == 4
    with pytest.raises(ValueError, match=r"^num_hidden_layers: 5 disagrees with layer_types "
                                         r"\(4 layers\)"):
        qwen3_next_sized_config(gdn_layers=3, num_hidden_layers=5)
    with pytest.raises(ValueError, match=r"^linear_num_key_head: not a field"):
        qwen3_next_sized_config(linear_num_key_head=8)


# ---- generation arguments, before any step -----------------------------------------------------

def _both(m, **kw):
    """Call greedy_generate, then speculative_generate (ngram draft, K=2), with ``kw``."""
    base = dict(max_new_tokens=2)
    base.update(kw)
    yield lambda: greedy_generate(m, PROMPTS, **base)
    yield lambda: speculative_generate(m, PROMPTS, draft="ngram", K=2, **base)


@pytest.mark.parametrize("bad", [torch.nn.Linear(2, 2), "qwen", None])
def test_model_that_is_not_a_causal_lm_is_refused_naming_model(bad, no_steps):
    for call in _both(bad):
        with pytest.raises(TypeError, match=r"^model: "):
            call()


@pytest.mark.parametrize("bad", [None, 1.5, True, "0", torch.tensor(0)])
def test_pad_token_id_must_be_an_int(model, bad, no_steps):
    for call in _both(model, pad_token_id=bad):
        with pytest.raises(TypeError, match=r"^pad_token_id: expected an int"):
            call()


def test_max_new_tokens_message_says_one_int_per_prompt(model, no_steps):
    want = r"^max_new_tokens: expected an int >= 1, or one int >= 1 per prompt \(3\), got "
    for bad in ([1, 4, 0], [1, 2], 0):
        for call in _both(model, max_new_tokens=bad):
            with pytest.raises(ValueError, match=want + re.escape(repr(bad))):
                call()


@pytest.mark.parametrize("kwargs,name", [
    (dict(draft="ngram", draft_accept=0.5), "draft_accept"),
    (dict(draft="ngram", reference=[[1, 2]] * 3), "reference"),
    (dict(draft=lambda c, n: [[] for _ in c], draft_accept=1.0), "draft_accept"),
    (dict(draft=lambda c, n: [[] for _ in c], reference=[[1, 2]] * 3), "reference"),
])
def test_noisy_draft_arguments_only_with_the_noisy_draft(model, kwargs, name, no_steps):
    with pytest.raises(ValueError, match=rf"^{name}: only with draft='noisy'"):
        speculative_generate(model, PROMPTS, max_new_tokens=2, K=3, **kwargs)
    with pytest.raises(ValueError, match=rf"^{name}: only with draft='noisy'"):
        make_draft(kwargs["draft"], draft_accept=kwargs.get("draft_accept"),
                   reference=kwargs.get("reference"), vocab_size=256)


# ---- the few cases that run steps --------------------------------------------------------------

@pytest.mark.parametrize("ret", [None, 7, object()])
def test_draft_returning_a_non_sequence_is_named(model, ret):
    with pytest.raises(ValueError, match=r"^draft: sequence 0's proposals must be a list"):
        speculative_generate(model, PROMPTS[:1], max_new_tokens=3, K=3,
                             draft=lambda c, n: [ret for _ in c], state_layout="kv")


def test_pad_token_id_fills_after_a_sequences_end(model):
    """Budgets 1, 3, 2: the shorter rows hold ``pad_token_id`` after their end, and the tokens
    before it are those of the default (-1) run; greedy and speculative agree (float64, exact
    form)."""
    budgets = [1, 3, 2]
    ref = greedy_generate(model, PROMPTS, max_new_tokens=budgets, state_layout="kv")
    out = greedy_generate(model, PROMPTS, max_new_tokens=budgets, pad_token_id=0, state_layout="kv")
    spec = speculative_generate(model, PROMPTS, max_new_tokens=budgets, draft="ngram", K=2,
                                pad_token_id=0, state_layout="kv")
    assert ref.shape == out.shape == (3, 3)
    for i, n in enumerate(budgets):
        assert (ref[i, n:] == -1).all() and (out[i, n:] == 0).all()
        assert torch.equal(out[i, :n], ref[i, :n]) and (ref[i, :n] >= 0).all()
    assert torch.equal(spec, out)
