"""Training text every machine has: the Python standard library's own sources, as bytes.

The trained GDN model (``pmll_lab.models.tiny_gdn``) learns from the ``.py`` files of the
running interpreter's standard library (``sysconfig``'s ``stdlib`` directory), so nothing is
downloaded. The selection is a fixed rule over sorted relative paths (``stdlib_files``): every
``*.py`` file except those under ``site-packages``, test directories (``test``, ``tests``,
``idle_test``), build configuration (``config-*``) and the machine-specific
``_sysconfigdata_*`` module. 3.11 and 3.12 ship different files, so the manifest
(``Corpus.manifest``) records the Python version, the file count and a hash of the file list
and of their bytes with every checkpoint.

Held-out split by file (``is_heldout``): a file is held out when the SHA-256 of its relative
path is 0 modulo ``HELDOUT_EVERY``; the rule depends on the path alone, so a file held out on
one Python version is held out on every other.

Tokens: one per byte (``0..255``), ``BOS`` before every file, ``EOS`` after it
(``VOCAB_SIZE = 258``). ``unigram_entropy``: the byte-unigram baseline (nats per token), the
entropy of the held-out targets' own token distribution: the lowest cross-entropy any model that
ignores context can reach on them.
"""

from __future__ import annotations

import hashlib
import math
import platform
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

BOS, EOS = 256, 257
"""The two special tokens: start and end of a file."""
VOCAB_SIZE = 258
"""256 byte values and the two special tokens."""
HELDOUT_EVERY = 10
"""One file in ``HELDOUT_EVERY`` (by the hash of its path) is held out: about 10 %."""
EXCLUDED_PARTS = ("site-packages", "test", "tests", "idle_test", "__pycache__")
"""Directory names whose files are never selected (installed packages, test suites)."""


def stdlib_root() -> Path:
    """The running interpreter's standard-library directory (``Lib/`` of a source tree)."""
    return Path(sysconfig.get_paths()["stdlib"])


def _selected(rel: Path) -> bool:
    parts = rel.parts
    if any(p in EXCLUDED_PARTS or p.startswith("config-") for p in parts[:-1]):
        return False
    return rel.suffix == ".py" and not rel.name.startswith("_sysconfigdata")


def stdlib_files(root: Path | None = None) -> list[str]:
    """The selected files' paths relative to ``root`` (default ``stdlib_root()``), POSIX
    separators, sorted. ``ValueError`` naming ``root`` when it holds no selected file."""
    root = Path(root) if root is not None else stdlib_root()
    found = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.py")
                   if p.is_file() and _selected(p.relative_to(root)))
    if not found:
        raise ValueError(f"root: no Python sources under {root}")
    return found


def is_heldout(rel: str) -> bool:
    """Whether the file at relative path ``rel`` belongs to the held-out split."""
    return int(hashlib.sha256(rel.encode()).hexdigest(), 16) % HELDOUT_EVERY == 0


def encode(data: bytes) -> np.ndarray:
    """``BOS``, the bytes, ``EOS`` as int64 token ids."""
    return np.concatenate(([BOS], np.frombuffer(data, dtype=np.uint8).astype(np.int64), [EOS]))


def decode(ids) -> bytes:
    """Token ids back to bytes (the special tokens dropped)."""
    return bytes(int(t) for t in ids if 0 <= int(t) < 256)


@dataclass
class Corpus:
    """The selected files as two token streams: ``train``, ``heldout`` (int64 arrays, the files
    in sorted order, each ``BOS ... EOS``), ``heldout_files`` (relative path, start offset in
    ``heldout``, token count), and ``manifest`` (what to record with a checkpoint)."""

    train: np.ndarray
    heldout: np.ndarray
    heldout_files: list = field(default_factory=list)
    manifest: dict = field(default_factory=dict)


