"""The PMLL seed's GPU ring as published (seed ``000_…txt``), restated in float64, on the CPU.

This is not the project's ring: it is what the seed's ``pmll_read_gpu`` / ``pmll_write_gpu``
compute as written, kept so that notebooks and tests can show, on the same inputs, how far the
seed's results are from the project's float64 reference (``pmll_lab.reference.pmll``, SPEC §1).
Why: a reader comparing this project with the seed should see each behaviour that changed,
measured, not asserted.

What the seed's state and calls do (all modelled here):

- One state for all heads: ``k, v [NH, M, hs]`` and a single ``T`` (rows held, clamped to ``M``).
  ``write(h, ...)`` writes head ``h`` only but advances the shared ``T``, so writing every head
  of one segment (``NH`` calls) advances it ``NH`` times.
- **write** launches one block per token ``t`` of the ``Tctx`` new rows; the block stores into
  slot ``(T + t) % M`` the blend ``g[t] * new[t] + (1 - g[t]) * old`` (``g = 1`` without a
  gate), reading ``old`` from memory. Then ``T = min(T + Tctx, M)``. Consequences:
  *the write head is lost once the ring is full* (``T`` stays ``M``, so every later write starts
  again at slot 0), and for ``Tctx > M`` *several blocks of one launch own the same slot* (tokens
  ``t, t + M, ...``): a race.
- **read** copies slots ``0 .. T-1`` in storage order, then ``Tctx`` zero rows: ``[T + Tctx, hs]``.
  Once the ring has wrapped, storage order is not chronological order.
- **reset** sets ``T = 0`` and keeps the rows, so a later gated write blends with stale rows.

The race (``Tctx > M``). CUDA orders nothing between the blocks of one launch, so the value left
in a slot written by tokens ``w_1 < ... < w_n`` is not determined. Each block's read-modify-write
reads either the value before the launch or one stored by another racing block; the slot ends
with the last store. The set of possible values of one element is therefore every *chain*: an
ordered selection ``(c_1, ..., c_k)`` of distinct writers, ``k >= 1``, each blending into the
previous one's result, starting from the value before the launch (``race_outcomes`` lists them;
each element of each slot, ``k`` and ``v`` alike, may take a different chain, since every thread
does its own read-modify-write). ``write`` picks one outcome per launch through ``race``:

- ``"overlap_last"`` (default): every racing block loads before any stores, the highest token
  stores last: slot = ``g[w_n] new[w_n] + (1 - g[w_n]) old``. It is the outcome a grid whose
  blocks are all resident at once gives when later blocks also store later; it is one member of
  the set, not a guarantee, and not measured here.
- ``"overlap_first"``: the same with the lowest token storing last.
- ``"serial"``: the blocks run one after another in token order; this equals the sequential
  result the project's reference defines.

Only the mechanics above are restated; the seed's code is not copied. Tensors in are any float
dtype and device; everything here is float64 on the CPU, and nothing given is modified.
"""

from __future__ import annotations

from itertools import permutations

import torch

from pmll_lab.reference import pmll as ref

RACES = ("overlap_last", "overlap_first", "serial")


# the reference's own conversion and blend, so the cases where the two agree agree to the bit
as_f64, _blend = ref.as_f64, ref.blend


