"""A small trained Qwen3-Next-style model: Gated DeltaNet layers (with their conv) and gated
attention, trained from a seed on the Python standard library's sources, bytes as tokens.

Why: "speculative == greedy" on random weights says little (their logits have no meaningful
margins); a trained model's tokens are the ones a user sees. The architecture is transformers'
``Qwen3NextForCausalLM`` (dense MLP, ``num_experts=0``), the sizes ``SIZES``; the data, split
and tokenizer are ``pmll_lab.models.stdlib_corpus``'s; the training ``TRAINING``.

- ``train(size, seed=...)``: AdamW, linear warm-up then cosine decay, gradient clipping, random
  windows of the training stream; transformers picks the GDN kernel (FLA's
  ``chunk_gated_delta_rule`` on a GPU where fla-core is installed, its torch chunk path
  otherwise; ``provenance["gdn_kernel"]`` records which was bound, and on a GPU
  ``gdn_kernels_seen`` the chunk kernels a profiled step launched). The weights are stored in
  bf16 (``model.safetensors``) and the held-out loss is that of the stored weights.
- ``save`` / ``load_model``: the checkpoint directory holds ``model.safetensors`` and
  ``provenance.json`` (config, training settings and per-step loss, held-out loss, byte-unigram
  baseline, corpus manifest, versions, device, wall time).
- ``float64_norms``: a float64 model's RMSNorms computed in float64 (transformers computes them
  in fp32), so that the dense path gives a row the same bits, to an fp32 kernel input's last
  bit, in a batch of ``B*K`` rows as of ``B`` (``docs/models.md``, "Exactness").
"""

from __future__ import annotations

import contextlib
import inspect
import json
import math
import platform
import time
import types
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from pmll_lab.backend import environment
from pmll_lab.models import stdlib_corpus as C

CHECKPOINTS = Path(__file__).resolve().parent / "checkpoints"
"""Where the committed checkpoints live: ``<CHECKPOINTS>/tiny_gdn_<size>/``."""

_L, _F = "linear_attention", "full_attention"
_COMMON = dict(vocab_size=C.VOCAB_SIZE, linear_conv_kernel_dim=4, num_experts=0,
               max_position_embeddings=8192, attn_implementation="eager", bos_token_id=C.BOS,
               eos_token_id=None, pad_token_id=None)
SIZES = {
    # CPU sibling: trains in minutes on two cores; one value head per GDN layer, since the
    # Triton interpreter runs a kernel's programs one after another (B * HV of them). kd != vd
    # (a transposed state cannot pass unnoticed), both multiples of 16 (the ring form's tl.dot
    # tiles).
    "cpu": dict(hidden_size=64, intermediate_size=192, layer_types=[_L, _L, _F],
                num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                linear_num_key_heads=1, linear_num_value_heads=1, linear_key_head_dim=32,
                linear_value_head_dim=16),
    # GPU model: Qwen3-Next's GDN head size (kd = vd = 128, also FlashInfer ReplaySSM's) and its
    # 3:1 GDN:attention pattern, at most ~8 MB of bf16 weights.
    "gpu": dict(hidden_size=256, intermediate_size=288, layer_types=[_L, _L, _L, _F] * 2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=128,
                linear_value_head_dim=128),
}
"""Config fields per size (on top of ``_COMMON``)."""

TRAINING = {
    "cpu": dict(steps=800, batch=16, seq_len=128, lr=3e-3, warmup=60, weight_decay=0.1,
                clip=1.0, eval_len=128, eval_tokens=65536, threads=1),
    # windows of 2048 tokens: the tokens notebook generates 2048 tokens after a 256-byte prompt
    "gpu": dict(steps=2000, batch=16, seq_len=2048, lr=2e-3, warmup=100, weight_decay=0.1,
                clip=1.0, eval_len=2048, eval_tokens=None, threads=None),
}
"""Training settings per size: ``eval_len`` the held-out windows (the training length);
``eval_tokens`` caps the held-out tokens scored (None: all); ``threads``: CPU intra-op threads
(None: PyTorch's default)."""


def config(size: str):
    """The ``Qwen3NextConfig`` of ``size`` (``"cpu"`` or ``"gpu"``); ``ValueError`` naming
    ``size`` otherwise."""
    from transformers import Qwen3NextConfig

    from pmll_lab.models.qwen3_next import with_overrides

    if size not in SIZES:
        raise ValueError(f"size: expected one of {tuple(SIZES)}, got {size!r}")
    return Qwen3NextConfig(**with_overrides(Qwen3NextConfig, _COMMON, SIZES[size]))