def load_corpus(root: Path | None = None) -> Corpus:
    """Read the selected files (``stdlib_files``) and split them (``is_heldout``).

    ``manifest``: ``python_version``, ``implementation``, ``files`` (count), ``train_files``,
    ``heldout_files`` (count), ``file_list_sha256`` (of the newline-joined sorted paths),
    ``content_sha256`` (of each file's SHA-256 in order), ``train_tokens``, ``heldout_tokens``,
    ``heldout_every``, ``heldout_list`` (the held-out paths) and ``selection`` (the rule)."""
    root = Path(root) if root is not None else stdlib_root()
    files = stdlib_files(root)
    train, held, held_files = [], [], []
    content = hashlib.sha256()
    offset = 0
    for rel in files:
        data = (root / rel).read_bytes()
        content.update(hashlib.sha256(data).digest())
        ids = encode(data)
        if is_heldout(rel):
            held.append(ids)
            held_files.append((rel, offset, len(ids)))
            offset += len(ids)
        else:
            train.append(ids)
    tr, ho = np.concatenate(train), np.concatenate(held)
    manifest = dict(
        python_version=platform.python_version(), implementation=sys.implementation.name,
        files=len(files), train_files=len(files) - len(held_files),
        heldout_files=len(held_files),
        file_list_sha256=hashlib.sha256("\n".join(files).encode()).hexdigest(),
        content_sha256=content.hexdigest(), train_tokens=int(tr.size),
        heldout_tokens=int(ho.size), heldout_every=HELDOUT_EVERY,
        heldout_list=[f for f, _, _ in held_files],
        selection=("*.py under sysconfig stdlib, sorted; excluded: directories "
                   f"{', '.join(EXCLUDED_PARTS)}, config-*, _sysconfigdata_*; held out: "
                   f"sha256(relative path) % {HELDOUT_EVERY} == 0"))
    return Corpus(train=tr, heldout=ho, heldout_files=held_files, manifest=manifest)


def unigram_entropy(tokens: np.ndarray) -> float:
    """Entropy (nats per token) of the empirical token distribution of ``tokens``."""
    counts = np.bincount(np.asarray(tokens, dtype=np.int64), minlength=VOCAB_SIZE)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


def nats_to_bits(x: float) -> float:
    """Nats to bits (per token, i.e. per byte here)."""
    return x / math.log(2)


WHITESPACE = frozenset(b" \t\n\r")
"""Byte values a prompt does not end in."""


def heldout_prompts(corpus: Corpus, n: int, length: int, seed: int) -> list[list[int]]:
    """``n`` prompts of ``length`` tokens from the held-out files, each starting at a seeded
    line start and ending in a character that is not whitespace: one per file, the longest files first, and where ``n`` exceeds the files
    long enough for a prompt, further prompts from the longest files again at other line
    starts. ``ValueError`` naming ``n`` / ``length`` when they are below 1 or the held-out split
    has too few line starts."""
    if n < 1 or length < 1:
        raise ValueError(f"n, length: expected ints >= 1, got {n}, {length}")
    rng = np.random.default_rng(seed)
    files = [f for f in sorted(corpus.heldout_files, key=lambda f: (-f[2], f[0]))
             if f[2] > length]
    starts = []
    for _, start, size in files:
        toks = corpus.heldout[start:start + size - length]
        lines = [start + i + 1 for i in np.flatnonzero(toks == ord("\n"))]
        # a prompt that ends in a word, not in indentation: a small model continues spaces
        # with spaces, which tells nothing of where forms diverge
        lines = [x for x in lines if int(corpus.heldout[x + length - 1]) not in WHITESPACE]
        starts.append([int(x) for x in rng.permutation(lines)] if lines else [start])
    out = []
    while len(out) < n and any(starts):
        for s in starts:
            if s and len(out) < n:
                pos = s.pop()
                out.append(corpus.heldout[pos:pos + length].tolist())
    if len(out) < n:
        raise ValueError(f"n: {n} prompts of {length} tokens asked, the held-out split has "
                         f"{len(out)} line starts for them")
    return out
