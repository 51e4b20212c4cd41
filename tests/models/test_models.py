"""Our kernels inside real architectures (transformers' Qwen3-Next / Qwen3.5), end to end.

Small random-initialised seeded configs (``tiny_config``: hidden 64, two GDN layers and one gated
attention layer, HK=1, HV=2, kd=16, vd=8; Qwen3-Next with its MoE block), CPU, Triton
interpreter.

- One GDN layer, decode: outputs, conv windows and recurrent states against transformers' own
  layer on its torch path, from the same state, both configs and both layouts.
- ``speculative_generate`` exact form against ``greedy_generate``: the same tokens, and every GDN
  kernel input and output of every token bitwise equal (``record_gdn_io``), for several seeds,
  K = 2, 3, 4, both layouts, 6 prompts in 4 slots (sequences finish and are replaced; the
  batch falls below ``lazy_min_seqs = 3`` so lazy and eager steps alternate with flushes; a
  draft with gaps forces plain decode steps: a form switch). The snapshot chain the same way.
- Against ``model.generate(do_sample=False)`` on transformers' torch path: tokens equal wherever
  the top-2 margin exceeds twice the measured logit error (``pmll_lab.models.oracle``).

The generation tests use float64 models: PyTorch's CPU GEMM does not give a row the same bits
for different row counts (measured here: ``F.linear`` on 1 row vs 4 rows differs in the last bit
in fp32 and float64), so bitwise exactness of decode vs verify can only be asked of our kernels
(fp32, their inputs and outputs are recorded and compared) while the dense layers around them
run in float64, whose row-count differences (~1e-16) stay below an fp32 input's last bit. The
float64 models' RMSNorms are computed in float64 too (``_float64_norms``: transformers computes
them in fp32, whose vectorised SiLU is not row-count invariant on every CPU).

Tolerances: layer outputs and states rel L2 <= 1e-5 (fp32 kernel vs fp32 torch loop; measured
~1e-7).
"""

from __future__ import annotations

import functools
import types

import pytest
import torch

import pmll_lab  # noqa: F401  (first: picks GPU or the Triton interpreter)
from pmll_lab.bench import bitwise_equal, errors

transformers = pytest.importorskip("transformers", reason="the models extra needs transformers")

from transformers.activations import ACT2FN  # noqa: E402

from pmll_lab.models.cache import ServingCache, state_bytes_per_sequence  # noqa: E402
from pmll_lab.models.drafts import DraftContext, NgramDraft, NoisyDraft  # noqa: E402
from pmll_lab.models.generate import check_prompts, greedy_generate, speculative_generate  # noqa: E402
from pmll_lab.models.oracle import compare_to_hf, hf_greedy  # noqa: E402
from pmll_lab.models.qwen3_next import (  # noqa: E402
    TORCH_PATH_FUNCTIONS, build_model, gdn_layers, hf_torch_path, modeling_module, tiny_config)

TOL = 1e-5
N_PROMPTS, SLOTS, LAZY_MIN = 6, 4, 3


@functools.lru_cache(maxsize=None)
def _model(kind: str, dtype: torch.dtype, seed: int):
    model = build_model(tiny_config(kind), seed=seed, dtype=dtype)
    if dtype == torch.float64:
        _float64_norms(model)
    return model


def _float64_norms(model) -> None:
    """A float64 model's RMSNorms computed in float64: transformers' Qwen3-Next / Qwen3.5 norms
    compute in fp32 whatever the model's dtype, and PyTorch's vectorised fp32 SiLU gives an
    element other bits in a tensor of another size on some CPUs (seen with AVX-512: a gated
    norm over 1 row vs 3, 1 fp32 ulp), which the next layer's kernel inputs then carry. The
    same expressions in float64 keep the dense path's row-count differences at ~1e-16."""
    for mod in model.modules():
        name = type(mod).__name__
        if name.endswith("RMSNormGated"):
            mod.forward = types.MethodType(_gated_norm_f64, mod)
        elif name.endswith("RMSNorm"):
            mod.forward = types.MethodType(_norm_f64, mod)


def _norm_f64(self, x):
    return self._norm(x) * (1.0 + self.weight.to(x.dtype))


