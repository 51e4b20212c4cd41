"""The token study at tiny size on the CPU: the trained model, its drafts, every form's tokens.

- Training (``pmll_lab.models.tiny_gdn``): a few steps from a seed lower the loss and repeat bit
  for bit; a saved checkpoint loads to the same logits.
- The committed CPU checkpoint: its recorded held-out loss well below the byte-unigram baseline,
  re-measured here on held-out text; greedy generation is deterministic.
- The study through the sweep (``pmll_lab.experiments.tokens``): the exact forms (lazy with
  both pools, eager with every draft rejected, the chain) give plain decoding's tokens on every
  prompt; the ring form runs; FlashInfer's ReplaySSM is an unsupported row here; the rows follow
  the results schema.
- Drafts: prompt lookup proposes the continuation of a recurring suffix, and the acceptance the
  study counts is the one a replay of the drafts against the greedy tokens gives, step by step.
"""

from __future__ import annotations

import math

import pytest
import torch

import pmll_lab  # noqa: F401  (first: picks GPU or the Triton interpreter)

pytest.importorskip("transformers", reason="the models extra needs transformers")

from pmll_lab.experiments import tokens as E  # noqa: E402
from pmll_lab.experiments import tokens_report as R  # noqa: E402
from pmll_lab.models import stdlib_corpus as C  # noqa: E402
from pmll_lab.models import tiny_gdn as T  # noqa: E402
from pmll_lab.models.drafts import NgramDraft  # noqa: E402
from pmll_lab.models.generate import greedy_generate, speculative_generate  # noqa: E402
from pmll_lab.sweep import run_sweep  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """One intra-op thread: tiny matrices on a shared 2-core machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def corpus():
    return C.load_corpus()


# ---- the model ---------------------------------------------------------------------------------

def test_training_lowers_the_loss_and_repeats_from_its_seed(corpus, tmp_path):
    kw = dict(steps=6, batch=4, seq_len=32, warmup=1, eval_len=32, eval_tokens=512,
              corpus=corpus)
    model, prov = T.train("cpu", seed=3, **kw)
    _, again = T.train("cpu", seed=3, **kw)
    losses = [row[1] for row in prov["log"]]
    assert losses == [row[1] for row in again["log"]], "same seed, other losses"
    assert losses[0] > math.log(C.VOCAB_SIZE) - 0.3          # starts near uniform
    assert losses[-1] < losses[0] - 0.5, losses
    assert prov["heldout_tokens_scored"] == 15 * 32 and math.isfinite(prov["heldout_loss_nats"])
    assert prov["corpus"]["python_version"] and len(prov["corpus"]["file_list_sha256"]) == 64
    with pytest.raises(ValueError, match="^stepz: not a training setting"):
        T.train("cpu", stepz=1, corpus=corpus)
    out = T.save(model, prov, tmp_path / "ckpt")
    loaded = T.load_model(out, dtype=torch.float32)
    x = torch.as_tensor(corpus.heldout[:48])[None]
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=x).logits, model(input_ids=x).logits), \
            "the stored bf16 weights are not the weights the held-out loss was measured with"


def test_training_falls_back_to_the_torch_path_when_the_kernel_refuses(corpus, monkeypatch):
    """A GDN kernel that refuses (as FLA's gated chunked backward does on Hopper with Triton
    < 3.7.1) hands the step to transformers' PyTorch path: same losses as that path from the same
    seed, and the refusal quoted in the provenance."""
    from pmll_lab.models.qwen3_next import gdn_layers, modeling_module

    kw = dict(steps=3, batch=2, seq_len=16, warmup=1, eval_len=16, eval_tokens=64, corpus=corpus)
    _, plain = T.train("cpu", seed=5, **kw)
    assert plain["gdn_fallback"] is None
    mod = modeling_module(gdn_layers(T.build("cpu", 0, torch.device("cpu")))[0])
    torch_fn = mod.torch_chunk_gated_delta_rule

    def refusing(*args, **kwargs):
        raise RuntimeError("Triton >= 3.4.0 and < 3.7.1 on Hopper GPUs produces incorrect results "
                           "for gated chunk_bwd_dqkwg")
    refusing.__wrapped__ = torch_fn
    monkeypatch.setattr(mod, "torch_chunk_gated_delta_rule", refusing)
    _, prov = T.train("cpu", seed=5, **kw)
    assert prov["gdn_fallback"].startswith("Triton >= 3.4.0")
    assert [r[1] for r in prov["log"]] == [r[1] for r in plain["log"]]
    assert prov["heldout_loss_nats"] == plain["heldout_loss_nats"]
    assert mod.torch_chunk_gated_delta_rule is refusing      # restored after training
    monkeypatch.setattr(mod, "torch_chunk_gated_delta_rule",
                        lambda *a, **k: (_ for _ in ()).throw(RuntimeError("shape mismatch")))
    with pytest.raises(RuntimeError, match="shape mismatch"):   # other errors are not swallowed
        T.train("cpu", seed=5, **kw)
    monkeypatch.setattr(mod, "torch_chunk_gated_delta_rule", lambda *a, **k: (_ for _ in ()).throw(
        RuntimeError("Triton Error [CUDA]: an illegal memory access was encountered")))
    with pytest.raises(RuntimeError, match="illegal memory access"):   # nor Triton's own
        T.train("cpu", seed=5, **kw)


def test_committed_checkpoint_beats_the_byte_unigram_baseline(corpus):
    prov = T.load_provenance("cpu")
    assert prov["heldout_loss_nats"] < 0.6 * prov["unigram_nats"], prov["heldout_loss_nats"]
    assert prov["bytes"] < 1_000_000 and prov["size"] == "cpu" and prov["seed"] == 0
    assert len(prov["log"]) == prov["training"]["steps"]
    model = T.load_model("cpu", dtype=torch.float32)
    toks = corpus.heldout[:1025]
    loss, n = T.heldout_loss(model, toks, window=128)
    base = C.unigram_entropy(toks[1:n + 1])
    print(f"held-out loss here {loss:.3f} nats, byte-unigram {base:.3f} nats over {n} tokens")
    assert loss < base - 1.0


def test_checkpoint_generates_deterministically():
    model = E.model_for("cpu", "float64")
    prompts = [list(q) for q in E.prompts_for(2, 32, 5)]
    a = greedy_generate(model, prompts, max_new_tokens=5, state_layout="vk")
    b = greedy_generate(model, prompts, max_new_tokens=5, state_layout="vk")
    assert torch.equal(a, b) and (a >= 0).all() and (a < C.VOCAB_SIZE).all()


def test_heldout_split_is_by_path_and_prompts_come_from_it(corpus):
    names = [f for f, _, _ in corpus.heldout_files]
    assert names and all(C.is_heldout(f) for f in names)
    assert corpus.manifest["heldout_files"] == len(names)
    prompts = C.heldout_prompts(corpus, 3, 24, seed=1)
    assert [len(p) for p in prompts] == [24] * 3
    text = C.decode(corpus.heldout)
    assert all(C.decode(p) in text for p in prompts)


# ---- drafts and acceptance ---------------------------------------------------------------------

def _replay(prompt, greedy, K, n):
    """Per step ``(rows, a)`` of one sequence decoded alone to ``n`` tokens, from the
    prompt-lookup drafts against the greedy tokens (``greedy``: ``n + K`` of them, so the last
    step's acceptance is known): what ``speculative_generate`` must do with an exact form."""
    draft, out, steps = NgramDraft(), [greedy[0]], []
    while len(out) < n:
        prop = draft.propose(list(prompt) + out, K - 1)
        if not prop:
            steps.append((1, 1))
            out.append(greedy[len(out)])
            continue
        rows = prop + [out[-1]] * (K - 1 - len(prop))
        a = 1
        while a < K and rows[a - 1] == greedy[len(out) + a - 1]:
            a += 1
        steps.append((K, a))
        out += greedy[len(out):len(out) + a]
    return steps


def test_drafts_are_prompt_lookup_and_acceptance_is_counted_from_them():
    assert NgramDraft().propose([5, 6, 7, 9, 5, 6], 3) == [7, 9, 5]
    assert NgramDraft().propose([1, 2, 3], 2) == []
    model = E.model_for("cpu", "float64")
    prompt = list(b"    def f(self):\n        return self.a\n" * 3 + b"    def f(self):\n")
    K, n = 3, 10
    ref = greedy_generate(model, [prompt], max_new_tokens=n + K, state_layout="vk")
    toks, st = speculative_generate(model, [prompt], max_new_tokens=n, draft="ngram", K=K,
                                    form="exact", state_layout="vk", return_stats=True)
    assert torch.equal(toks, ref[:, :n])
    got = [(rows, a) for _, rows, _, a, _ in st.seq_steps]
    assert got == _replay(prompt, ref[0].tolist(), K, n)
    assert any(a > 1 for _, a in got), "no draft was ever accepted on a repeating prompt"
    verify = [(rows, a) for rows, a in got if rows > 1]
    rate = sum(a - 1 for _, a in verify) / sum(rows - 1 for rows, _ in verify)
    pp = E.per_prompt(st, 1)[0]
    assert pp["accept_rate"] == rate
    assert pp["tokens_per_step"] == (n - 1) / len(got)


def test_first_divergence():
    assert E.first_divergence([1, 2, 3], [1, 2, 3]) == -1
    assert E.first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert E.first_divergence([1, 2, -1], [1, 2, 3]) == 2      # one ended early
    assert E.first_divergence([7], [8]) == 0


# ---- the study ---------------------------------------------------------------------------------

_BASE = {"model": ["cpu"], "dtype": ["float64"], "B": [2], "prompt_len": [40], "tokens": [8],
         "state_layout": ["vk"]}
_SPEC = {"K": [3], "drafter": ["ngram"]}
GRIDS = [
    {**_BASE, "form": ["plain"], "state_dtype": ["float32", "bfloat16"]},
    {**_BASE, **_SPEC, "form": ["exact_lazy"], "state_dtype": ["float32", "bfloat16"],
     "forced_reject": [False]},
    {**_BASE, **_SPEC, "form": ["exact_eager"], "state_dtype": ["bfloat16"],
     "forced_reject": [True]},
    {**_BASE, **_SPEC, "form": ["chain_restore"], "state_dtype": ["float32"],
     "forced_reject": [False]},
    {**_BASE, **_SPEC, "form": ["ring"], "state_dtype": ["bfloat16"], "forced_reject": [True]},
    {**_BASE, "K": [4], "drafter": ["ngram"], "form": ["flashinfer_replayssm"],
     "state_dtype": ["bfloat16"], "forced_reject": [False]},
]


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    pts = E.points(GRIDS, seed=0)
    return run_sweep("tokens", pts, E.token_point, progress=False,
                     results_dir=tmp_path_factory.mktemp("tokens"))


def test_exact_forms_give_plain_decodings_tokens_with_both_pools(study):
    w = R.prompt_rows(study)
    exact = w[w["form"].isin(E.EXACT_FORMS)]
    assert set(zip(exact.form, exact.state_dtype, exact.forced_reject)) == {
        ("exact_lazy", "float32", False), ("exact_lazy", "bfloat16", False),
        ("exact_eager", "bfloat16", True), ("chain_restore", "float32", False)}
    assert (exact["first_divergent_token"] == -1).all(), exact
    assert len(exact) == 4 * 2
    runs, equal, prompts = R.exactness(study)
    assert (runs, equal, prompts) == (4, 4, 8)
    forced = w[w["forced_reject"]]
    assert (forced["accept_rate"] == 0).all() and (forced["tokens_per_step"] == 1).all()
    checks = study[study["metric"] == "first_divergent_token"]
    assert checks.loc[checks["form"].isin(E.EXACT_FORMS), "passed"].astype(bool).all()


def test_rows_follow_the_schema(study):
    ok = study[study["status"] == "ok"]
    assert set(ok["metric"]) == {*E.METRICS, "tokens_per_s"}
    for col in ("form", "state_dtype", "prompt", "tokens", "K", "drafter", "forced_reject",
                "device", "commit", "point_id"):
        assert col in study, col
    spec = ok[(ok["form"] != "plain") & (ok["prompt"] >= 0)]
    assert spec[["K", "drafter", "forced_reject"]].notna().all().all()
    per = spec.groupby(["form", "state_dtype", "forced_reject", "metric"]).size()
    assert (per == 2).all(), per                           # one row per prompt
    fd = ok[ok["metric"].str.startswith("first_divergent")]["value"]
    assert ((fd == -1) | ((fd >= 0) & (fd < 8))).all() and (fd == fd.round()).all()
    assert set(ok[ok["metric"] == "tokens_per_s"]["prompt"]) == {-1}
    un = study[study["status"] == "unsupported"]
    assert list(un["form"]) == ["flashinfer_replayssm"] and "FlashInfer" in un["error"].iloc[0]
    table = R.summary(study)
    assert len(table) == 7 and (table["prompts"] == 2).all()
    assert (table.loc[table["form"].isin(E.EXACT_FORMS), "never_same"] == 1.0).all()


def test_bad_grids_and_forms_are_refused():
    g = {**_BASE, **_SPEC, "form": ["ring"], "state_dtype": ["bfloat16"], "forced_reject": [False]}
    with pytest.raises(ValueError, match="^grids: axis form: 'rng' is not one of"):
        E.points([{**g, "form": ["rng"]}])
    with pytest.raises(ValueError, match="^grids: axis model: 'tiny' is neither"):
        E.points([{**g, "model": ["tiny"]}])
    with pytest.raises(ValueError, match="^grids: axis forced_reject"):
        E.points([{**g, "forced_reject": ["yes"]}])
    with pytest.raises(ValueError, match="^grids: speculative forms need the axes K"):
        E.points([{k: v for k, v in g.items() if k != "K"}])
    model = E.model_for("cpu", "float64")
    from pmll_lab.models.cache import ServingCache

    with pytest.raises(ValueError, match="^state_layout: the ring form runs on V-major"):
        ServingCache(model, slots=1, max_len=8, form="ring", state_layout="kv")
    with pytest.raises(ValueError, match="^state_dtype"):
        ServingCache(model, slots=1, max_len=8, state_dtype=torch.float64)
    with pytest.raises(ValueError, match="^form: 'replayssm' unsupported"):
        ServingCache(model, slots=1, max_len=8, form="replayssm", state_layout="vk",
                     state_dtype=torch.bfloat16)


def test_summary_censors_prompts_that_never_diverged():
    """Quantiles are the sample's own values with "never" (-1 in the rows) above every index."""
    import pandas as pd

    rows = []
    for prompt, (same, fp32) in enumerate([(-1, 3), (5, 5), (10, 2), (-1, -1)]):
        for metric, value in (("first_divergent_token", same), ("first_divergent_token_fp32", fp32),
                              ("accept_rate", 0.5), ("tokens_per_step", 1.5)):
            rows.append(dict(form="ring", state_dtype="bfloat16", K=4, drafter="ngram",
                             forced_reject=False, prompt=prompt, tokens=16, metric=metric,
                             value=float(value), status="ok"))
    t = R.summary(pd.DataFrame(rows)).iloc[0]
    assert (t["never_same"], t["q25_same"], t["q50_same"], t["q75_same"]) == \
        (0.5, 5.0, 10.0, math.inf)
    assert (t["never_fp32"], t["q10_fp32"], t["q50_fp32"]) == (0.25, 2.0, 3.0)
    shown = R.shown(R.summary(pd.DataFrame(rows))).iloc[0]
    assert shown["q75 (same pool)"] == "never" and shown["q50 (same pool)"] == "10"
    n, frac = R.survival(R.prompt_rows(pd.DataFrame(rows)), "first_divergent_token", 16)
    assert list(frac[[0, 5, 6, 11, 16]]) == [1.0, 1.0, 0.75, 0.5, 0.5]