def checkpoint_dir(size: str) -> Path:
    """The committed checkpoint directory of ``size``."""
    if size not in SIZES:
        raise ValueError(f"size: expected one of {tuple(SIZES)}, got {size!r}")
    return CHECKPOINTS / f"tiny_gdn_{size}"


def _norm_f64(self, x):
    return self._norm(x) * (1.0 + self.weight.to(x.dtype))


def _gated_norm_f64(self, hidden_states, gate):
    from transformers.activations import ACT2FN

    h = hidden_states * torch.rsqrt(hidden_states.pow(2).mean(-1, keepdim=True)
                                    + self.variance_epsilon)
    return (self.weight * h) * ACT2FN[self.activation](gate)


def float64_norms(model) -> None:
    """Compute ``model``'s Qwen3-Next RMSNorms (plain and gated) in the input's dtype instead
    of fp32 (module docstring: why). For float64 models; idempotent."""
    for mod in model.modules():
        name = type(mod).__name__
        if name.endswith("RMSNormGated"):
            mod.forward = types.MethodType(_gated_norm_f64, mod)
        elif name.endswith("RMSNorm"):
            mod.forward = types.MethodType(_norm_f64, mod)


def _closure(fn) -> dict:
    try:
        return inspect.getclosurevars(fn).nonlocals
    except TypeError:
        return {}


def gdn_kernel(model, device) -> str:
    """The chunked delta-rule function transformers runs for ``model``'s GDN layers on
    ``device`` (``module.function``), read from its dispatch wrapper: the package's kernel
    (FLA's on CUDA) where that package imported and takes the device, else transformers' torch
    path. Wrappers of the ``kernels`` package (an ``nn.Module``) are unwrapped first."""
    from pmll_lab.models.qwen3_next import gdn_layers, modeling_module

    fn = modeling_module(gdn_layers(model)[0]).torch_chunk_gated_delta_rule
    if isinstance(fn, torch.nn.Module):                 # kernels' Func module
        fn = _closure(type(fn).forward).get("func", fn)
    env = _closure(fn)
    impl = env.get("implementation", fn)
    devs = env.get("supported_devices")
    if devs is not None and torch.device(device).type not in devs:
        impl = env.get("torch_function", getattr(fn, "__wrapped__", fn))
    impl = getattr(impl, "__wrapped__", impl) if impl is fn else impl
    return f"{getattr(impl, '__module__', '?')}.{getattr(impl, '__name__', type(impl).__name__)}"