class SeedRing:
    """float64 twin of the seed's ``pmll_state_gpu``: ``k, v [NH, M, hs]`` and one shared ``T``.

    ``SeedRing(heads, capacity, head_dim)`` starts zeroed with ``T = 0`` (the seed's init).
    Raises ``ValueError`` naming a size below 1.
    """

    def __init__(self, heads: int, capacity: int, head_dim: int):
        for name, value in (("heads", heads), ("capacity", capacity), ("head_dim", head_dim)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: must be an int >= 1, got {value!r}")
        self.k = torch.zeros(heads, capacity, head_dim, dtype=torch.float64)
        self.v = torch.zeros_like(self.k)
        self.T = 0

    @property
    def capacity(self) -> int:
        return self.k.shape[1]

    def reset(self) -> "SeedRing":
        """The seed's reset: ``T = 0``; the rows are kept."""
        self.T = 0
        return self

    def write(self, h: int, k_new: torch.Tensor, v_new: torch.Tensor,
              gate: torch.Tensor | None = None, *, race: str = "overlap_last") -> "SeedRing":
        """The seed's gated write of head ``h``: ``k_new, v_new [Tctx, hs]``, ``gate [Tctx]``
        in ``[0, 1]`` or None (``g = 1``). Slot of token ``t``: ``(T + t) % M``; then
        ``T = min(T + Tctx, M)`` (shared by all heads). ``race`` picks the outcome when
        ``Tctx > M`` (module docstring). Raises ``ValueError`` naming ``h``, ``k_new``,
        ``v_new``, ``gate`` or ``race``. Returns ``self``, updated in place."""
        if race not in RACES:
            raise ValueError(f"race: must be one of {', '.join(RACES)}, got {race!r}")
        heads, capacity, dim = self.k.shape
        if not isinstance(h, int) or not 0 <= h < heads:
            raise ValueError(f"h: must be an int in [0, {heads}), got {h!r}")
        kn, vn = as_f64(k_new), as_f64(v_new)
        if kn.dim() != 2 or kn.shape[1] != dim:
            raise ValueError(f"k_new: expected [Tctx, {dim}], got {tuple(kn.shape)}")
        if vn.shape != kn.shape:
            raise ValueError(f"v_new: expected {tuple(kn.shape)}, got {tuple(vn.shape)}")
        tokens = kn.shape[0]
        g = torch.ones(tokens, dtype=torch.float64) if gate is None else as_f64(gate)
        if g.shape != (tokens,):
            raise ValueError(f"gate: expected [{tokens}], got {tuple(g.shape)}")
        owners: dict[int, list[int]] = {}
        for t in range(tokens):
            owners.setdefault((self.T + t) % capacity, []).append(t)
        for slot, ts in owners.items():
            chain = {"serial": ts, "overlap_last": ts[-1:], "overlap_first": ts[:1]}[race]
            for mem, new in ((self.k, kn), (self.v, vn)):
                row = mem[h, slot].clone()
                for t in chain:
                    row = _blend(g[t], new[t], row)
                mem[h, slot] = row
        self.T = min(self.T + tokens, capacity)
        return self

    def read(self, h: int, t_ctx: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The seed's read of head ``h``: slots ``0 .. T-1`` in storage order, then ``t_ctx``
        zero rows; returns ``k_out, v_out [T + t_ctx, hs]`` (new tensors)."""
        dim = self.k.shape[2]
        pad = torch.zeros(t_ctx, dim, dtype=torch.float64)
        return (torch.cat([self.k[h, :self.T], pad]), torch.cat([self.v[h, :self.T], pad]))


def race_outcomes(old: torch.Tensor, new: torch.Tensor,
                  gate: torch.Tensor | None = None) -> list[tuple[tuple[int, ...], torch.Tensor]]:
    """Every value one slot may hold after a racing seed write (module docstring).

    ``old [D]``: the slot before the launch; ``new [n, D]``: the rows of the ``n`` tokens that
    land on it, in token order; ``gate [n]`` or None. Returns ``[(chain, value [D]), ...]`` for
    every ordered selection ``chain`` of distinct writers (``sum_k n!/(n-k)!`` of them; the
    sequential result is the chain ``(0, 1, ..., n-1)``). float64. Raises ``ValueError`` naming
    ``new`` when ``n`` is 0 or above 6 (the set grows factorially).
    """
    o, nw = as_f64(old), as_f64(new)
    n = nw.shape[0]
    if not 1 <= n <= 6:
        raise ValueError(f"new: 1 to 6 racing rows, got {n}")
    g = torch.ones(n, dtype=torch.float64) if gate is None else as_f64(gate)
    out = []
    for k in range(1, n + 1):
        for chain in permutations(range(n), k):
            row = o.clone()
            for t in chain:
                row = _blend(g[t], nw[t], row)
            out.append((chain, row))
    return out


def _rows(gen: torch.Generator, n: int, dim: int):
    k = torch.randn(n, dim, generator=gen, dtype=torch.float64)
    v = torch.randn(n, dim, generator=gen, dtype=torch.float64)
    g = torch.rand(n, generator=gen, dtype=torch.float64) * 0.8 + 0.1    # gates in [0.1, 0.9]
    return k, v, g


def compare(segments: list[int], *, capacity: int = 8, head_dim: int = 4, heads: int = 1,
            gated: bool = True, reset_after: int | None = None, race: str = "overlap_last",
            seed: int = 0) -> dict:
    """Write the same seeded random segments into a ``SeedRing`` and into the project's
    reference ring (one sequence), then read both (``t_ctx = 2``); returns the differences.

    ``segments``: tokens per write call; each call writes every head (the seed: one call per
    head, in head order). ``reset_after``: index of the segment after which both rings are
    reset. Returns a dict: ``memory_max_abs`` (the rows of ``k`` and ``v`` slot by slot),
    ``read_max_abs`` (the memory rows each read returns, newest last: the seed's ``T`` rows
    against the reference's last ``T``, ``nan`` when the lengths differ), ``seed_rows`` /
    ``ref_rows`` (rows each read returns), ``seed_next_slot`` / ``ref_next_slot`` (head 0's next
    write slot: ``T % M`` in the seed after its last head's write, ``count % M`` in the
    reference), and ``bitwise`` (memory and read equal to the bit).
    """
    gen = torch.Generator().manual_seed(seed)
    seed_ring = SeedRing(heads, capacity, head_dim)
    shape = (1, heads, capacity, head_dim)
    k_ref, v_ref = torch.zeros(shape, dtype=torch.float64), torch.zeros(shape, dtype=torch.float64)
    count = torch.zeros(1, dtype=torch.int64)
    for i, tokens in enumerate(segments):
        rows = [_rows(gen, tokens, head_dim) for _ in range(heads)]
        for h, (k, v, g) in enumerate(rows):
            seed_ring.write(h, k, v, g if gated else None, race=race)
        kn = torch.stack([r[0] for r in rows])[None]                     # [1, H, T, D]
        vn = torch.stack([r[1] for r in rows])[None]
        gate = torch.stack([r[2] for r in rows])[None] if gated else None
        k_ref, v_ref, count = ref.ring_write(k_ref, v_ref, count, kn, vn, gate)
        if reset_after == i:
            seed_ring.reset()
            k_ref, v_ref, count = ref.ring_reset(k_ref, v_ref, count)
    mem = max(float((seed_ring.k - k_ref[0]).abs().max()),
              float((seed_ring.v - v_ref[0]).abs().max()))
    k_out, v_out = ref.ring_read(k_ref, v_ref, count, 2)
    length = min(int(count[0]), capacity)
    read = float("nan")
    if seed_ring.T == length:
        read = 0.0
        for h in range(heads):
            ks, vs = seed_ring.read(h, 2)
            kr = torch.cat([k_out[0, h, capacity - length:capacity], k_out[0, h, capacity:]])
            vr = torch.cat([v_out[0, h, capacity - length:capacity], v_out[0, h, capacity:]])
            read = max(read, float((ks - kr).abs().max()), float((vs - vr).abs().max()))
    return {"memory_max_abs": mem, "read_max_abs": read, "seed_rows": seed_ring.T,
            "ref_rows": length, "seed_next_slot": seed_ring.T % capacity,
            "ref_next_slot": int(count[0]) % capacity,
            "bitwise": mem == 0.0 and read == 0.0}


SCENARIOS = {
    "ring not yet wrapped (5 + 2 rows, M = 8)": dict(segments=[5, 2]),
    "ring exactly full (3 + 5 rows)": dict(segments=[3, 5]),
    "read after wraparound (6 + 5 rows)": dict(segments=[6, 5]),
    "write after full (6 + 5 + 2 rows)": dict(segments=[6, 5, 2]),
    "T > M in one write (11 rows, gated)": dict(segments=[11]),
    "T > M in one write (11 rows, gated), lowest token stores last":
        dict(segments=[11], race="overlap_first"),
    "T > M in one write (11 rows, gate = 1)": dict(segments=[11], gated=False),
    "T > M in one write (11 rows, gate = 1), lowest token stores last":
        dict(segments=[11], gated=False, race="overlap_first"),
    "T > M in one write (11 rows, gated), blocks in token order":
        dict(segments=[11], race="serial"),
    "two heads, one shared length (3 + 2 rows)": dict(segments=[3, 2], heads=2),
    "gated write after reset (6, reset, 3 rows)": dict(segments=[6, 3], reset_after=0),
}
"""The cases the notebook tabulates: ``name -> compare(**kwargs)`` (M = 8, hs = 4, seed 0)."""
