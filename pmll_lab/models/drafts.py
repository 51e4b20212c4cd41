"""Draft sources for speculative decoding that need no second checkpoint.

A draft source is a callable ``draft(contexts, n) -> list[list[int]]``: for each sequence of the
step (``contexts``, a list of ``DraftContext``) up to ``n`` proposed next tokens (fewer, or none,
is allowed). ``pmll_lab.models.generate.speculative_generate`` verifies ``n = K - 1`` of them
per step after the last accepted token.

- ``NgramDraft`` (``draft="ngram"``): prompt lookup. The longest suffix of the sequence so far
  (``max_ngram`` down to ``min_ngram`` tokens) that occurred earlier proposes the tokens that
  followed its most recent earlier occurrence. Source: "prompt lookup decoding" (Saxena 2023),
  vLLM's ``ngram`` speculator; a lookup, no model.
- ``NoisyDraft`` (``draft="noisy"``, ``draft_accept=p``): the target's own greedy continuation
  (a reference run), each token replaced by a different one with probability ``1 - p``. Each
  draft token is then right with probability ``p`` independently, so the expected acceptance
  length of a ``K``-row verify is ``1 + p + ... + p**(K-1)``: acceptance becomes a swept
  parameter instead of a property of a draft model we do not have.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DraftContext:
    """One sequence as a draft source sees it: ``index`` (its prompt's index in the call),
    ``prompt`` and ``generated`` (token ids so far; the last generated token is the one the
    next verify starts from)."""

    index: int
    prompt: Sequence[int]
    generated: Sequence[int]

    @property
    def tokens(self) -> list[int]:
        """Prompt followed by the generated tokens."""
        return list(self.prompt) + list(self.generated)


class NgramDraft:
    """Prompt-lookup proposals (module docstring). ``max_ngram >= min_ngram >= 1``; raises
    ``ValueError`` naming the argument otherwise."""

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        if not (isinstance(min_ngram, int) and isinstance(max_ngram, int)
                and 1 <= min_ngram <= max_ngram):
            raise ValueError(f"max_ngram, min_ngram: need 1 <= min_ngram <= max_ngram, got "
                             f"{max_ngram}, {min_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def propose(self, tokens: Sequence[int], n: int) -> list[int]:
        """Up to ``n`` tokens following the most recent earlier occurrence of the longest
        matching suffix of ``tokens``; ``[]`` when no suffix recurs."""
        seq = np.asarray(tokens, dtype=np.int64)
        for L in range(min(self.max_ngram, len(seq) - 1), self.min_ngram - 1, -1):
            windows = np.lib.stride_tricks.sliding_window_view(seq[:-1], L)
            hits = np.flatnonzero((windows == seq[-L:]).all(axis=1))
            if hits.size:
                start = int(hits[-1]) + L
                return seq[start:start + n].tolist()
        return []

    def __call__(self, contexts: Sequence[DraftContext], n: int) -> list[list[int]]:
        return [self.propose(c.tokens, n) for c in contexts]


class NoisyDraft:
    """The reference continuation with each token kept with probability ``accept``
    (module docstring).

    ``reference``: per prompt the target's greedy tokens (lists or a LongTensor ``[N, T]``;
    entries < 0 are padding); ``vocab_size``: replacements are ``(t + r) % vocab_size`` with
    ``r`` uniform in ``[1, vocab_size)``, never ``t``; ``seed`` seeds the coin flips (one
    ``random.Random``). Raises ``ValueError`` naming the argument."""

    def __init__(self, reference, accept: float, vocab_size: int, seed: int = 0):
        if isinstance(accept, bool) or not isinstance(accept, (int, float)) \
                or not 0.0 <= accept <= 1.0:
            raise ValueError(f"draft_accept: expected a probability in [0, 1], got {accept!r}")
        if not isinstance(vocab_size, int) or vocab_size < 2:
            raise ValueError(f"vocab_size: expected an int >= 2, got {vocab_size!r}")
        self.reference = [[int(t) for t in row if int(t) >= 0] for row in reference]
        self.accept, self.vocab_size = float(accept), vocab_size
        self.rng = random.Random(seed)

    def __call__(self, contexts: Sequence[DraftContext], n: int) -> list[list[int]]:
        out = []
        for c in contexts:
            if c.index >= len(self.reference):
                raise ValueError(f"reference: no continuation for prompt {c.index}")
            pos = len(c.generated)
            prop = []
            for t in self.reference[c.index][pos:pos + n]:
                if self.rng.random() >= self.accept:
                    t = (t + self.rng.randrange(1, self.vocab_size)) % self.vocab_size
                prop.append(t)
            out.append(prop)
        return out


def _is_noisy(draft) -> bool:
    return isinstance(draft, str) and draft == "noisy"


def check_draft_args(draft, draft_accept=None, reference=None) -> None:
    """``draft_accept`` and ``reference`` belong to the noisy draft: given with any other
    ``draft`` they would be ignored without a word, so ``ValueError`` naming the argument."""
    if _is_noisy(draft):
        return
    for name, value in (("draft_accept", draft_accept), ("reference", reference)):
        if value is not None:
            shown = draft if isinstance(draft, str) else f"a {type(draft).__name__}"
            raise ValueError(f"{name}: only with draft='noisy' (draft is {shown!s}); leave it "
                             "None")


DRAFTS = ("ngram", "noisy")
"""The drafts named by a string (``make_draft``); a callable is a draft of one's own."""


def make_draft(draft, *, draft_accept: float | None = None, reference=None,
               vocab_size: int | None = None, seed: int = 0) -> Callable:
    """The draft callable for ``speculative_generate``'s ``draft``: ``"ngram"``, ``"noisy"``
    (needs ``draft_accept``, ``reference`` and ``vocab_size``) or a callable (returned as is).
    Raises ``ValueError`` naming ``draft`` / ``draft_accept`` otherwise, and naming
    ``draft_accept`` / ``reference`` given with another ``draft`` (``check_draft_args``)."""
    check_draft_args(draft, draft_accept, reference)
    if callable(draft):
        return draft
    if draft == "ngram":
        return NgramDraft()
    if draft == "noisy":
        if draft_accept is None:
            raise ValueError("draft_accept: draft='noisy' needs the probability p that a draft "
                             "token is the target's")
        return NoisyDraft(reference, draft_accept, vocab_size, seed)
    raise ValueError(f"draft: expected one of {DRAFTS} or a callable, got {draft!r}")