def _gated_norm_f64(self, hidden_states, gate):
    h = hidden_states * torch.rsqrt(hidden_states.pow(2).mean(-1, keepdim=True)
                                    + self.variance_epsilon)
    return (self.weight * h) * ACT2FN[self.activation](gate)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """One intra-op thread: these models' matrices are tiny, and on a shared 2-core machine
    waking a second thread costs milliseconds per op (measured 7x slower generation)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _workload(seed: int, n: int = N_PROMPTS):
    """Prompts of 3..10 tokens and budgets of 2..7 new tokens, one of 12 (so that the batch
    thins out below ``LAZY_MIN`` while one sequence still runs), seeded."""
    g = torch.Generator().manual_seed(1000 + seed)
    lens = torch.randint(3, 11, (n,), generator=g).tolist()
    prompts = [torch.randint(0, 256, (L,), generator=g) for L in lens]
    budgets = torch.randint(2, 8, (n,), generator=g).tolist()
    budgets[seed % n] = 12
    return prompts, budgets


@functools.lru_cache(maxsize=None)
def _greedy(seed: int, layout: str, kind: str = "qwen3_next"):
    prompts, budgets = _workload(seed)
    return greedy_generate(_model(kind, torch.float64, seed), prompts, max_new_tokens=budgets,
                           batch_size=SLOTS, state_layout=layout, output_logits=True,
                           record_gdn_io=True, timing=True, return_stats=True)


class GappyNoisy:
    """The noisy draft (p = 0.6) that proposes nothing for anyone on every third call: those
    steps are plain decodes, after carried verifies (a form switch, flushes)."""

    def __init__(self, reference):
        self.inner = NoisyDraft(reference, 0.6, 256, seed=7)
        self.calls = 0

    def __call__(self, contexts, n):
        self.calls += 1
        if self.calls % 3 == 0:
            return [[] for _ in contexts]
        return self.inner(contexts, n)


@functools.lru_cache(maxsize=None)
def _spec(seed: int, K: int, layout: str, form: str):
    prompts, budgets = _workload(seed)
    ref, _ = _greedy(seed, layout)
    return speculative_generate(_model("qwen3_next", torch.float64, seed), prompts,
                                max_new_tokens=budgets, draft=GappyNoisy(ref), K=K, form=form,
                                state_layout=layout, batch_size=SLOTS, lazy_min_seqs=LAZY_MIN,
                                output_logits=True, record_gdn_io=True, timing=True,
                                return_stats=True)


# ---- one layer against transformers' --------------------------------------------------------

@pytest.mark.parametrize("kind", ["qwen3_next", "qwen3_5"])
@pytest.mark.parametrize("layout", ["kv", "vk"])
def test_gdn_layer_decode_matches_transformers(kind, layout):
    from transformers import DynamicCache

    model = _model(kind, torch.float32, 3)
    gi = 1
    module = gdn_layers(model)[gi]
    H = model.config.hidden_size
    g = torch.Generator().manual_seed(5)
    prompt = torch.randn(3, 6, H, generator=g)
    steps = [torch.randn(3, 1, H, generator=g) for _ in range(3)]
    dc = DynamicCache(config=model.config)
    layer_cache = dc.layers[module.layer_idx]
    with torch.no_grad(), hf_torch_path(model):
        module(prompt, cache=dc)
    cache = ServingCache(model, slots=5, max_len=8, state_layout=layout)
    slots = [4, 0, 2]
    cache.load_state(gi, slots, layer_cache.conv_states[0], layer_cache.recurrent_states[0])
    for t, h in enumerate(steps):
        with torch.no_grad(), hf_torch_path(model):
            want = module(h, cache=dc)
        got = cache.layer_decode(module, h, slots)
        e = errors(got, want)
        assert e["rel_l2"] <= TOL, f"step {t}: layer output rel_l2 {e['rel_l2']:.2e}"
        for b, s in enumerate(slots):
            conv, state = cache.states(s, gi)
            assert bitwise_equal(conv, layer_cache.conv_states[0][b]), \
                f"step {t}, sequence {b}: conv window differs from transformers'"
            e = errors(state, layer_cache.recurrent_states[0][b])
            assert e["rel_l2"] <= TOL, f"step {t}, sequence {b}: state rel_l2 {e['rel_l2']:.2e}"
    # slots outside the batch were never touched
    conv1, st1 = cache.states(1, gi)
    assert not conv1.any() and not st1.any()


def test_hf_torch_path_selects_and_restores():
    model = _model("qwen3_next", torch.float32, 3)
    mod = modeling_module(gdn_layers(model)[0])
    before = {n: getattr(mod, n) for n in TORCH_PATH_FUNCTIONS}
    with hf_torch_path(model):
        for n in TORCH_PATH_FUNCTIONS:
            assert getattr(mod, n) is getattr(before[n], "__wrapped__", before[n])
    assert {n: getattr(mod, n) for n in TORCH_PATH_FUNCTIONS} == before


# ---- speculative decoding against greedy decoding ---------------------------------------------

def _assert_gdn_io_bitwise(spec_io, greedy_io, what):
    common = spec_io.keys() & greedy_io.keys()
    assert len(common) == len(greedy_io), f"{what}: {len(greedy_io) - len(common)} rows missing"
    bad_x = [k for k in common if not bitwise_equal(spec_io[k][0], greedy_io[k][0])]
    assert not bad_x, f"{what}: kernel inputs differ at {len(bad_x)} of {len(common)} rows"
    bad_o = [k for k in common if not bitwise_equal(spec_io[k][1], greedy_io[k][1])]
    assert not bad_o, f"{what}: kernel outputs differ at {len(bad_o)} of {len(common)} rows " \
                      f"(e.g. {bad_o[:3]})"


def _assert_protocol_exercised(stats, tokens, what):
    st = stats.frame()
    ver = st[st.kind == "verify"]
    assert ver.lazy.eq(True).any() and ver.lazy.eq(False).any(), \
        f"{what}: the batch never crossed lazy_min_seqs (lazy {ver.lazy.tolist()})"
    assert (st.kind == "decode").any(), f"{what}: no plain decode step (form switch)"
    assert st.flushes.sum() > 0, f"{what}: no flush"
    assert len(stats.prefills) == N_PROMPTS
    # every generated token is the prefill's first one or was emitted by a step
    assert stats.summary()["tokens"] + N_PROMPTS == int((tokens >= 0).sum())
    # the kernel sections were timed where they ran
    assert (ver.conv_verify_ms > 0).all() and (ver.gdn_verify_ms > 0).all() \
        and (ver.accept_ms > 0).all(), f"{what}: verify sections missing"
    fl = st[st.flushes > 0]
    assert (fl.gdn_flush_ms > 0).all() and (fl.conv_flush_ms > 0).all()
    dec = st[st.kind == "decode"]
    assert (dec.gdn_decode_ms > 0).all() and (dec.conv_update_ms > 0).all()


@pytest.mark.parametrize("seed,K,layout", [(0, 2, "kv"), (1, 3, "vk"), (2, 4, "kv")])
def test_speculative_exact_equals_greedy(seed, K, layout):
    ref, gst = _greedy(seed, layout)
    out, st = _spec(seed, K, layout, "exact")
    assert torch.equal(out, ref), f"tokens differ:\n{out}\n{ref}"
    _assert_gdn_io_bitwise(st.gdn_io, gst.gdn_io, f"seed {seed}, K={K}, {layout}")
    _assert_protocol_exercised(st, out, f"seed {seed}, K={K}, {layout}")
    assert max(st.accept_lengths) <= K and min(st.accept_lengths) >= 1


def test_snapshot_chain_equals_greedy():
    ref, gst = _greedy(1, "vk")
    out, st = _spec(1, 4, "vk", "chain")
    assert torch.equal(out, ref)
    _assert_gdn_io_bitwise(st.gdn_io, gst.gdn_io, "chain")
    assert st.frame().restored.sum() > 0, "no snapshot was ever copied back"


# ---- against transformers' generate -----------------------------------------------------------

@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tokens_match_transformers_generate(seed):
    layout = ("kv", "vk", "kv")[seed]
    prompts, budgets = _workload(seed)
    ref, gst = _greedy(seed, layout)
    hf_t, hf_l = hf_greedy(_model("qwen3_next", torch.float64, seed), prompts, budgets)
    out, st = _spec(seed, (2, 3, 4)[seed], layout, "exact")
    for name, (toks, logits) in {"greedy": (ref, gst.logits),
                                 "speculative exact": (out, st.logits)}.items():
        cmp = compare_to_hf(toks, logits, hf_t, hf_l)
        print(f"seed {seed} {name}: {cmp['agreeing']}/{cmp['compared']} tokens agree, "
              f"eps {cmp['eps']:.2e}, divergences {cmp['divergences']}, "
              f"not compared {cmp['not_compared']}")
        assert cmp["unexplained"] == 0, cmp
        assert cmp["compared"] > 0 and cmp["eps"] < 1e-5


def test_forms_match_transformers_generate():
    for seed, K, layout, form in [(1, 4, "vk", "chain"), (0, 3, "kv", "chain")]:
        prompts, budgets = _workload(seed)
        hf_t, hf_l = hf_greedy(_model("qwen3_next", torch.float64, seed), prompts, budgets)
        out, st = _spec(seed, K, layout, form)
        cmp = compare_to_hf(out, st.logits, hf_t, hf_l)
        print(f"{form}: {cmp['agreeing']}/{cmp['compared']} agree, eps {cmp['eps']:.2e}, "
              f"divergences {cmp['divergences']}")
        assert cmp["unexplained"] == 0, cmp


def test_qwen3_5_greedy_matches_transformers_generate():
    prompts, budgets = _workload(4, n=3)
    budgets = [min(b, 5) for b in budgets]
    model = _model("qwen3_5", torch.float64, 4)
    toks, st = greedy_generate(model, prompts, max_new_tokens=budgets, state_layout="vk",
                               output_logits=True, return_stats=True)
    hf_t, hf_l = hf_greedy(model, prompts, budgets)
    cmp = compare_to_hf(toks, st.logits, hf_t, hf_l)
    assert cmp["unexplained"] == 0, cmp
    assert cmp["compared"] == sum(budgets) or cmp["divergences"], cmp
    # an end-of-sequence token ends a sequence there; the rest is padding
    eos = int(toks[0, 1])
    cut = greedy_generate(model, prompts, max_new_tokens=budgets, state_layout="kv",
                          eos_token_id=eos, pad_token_id=-7)
    for row, full in zip(cut.tolist(), toks.tolist()):
        full = [t for t in full if t >= 0]
        n = full.index(eos) + 1 if eos in full else len(full)
        assert row[:n] == full[:n] and all(t == -7 for t in row[n:]), (row, full)


# ---- conventions, drafts, sizes, bad input ----------------------------------------------------

def test_prompt_conventions():
    rows = torch.tensor([[0, 0, 5, 6, 7], [8, 9, 0, 0, 0]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 0, 0, 0]])
    got = check_prompts(rows, mask)
    assert [p.tolist() for p in got] == [[5, 6, 7], [8, 9]]
    assert [p.tolist() for p in check_prompts([[1, 2], torch.tensor([3])], None)] == [[1, 2], [3]]
    with pytest.raises(ValueError, match="attention_mask"):
        check_prompts(rows, torch.tensor([[1, 0, 1, 1, 1], [1, 1, 0, 0, 0]]))


def test_drafts():
    ng = NgramDraft(max_ngram=2)
    #           a  b  c  d  a  b  -> suffix "a b" occurred at 0, followed by c d a
    assert ng.propose([1, 2, 3, 4, 1, 2], 3) == [3, 4, 1]
    assert ng.propose([1, 2, 3], 2) == []
    ref = [[10, 11, 12, 13]]
    ctx = [DraftContext(0, [1, 2], [10])]
    assert NoisyDraft(ref, 1.0, 256)(ctx, 3) == [[11, 12, 13]]
    wrong = NoisyDraft(ref, 0.0, 256, seed=1)(ctx, 3)[0]
    assert len(wrong) == 3 and all(w != r for w, r in zip(wrong, [11, 12, 13]))


def test_perfect_draft_is_always_accepted():
    """A draft that proposes exactly the target's greedy tokens is accepted in full: every
    verify accepts K rows (the acceptance rule and the draft's alignment)."""
    model = _model("qwen3_next", torch.float64, 0)
    prompts, budgets = _workload(0)
    ref, _ = _greedy(0, "kv")
    assert budgets[0] == 12                      # prompt 0 has the long budget
    out, st = speculative_generate(model, prompts[:1], max_new_tokens=10, draft="noisy",
                                   draft_accept=1.0, reference=ref[:1], K=3, return_stats=True,
                                   state_layout="kv")
    assert st.accept_lengths and all(a == 3 for a in st.accept_lengths), st.accept_lengths
    assert torch.equal(out, ref[:1, :10])


def test_state_bytes_per_sequence():
    model = _model("qwen3_next", torch.float32, 3)
    got = state_bytes_per_sequence(model, rows=4, cap=8)
    L, HV, kd, vd, dim = 2, 2, 16, 8, 2 * 16 + 2 * 8
    assert got["gdn_state"] == L * HV * kd * vd * 4
    assert got["conv_window"] == L * dim * 4 * 4
    assert got["carry_stash"] == L * (8 * (HV * vd + HV + HV * kd) * 4 + 8 * dim * 4)
    assert got["snapshots"] == L * 3 * (HV * kd * vd * 4 + dim * 4 * 4)
    assert got["kv_per_token"] == 1 * 2 * 1 * 16 * 4
    # from a config alone (no weights): the same, and Qwen3-Next-80B's 36 GDN layers in bf16
    assert state_bytes_per_sequence(model.config, rows=4, dtype=torch.float32) == got
    big = state_bytes_per_sequence(transformers.Qwen3NextConfig(), rows=4)
    assert big["gdn_state"] == 36 * 32 * 128 * 128 * 4
    assert big["carry_stash"] == 36 * (8 * (32 * 128 + 32 + 32 * 128) * 4 + 8 * 8192 * 2)


@pytest.mark.parametrize("kwargs,name", [
    (dict(K=1), "K"), (dict(K=9), "K"), (dict(form="bogus"), "form"),
    (dict(draft="bogus"), "draft"), (dict(draft="noisy"), "draft_accept"),
    (dict(max_new_tokens=0), "max_new_tokens"), (dict(lazy=1), "lazy"),
    (dict(batch_size=0), "batch_size"), (dict(state_layout="kk"), "state_layout"),
])
def test_bad_input(kwargs, name):
    model = _model("qwen3_next", torch.float32, 3)
    args = dict(max_new_tokens=2, draft="ngram", K=2)
    args.update(kwargs)
    with pytest.raises(ValueError, match=name):
        speculative_generate(model, [[1, 2, 3]], **args)


def test_prompts_outside_the_vocabulary_and_short_references_are_refused():
    model = _model("qwen3_next", torch.float32, 3)
    vocab = model.get_output_embeddings().weight.shape[0]
    for bad in ([[1, vocab]], [[-1, 2]]):
        with pytest.raises(ValueError, match=r"^input_ids: prompt 0 has token ids"):
            greedy_generate(model, bad, max_new_tokens=1, state_layout="kv")
        with pytest.raises(ValueError, match=r"^input_ids: prompt 0 has token ids"):
            speculative_generate(model, bad, max_new_tokens=1, draft="ngram", K=2,
                                 state_layout="kv")
    with pytest.raises(ValueError, match=r"^reference: 1 continuation\(s\) for 2 prompts"):
        speculative_generate(model, [[1, 2], [3, 4]], max_new_tokens=2, draft="noisy",
                             draft_accept=1.0, reference=[[5, 6]], K=2, state_layout="kv")


def test_throughput_table_pairs_each_run_with_its_own_plain_run():
    """``spec_decode_report.throughput_table`` divides a speculative run by the plain run of its own
    process when the row carries one (``plain_tokens_per_s``), else by the plain row of the same
    (B, layout); rows of other K, p or drafts are left out; CPU runs get no ratio."""
    import pandas as pd

    from pmll_lab.experiments import spec_decode_report as E

    nan = float("nan")
    base = dict(B=8, state_layout="kv", mean_accept=2.9, step_ms=20.0, agreement_with_greedy=1.0,
                timer="cuda_events")
    w = pd.DataFrame([
        dict(base, mode="plain", kernel="plain", draft=None, K=nan, p=nan, tokens_per_s=100.0,
             plain_tokens_per_s=nan),
        dict(base, mode="spec", kernel="exact_lazy", draft="noisy", K=4, p=0.8,
             tokens_per_s=250.0, plain_tokens_per_s=125.0),
        dict(base, mode="spec", kernel="chain", draft="noisy", K=4, p=0.8, tokens_per_s=240.0,
             plain_tokens_per_s=nan),
        dict(base, mode="spec", kernel="exact_lazy", draft="noisy", K=2, p=0.8,
             tokens_per_s=999.0, plain_tokens_per_s=1.0),
    ])
    t = E.throughput_table(w, 4, 0.8).set_index("kernel")
    assert sorted(t.index) == ["chain", "exact_lazy", "plain"]
    assert t.loc["exact_lazy", "speedup_vs_plain"] == pytest.approx(2.0)
    assert t.loc["exact_lazy", "plain_tokens_per_s"] == pytest.approx(125.0)
    assert t.loc["chain", "speedup_vs_plain"] == pytest.approx(2.4)
    assert t.loc["plain", "speedup_vs_plain"] == pytest.approx(1.0)
    cpu = E.throughput_table(w.assign(timer="interpreter-wall"), 4, 0.8)   # no ratios there
    assert "speedup_vs_plain" not in cpu and (cpu["tokens_per_s"] > 0).all()
