"""Real model architectures (Hugging Face transformers) driven through pmll_lab's kernels.

One module per architecture family, plus the pieces they share; import what you use, e.g.
``from pmll_lab.models.generate import speculative_generate``. Needs ``transformers`` at run time
(the ``models`` extra, see README "Dependencies").

- ``pmll_lab.models.qwen3_next``: Qwen3-Next / Qwen3.5 Gated DeltaNet layers: finding them,
  their projections and gating, the forward redirect to our kernels, the explicit selection of
  transformers' own torch path (the oracle), small seeded configs.
- ``pmll_lab.models.cache``: ``ServingCache``, the one place holding every GDN layer's conv
  window, recurrent state and carry stashes, the attention layers' KV, and the slots (one GDN
  layer's buffers and kernels in ``cache_layer``, the steps' input checks in ``cache_checks``).
- ``pmll_lab.models.timing``: ``StepTimer``, a step's kernel sections (CUDA events on a GPU).
- ``pmll_lab.models.generate``: ``greedy_generate``, ``speculative_generate``, their statistics.
- ``pmll_lab.models.drafts``: draft sources that need no second checkpoint.
- ``pmll_lab.models.oracle``: transformers' own greedy generation and the margin-aware comparison
  of our tokens with it.
- ``pmll_lab.models.common``: what those modules share (the LM head's vocabulary size, the
  ``GdnCache`` base the patched layers recognise), importing none of them.
- ``pmll_lab.models.gpt2_pmll``: GPT-2's attention layers run segment by segment through the
  PMLL ring (``pmll_lab.pmll.pmll_step``).
- ``pmll_lab.models.tiny_gdn``: a small Qwen3-Next-style model trained from a seed on the Python
  standard library's sources (``stdlib_corpus``: the data, byte tokens, held-out split), its
  committed checkpoints and their provenance; the tokens notebook's model.
- ``pmll_lab.models.replayssm_stack``: FlashInfer's ReplaySSM as a ``ServingCache`` form (GPU).
"""