def gdn_kernels_seen(model, device) -> list[str] | None:
    """On a GPU, the device kernels one training forward and backward of ``model`` launches
    whose names contain ``chunk`` (FLA's chunked delta rule names its Triton kernels so; the
    torch path launches ATen kernels only): a measurement of which path ran, whatever the
    transformers version's dispatch looks like. None on the CPU or where the profiler fails."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return None
    try:
        x = torch.randint(0, C.VOCAB_SIZE, (1, 128), device=dev)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            model(input_ids=x, use_cache=False).logits.float().sum().backward()
            torch.cuda.synchronize()
        model.zero_grad(set_to_none=True)
        return sorted({e.name for e in prof.events() if "chunk" in e.name.lower()})[:12]
    except Exception:  # noqa: BLE001 - a record, not a requirement
        return None


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


@torch.no_grad()
def heldout_loss(model, tokens: np.ndarray, *, window: int, max_tokens: int | None = None,
                 batch: int = 8) -> tuple[float, int]:
    """Mean next-token cross-entropy (nats) over non-overlapping ``window``-token windows of
    ``tokens`` (the first ``max_tokens``, whole windows only); returns ``(loss, tokens
    scored)``."""
    dev = next(model.parameters()).device
    n = len(tokens) if max_tokens is None else min(len(tokens), max_tokens)
    w = (n - 1) // window
    if w < 1:
        raise ValueError(f"tokens: {len(tokens)} tokens, fewer than one window of {window}")
    x = torch.as_tensor(tokens[:w * window + 1], dtype=torch.long)
    total, count = 0.0, 0
    for s in range(0, w, batch):
        idx = torch.arange(s, min(s + batch, w))[:, None] * window + torch.arange(window)
        inp, tgt = x[idx].to(dev), x[idx + 1].to(dev)
        logits = model(input_ids=inp, use_cache=False).logits.float()
        total += float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1),
                                       reduction="sum"))
        count += tgt.numel()
    return total / count, count


def _lr(step: int, steps: int, lr: float, warmup: int) -> float:
    if step < warmup:
        return lr * (step + 1) / warmup
    t = (step - warmup) / max(steps - warmup, 1)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def _versions() -> dict:
    import transformers

    out = dict(python=platform.python_version(), torch=torch.__version__,
               transformers=transformers.__version__, numpy=np.__version__)
    try:
        import fla

        out["fla"] = fla.__version__
    except Exception:  # noqa: BLE001 - optional peer
        out["fla"] = None
    return out


def build(size: str, seed: int, device=None):
    """A freshly initialised ``size`` model (fp32, train mode), seeded, on ``device``."""
    from transformers import Qwen3NextForCausalLM

    dev = torch.device(device) if device is not None else torch.device("cpu")
    with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []), dev:
        torch.manual_seed(seed)
        model = Qwen3NextForCausalLM(config(size))
    return model.float().train()


def train(size: str = "cpu", *, seed: int = 0, device=None, corpus: C.Corpus | None = None,
          log_every: int = 0, **overrides) -> tuple[object, dict]:
    """Train the ``size`` model from ``seed`` on the standard-library corpus.

    ``overrides`` replace entries of ``TRAINING[size]`` (``steps``, ``batch``, ``seq_len``,
    ``lr``, ``warmup``, ``weight_decay``, ``clip``, ``eval_len``, ``eval_tokens``, ``threads``;
    another name is a ``ValueError``). ``log_every`` > 0 prints the loss every so many steps.
    Returns ``(model, provenance)``: the model with its weights rounded to bf16 (as stored),
    fp32, eval mode; ``provenance`` as ``save`` writes it (without the file's size).
    Where the GDN kernel package refuses a step on this GPU (FLA's gated chunked backward on
    Hopper with Triton >= 3.4, < 3.7.1), that step and the rest run transformers' PyTorch path
    and ``provenance["gdn_fallback"]`` quotes the refusal (None otherwise)."""
    if size not in TRAINING:
        raise ValueError(f"size: expected one of {tuple(TRAINING)}, got {size!r}")
    unknown = set(overrides) - set(TRAINING[size])
    if unknown:
        raise ValueError(f"{sorted(unknown)[0]}: not a training setting "
                         f"({', '.join(TRAINING[size])})")
    hp = {**TRAINING[size], **overrides}
    dev = torch.device(device) if device is not None else torch.device(
        "cuda" if torch.cuda.is_available() else "cpu")
    threads = torch.get_num_threads()
    if dev.type == "cpu" and hp["threads"]:
        torch.set_num_threads(hp["threads"])
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    from pmll_lab.models.qwen3_next import hf_torch_path

    paths = contextlib.ExitStack()
    try:
        corpus = corpus if corpus is not None else C.load_corpus()
        model = build(size, seed, dev)
        seen = gdn_kernels_seen(model, dev)
        decay = [p for p in model.parameters() if p.dim() >= 2]
        rest = [p for p in model.parameters() if p.dim() < 2]
        opt = torch.optim.AdamW([dict(params=decay, weight_decay=hp["weight_decay"]),
                                 dict(params=rest, weight_decay=0.0)], lr=hp["lr"],
                                betas=(0.9, 0.95))
        rng = np.random.default_rng(seed)
        data = torch.as_tensor(corpus.train, dtype=torch.long)
        L, Bt = hp["seq_len"], hp["batch"]
        log, t0 = [], time.perf_counter()
        fallback = None
        for step in range(hp["steps"]):
            lr = _lr(step, hp["steps"], hp["lr"], hp["warmup"])
            for g in opt.param_groups:
                g["lr"] = lr
            starts = torch.as_tensor(rng.integers(0, len(data) - L - 1, Bt))
            idx = starts[:, None] + torch.arange(L + 1)
            batch = data[idx].to(dev, non_blocking=True)
            try:
                loss = _loss_and_grads(model, opt, batch)
            except RuntimeError as exc:
                if fallback is not None or not _kernel_refused(exc):
                    raise
                fallback = str(exc).strip().splitlines()[-1][:300]
                paths.enter_context(hf_torch_path(model))
                loss = _loss_and_grads(model, opt, batch)
            torch.nn.utils.clip_grad_norm_(model.parameters(), hp["clip"])
            opt.step()
            log.append([step, round(float(loss.detach()), 5), lr, round(time.perf_counter() - t0, 3)])
            if log_every and (step % log_every == 0 or step == hp["steps"] - 1):
                print(f"step {step:5d}  loss {log[-1][1]:.4f}  lr {lr:.2e}  "
                      f"{log[-1][3]:.0f} s", flush=True)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        train_s = time.perf_counter() - t0
        with torch.no_grad():               # the weights as stored: rounded to bf16
            for p in model.parameters():
                p.copy_(p.to(torch.bfloat16).to(p.dtype))
        model.eval()
        held, scored = heldout_loss(model, corpus.heldout, window=hp["eval_len"],
                                    max_tokens=hp["eval_tokens"])
        uni = C.unigram_entropy(corpus.heldout[1:scored + 1])
        prov = dict(
            size=size, seed=seed, script="scripts/train_tiny_gdn.py",
            command=f"python scripts/train_tiny_gdn.py --size {size} --seed {seed}",
            config=dict(model.config.to_dict(),
                        attn_implementation=model.config._attn_implementation), training=hp, params=n_params(model),
            weights_dtype="bfloat16", heldout_loss_nats=held,
            heldout_bits_per_byte=C.nats_to_bits(held), unigram_nats=uni,
            unigram_bits_per_byte=C.nats_to_bits(uni), heldout_tokens_scored=scored,
            train_seconds=round(train_s, 1), device=_device_name(dev),
            gdn_kernel=gdn_kernel(model, dev), gdn_kernels_seen=seen, gdn_fallback=fallback,
            versions=_versions(),
            commit=environment()["commit"], corpus=corpus.manifest,
            log_columns=["step", "loss", "lr", "seconds"], log=log)
        return model, prov
    finally:
        paths.close()
        torch.set_num_threads(threads)


def _loss_and_grads(model, opt, batch: torch.Tensor) -> torch.Tensor:
    """One training step's next-token cross-entropy on ``batch [Bt, L + 1]`` and its gradients
    (the optimiser's earlier ones cleared)."""
    logits = model(input_ids=batch[:, :-1], use_cache=False).logits.float()
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    return loss


def _kernel_refused(exc: RuntimeError) -> bool:
    """Whether ``exc`` is a GDN kernel package refusing this Triton on this GPU, which
    transformers' PyTorch path can stand in for: FLA (0.5.x) refuses its gated chunked backward on
    Hopper with Triton >= 3.4, < 3.7.1 ("... produces incorrect results for gated
    chunk_bwd_dqkwg ..."). Any other error, Triton's own included, is not a refusal."""
    text = str(exc)
    return "Triton" in text and "incorrect results" in text


def _device_name(dev: torch.device) -> str:
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def save(model, provenance: dict, out_dir) -> Path:
    """Write ``model.safetensors`` (bf16) and ``provenance.json`` (with ``bytes``, the weights
    file's size) into ``out_dir``; returns it."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(torch.bfloat16).contiguous().cpu()
             for k, v in model.state_dict().items()}
    save_file(state, str(out / "model.safetensors"), metadata={"size": provenance["size"]})
    prov = dict(provenance, bytes=(out / "model.safetensors").stat().st_size)
    (out / "provenance.json").write_text(provenance_text(prov))
    return out


def provenance_text(prov: dict) -> str:
    """``prov`` as JSON: indented, the training log one step per line."""
    head = json.dumps({k: v for k, v in prov.items() if k != "log"}, indent=1)
    log = ",\n".join("  " + json.dumps(r) for r in prov.get("log", []))
    return head[:-2] + ',\n "log": [\n' + log + "\n ]\n}\n"


def load_provenance(path) -> dict:
    """``provenance.json`` of a checkpoint directory (or of ``checkpoint_dir(size)`` when
    ``path`` is a size name)."""
    p = checkpoint_dir(path) if isinstance(path, str) and path in SIZES else Path(path)
    f = p / "provenance.json"
    if not f.is_file():
        raise ValueError(f"path: no provenance.json in {p} (train it: python "
                         "scripts/train_tiny_gdn.py)")
    return json.loads(f.read_text())


def load_model(path, *, dtype: torch.dtype = torch.float64, device=None):
    """The checkpoint at ``path`` (a directory, or a size name for the committed one) in
    ``dtype`` on ``device``, eval mode, GDN layers patched (``patch_model``), its norms in
    float64 when ``dtype`` is float64 (``float64_norms``). ``ValueError`` naming ``path`` when
    it holds no checkpoint."""
    from safetensors.torch import load_file
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    from pmll_lab.models.qwen3_next import patch_model

    p = checkpoint_dir(path) if isinstance(path, str) and path in SIZES else Path(path)
    prov = load_provenance(p)
    cfg = Qwen3NextConfig.from_dict({"attn_implementation": "eager", **prov["config"]})
    dev = torch.device(device) if device is not None else torch.device("cpu")
    with dev:
        model = Qwen3NextForCausalLM(cfg)
    state = load_file(str(p / "model.safetensors"))
    model.load_state_dict({k: v.to(torch.float32) for k, v in state.items()}, strict=True)
    model = model.to(dtype=dtype, device=dev).eval()
    if dtype == torch.float64:
        float64_norms(model)
    patch_model(model)
    return model
