"""Launch settings of the kernel families, as data: one frozen table per family.

A setting is what a launcher reads when it launches (a ``LaunchPlan`` when it is made): tiles,
warps, rows loaded ahead, unroll limits, switches that move loads but no arithmetic. Each field
of a table carries the measurement behind its shipped value (``why``, one line) and where that
measurement is recorded (``see``: a section of ``reports/perf-notes.md``, the section of the
chronological ``reports/perf-notes-archive.md`` where it was first logged, and a committed run's
log); ``describe()`` lists them all. Families: ``gdn()`` (decode, the chain and the tiles the
carry shares with them for bitwise agreement), ``carry()`` (the carried-state exact form,
flush and accept), ``conv()``, ``ring()`` (the PMLL ring's read and write), ``attention()``
(attention over the ring), ``ring_form()`` (the carried state's ring form, SPEC §3d).

A table setting is a tuple of rows with named columns, one row type per table (``VkTile``,
``VkRowsHalf``, ``VkAhead``, ``AttentionTileRow``, ``RingFormTile``, in ``setting_rows``; the
row types' columns carry their rules), and the function that picks a table's row for a case sits beside it
(``vk_tiles_row``, ``vk_rows_half_row``, ``vk_ahead_row``, ``attention_tile``,
``ring_form_tiles_row``). Rows that differ by state dtype are picked by the dtype's name,
among ``STATE_DTYPES`` only (:func:`state_bytes` refuses the rest).

Scripts and tests change settings only inside ``override`` (names are the fields', unique
across families; nested blocks restore the outer values; not thread-safe)::

    with settings.override(vk_tiles=((1 << 62, 8, 16, 1),), carry_prefetch_rows=False):
        ...

``fma_sums``, ``packed_state_tile`` and ``default_state_layout`` are fixed when
``pmll_lab`` is
imported (globals of the jitted ``recurrence`` functions; the launchers' keyword default): listed
here, refused by ``override``.
``recurrence.EXACT_LAUNCH`` is not a setting: it is what keeps the exact family's rounding alike
in every kernel.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass

from pmll_lab.backend import INTERPRET, env_flag
from pmll_lab.ops.setting_rows import (  # noqa: F401  (the row types and rules, read from here)
    CHUNK, COUNT, FLAG, LAYOUT, POSITIVE, POW2, POW2_16, STATE_DTYPES, VALUE_ROWS,
    AttentionCase, AttentionTile, AttentionTileRow, KvBlock, OneRow, RingFormTile, Rule, Table,
    VkAhead, VkRowsHalf, VkTile, as_row, setting, state_bytes)


@dataclass(frozen=True)
class GdnSettings:
    """Decode, the chain, and the tiles the carried-state kernels share with them (one tile
    rule for all, so that their sums run in one order)."""

    kv_block: KvBlock | None = setting(
        None, check=OneRow(KvBlock, may_be_none=True),
        why="one warp keeps the key sums in a warp; BK*BV = 4096 fp32: decode 78 % of the copy "
            "roofline, the 4-row chain the best of BV 8-64 x 1-8 warps",
        see="perf-notes 'Launch constants: GDN decode and chain'; "
            "archive v0 (reports/h200-2026-11-29/logs/tune-gdn-layout.log)")
    """K-major block (``KvBlock``: ``BV``, warps) for every head size, or None:
    ``block_config``'s rule (``BV = min(vd, max(16, 4096 // BK))``, 1 warp)."""

    vk_tiles: tuple[VkTile, ...] = setting(
        (VkTile(max_work=128, value_rows=8, carry_value_rows=8, num_warps=1),
         VkTile(max_work=1 << 62, value_rows=8, carry_value_rows=16, num_warps=1)),
        check=Table(VkTile),
        why="8 value rows per program stream decode and the chain best; the verify's folds gain "
            "from 16 above B*HV = 128; 2 warps or 4 rows were slower everywhere",
        see="perf-notes 'Launch constants: GDN decode and chain'; archive v11")
    """V-major tiles by work ``B*HV`` (``VkTile`` rows: value rows per program of decode and
    the chain, of the carry verify and flush, warps); :func:`vk_tiles_row` picks one."""

    vk_rows_half: tuple[VkRowsHalf, ...] = setting(
        (VkRowsHalf(max_work=256, value_rows=8), VkRowsHalf(max_work=1 << 62, value_rows=16)),
        check=Table(VkRowsHalf),
        why="16 rows: the chain 8-9 % faster at B*HV = 2048-8192 and decode 3 % at 8192, decode "
            "level at 2048 (45.5 against 45.0 us); 8 rows at 256 and below (B=1 chain 9.1 against "
            "10.6 us); B*HV 257-2047 not measured",
        see="perf-notes 'Launch constants: GDN decode and chain'; "
            "reports/h200-2026-12-04/logs/tile-bf16.log")
    """Value rows per program of V-major decode and the chain on a 2-byte state, by work
    ``B*HV`` (``VkRowsHalf`` rows; :func:`vk_rows_half_row` picks one), in place of
    ``vk_tiles``' ``value_rows``; warps and the carry's rows stay ``vk_tiles``'. Heads
    whose padded key block (``next_power_of_2(kd)``) is under 32 or over 128 keep ``vk_tiles``'
    rows (``recurrence.vk_config``)."""

    vk_ahead: tuple[VkAhead, ...] = setting(
        (VkAhead(max_work=32, rows_ahead=4, verify_rows_ahead_fp32=4, verify_rows_ahead_half=4,
                 stash_rows_ahead=8),
         VkAhead(max_work=512, rows_ahead=4, verify_rows_ahead_fp32=4, verify_rows_ahead_half=4,
                 stash_rows_ahead=4),
         VkAhead(max_work=1 << 62, rows_ahead=0, verify_rows_ahead_fp32=2,
                 verify_rows_ahead_half=1, stash_rows_ahead=4)),
        check=Table(VkAhead),
        why="a row loaded in the loop adds a dependent memory round trip at small batches; rows "
            "ahead cost registers, so resident programs at large ones",
        see="perf-notes 'Launch constants: GDN decode and chain'; archive v14")
    """V-major loads ahead by work ``B*HV`` (``VkAhead`` rows: input rows ahead of decode and
    the chain, of the exact verify on a 4-byte and on a 2-byte state, stash rows ahead);
    :func:`vk_ahead_row` picks one. Loads move, arithmetic does not: every bit is the same."""

    vk_chunk: int = setting(
        32, check=POW2,
        why="a key sum is register adds over chunks plus a 3-step shuffle tree; one 128-key "
            "chunk was much slower",
        see="perf-notes 'Launch constants: GDN decode and chain'; archive v11, v12")
    """Keys per chunk (``CW``) of a V-major tile ``[BR, NC, CW]``; narrower heads: one chunk."""

    vk_qk_hint: bool = setting(
        True, check=FLAG,
        why="vector loads of aligned q/k rows: the V-major verify ~8 % faster; off, q/k views of "
            "any alignment agree bitwise (views 8 bytes off 16 differed from their decodes)",
        see="perf-notes 'Launch constants: GDN decode and chain'; archive v12, v13")
    """Whether V-major launches may load q/k rows as aligned vectors
    (``recurrence.vk_qk_aligned``)."""

    chain_unroll_max_rows: int = setting(
        4, check=COUNT,
        why="unrolled at K = 8 the chain's last row was 1 ulp off decodes at kd = 64; the runtime "
            "loop is bitwise and faster at K = 8, slower at K = 4",
        see="perf-notes 'Launch constants: GDN decode and chain'; archive v10 "
            "(reports/h200-2026-11-29s3/logs/bitwise-probe-rolled.log)")
    """Chains of up to this many rows unroll their row loop; longer ones run a runtime loop."""

    fma_sums: bool = setting(
        env_flag("PMLL_LAB_FMA_SUMS", not INTERPRET), check=FLAG,
        when="import",
        why="the instruction-bound verify gets its key sums' FMAs back; off in the interpreter, "
            "which computes tl.fma unfused anyway and ran the suite at twice the time",
        see="perf-notes 'Launch constants: GDN decode and chain'; archive v13")
    """``recurrence.dot_fma`` fuses its products; ``PMLL_LAB_FMA_SUMS=0``/``1`` in the
    environment before ``pmll_lab`` is imported switches it (default: on a GPU)."""

    packed_state_tile: bool = setting(
        env_flag("PMLL_LAB_PACKED_STATE_TILE", True), check=FLAG, when="import",
        why="a bf16/fp16 tile held as 2-byte pairs between rows takes half the registers (the "
            "V-major verify, B = 64, sm_90: 228 -> 168); the exact lazy step 8 % faster at "
            "B = 64 and 128 (bf16 pool, H100); a decode never packs (it lost 3.4 -> 5.1 us at "
            "B = 1 when it did); same bits",
        see="perf-notes 'bf16 state pools'")
    """The exact family (chain, exact carry verify, folds, flush) holds a 2-byte state tile in
    its own type between rows (``recurrence.round_to_state``, ``state_tile``); a decode (one
    row) widens its tile once whatever this says; ``PMLL_LAB_PACKED_STATE_TILE=0`` in the
    environment before ``pmll_lab`` is imported switches it off (default on)."""

    default_state_layout: str = setting(
        "vk", check=LAYOUT, when="import",
        why="V-major is faster for every GDN kernel (decode 0.95x, the K=4 chain 0.75x, the lazy "
            "exact verify 0.83x the K-major time at B=64), FlashInfer's and SGLang's layout, "
            "and the only one of the ring form and the CUDA twins: one default for all; "
            "K-major states (FLA, vLLM, the HF cache) name state_layout='kv'",
        see="perf-notes 'Launch constants: GDN decode and chain'; archive v16; docs/layouts.md")
    """The ``state_layout`` every GDN launcher, reference, input maker and state holder takes
    by default (``"vk"``: ``[S, HV, vd, kd]``; ``docs/layouts.md``)."""


def _by_work(rows: tuple, work: int):
    """The first of ``rows`` whose ``max_work`` is ``>= work``, else the last."""
    return next((row for row in rows if work <= row.max_work), rows[-1])


def vk_tiles_row(work: int) -> VkTile:
    """The active ``vk_tiles`` row for ``work = B * HV`` (sequences x value heads): the first
    whose ``max_work`` is ``>= work``, else the last."""
    return _by_work(gdn().vk_tiles, work)


def vk_rows_half_row(work: int) -> VkRowsHalf:
    """The active ``vk_rows_half`` row for ``work = B * HV``, picked as :func:`vk_tiles_row`
    picks."""
    return _by_work(gdn().vk_rows_half, work)


def vk_ahead_row(work: int) -> VkAhead:
    """The active ``vk_ahead`` row for ``work = B * HV``, picked as :func:`vk_tiles_row`
    picks; ``VkAhead.verify_rows_ahead(state_dtype)`` gives the verify's column."""
    return _by_work(gdn().vk_ahead, work)


@dataclass(frozen=True)
class CarrySettings:
    """The carried-state verify's exact form, the flush and the accept."""

    exact_split_columns: bool = setting(
        True, check=FLAG,
        why="a head's column blocks across programs (arrival count, last restashes): 1.8-2.2x "
            "the per-head loop at B = 64 and 128, bitwise equal to it",
        see="perf-notes 'Launch constants: carried state (exact form)'; "
            "archive v2 (reports/h200-2026-11-29b/logs/tune-carry.log)")
    """Split the exact verify's column blocks across programs (grid ``B*HV*NV``); off: one
    program per (sequence, head) loops over them (grid ``(B, HV)``)."""

    exact_unroll_max_rows: int = setting(
        8, check=COUNT,
        why="every K <= CAP unrolls; the runtime loop (the chain's fix for 1-ulp rows at fp32 "
            "kd = 64, K = 8) has not run on a GPU",
        see="perf-notes 'Launch constants: carried state (exact form)'; archive v10 "
            "(reports/h200-2026-11-29s3/logs/bitwise-probe-final.log)")
    """Exact verifies of up to this many rows unroll their row loop (``GDN_CARRY_CAP`` = 8);
    longer ones run a runtime loop without prefetch."""

    carry_prefetch_rows: bool = setting(
        True, check=FLAG,
        why="row t+1's loads issued before row t's stores hide one memory latency per row: "
            "6-9 % on the K-major verify; loads only, bitwise the same",
        see="perf-notes 'Launch constants: carried state (exact form)'; archive v7, v14")
    """The K-major exact verify and flush, and the V-major folds past ``vk_ahead``'s rows,
    load the next row before running the current one."""

    accept_block: int = setting(
        128, check=POW2, why="a handful of int32 loads and stores per sequence; not tuned",
        see="not measured")
    """Sequences per program of the accept kernel (``carry_accept``)."""


@dataclass(frozen=True)
class ConvSettings:
    """The causal depthwise conv's kernels (update, chain, carried verify and flush)."""

    conv_block_channels: int = setting(
        256, check=POW2, why="initial choice, not tuned: a window tile stays <= 1024 elements",
        see="notebooks/gdn_conv.ipynb measures at this setting")
    """Channels a program covers (rounded to whole rows)."""

    conv_num_warps: int = setting(
        2, check=POW2, why="64 threads over 256 channels, 4 contiguous (8 bytes of bf16) each; "
        "not tuned", see="notebooks/gdn_conv.ipynb")
    """Warps per conv program."""

    conv_row_width: int = setting(
        64, check=COUNT, why="a row width when no l2norm group (head size) is given",
        see="not measured")
    """Row width ``W`` when ``qk_channels == 0`` and no ``head_dim`` is given."""


@dataclass(frozen=True)
class RingSettings:
    """The PMLL ring's read and write kernels."""

    ring_tile_elems: int = setting(
        8192, check=POW2,
        why="read 90-91 % and write 88-95 % of the copy roofline, within 2 % of the best tile; "
            "16384 lost up to 40 points on gated writes",
        see="perf-notes 'Launch constants: PMLL ring and ring attention'; "
            "archive 'Launch settings as data' "
            "(reports/h200-2026-11-29/logs/tune-pmll-ring.log)")
    """Elements per ``[BLOCK_S, BLOCK_D]`` tile and tensor (64 slots at D = 128)."""

    ring_num_warps: int = setting(
        8, check=POW2, why="4 warps lost 6-30 points on gated writes (32 elements per thread)",
        see="perf-notes 'Launch constants: PMLL ring and ring attention'; "
            "archive 'Launch settings as data' "
            "(same log)")
    """Warps per ring program."""


@dataclass(frozen=True)
class AttentionSettings:
    """Attention of a segment over the ring (``ring_attention``)."""

    attention_tiles: tuple[AttentionTileRow, ...] = setting(
        (AttentionTileRow(AttentionCase(64, 2), AttentionTile(64, 64, 4, 3)),
         AttentionTileRow(AttentionCase(128, 2), AttentionTile(64, 64, 4, 3)),
         AttentionTileRow(AttentionCase(64, 4), AttentionTile(32, 16, 4, 2)),
         AttentionTileRow(AttentionCase(128, 4), AttentionTile(32, 16, 4, 2))),
        check=Table(AttentionTileRow, may_be_empty=True),
        why="16-bit: 64 x 64, 4 warps, 3 stages the fastest of 8 tiles at D = 64 and 128; fp32 "
            "(checks, not speed): 32 x 16 spills least",
        see="perf-notes 'Launch constants: PMLL ring and ring attention'; "
            "archive 'Ring attention from the ring in place' "
            "(reports/h200-2026-11-30b/logs/tune-ring-attention.log)")
    """``AttentionTileRow`` rows: ``(AttentionCase(padded head size, bytes per element),
    AttentionTile(BLOCK_M, BLOCK_N, num_warps, num_stages))``; a dict of such pairs is taken;
    :func:`attention_tile` picks the tile of a case."""

    attention_default_tile: AttentionTile = setting(
        AttentionTile(block_m=64, block_n=32, num_warps=4, num_stages=2),
        check=OneRow(AttentionTile), why="head and element sizes the table lacks; capped at "
        "64 x 32 above D = 128",
        see="perf-notes 'Launch constants: PMLL ring and ring attention'; "
            "archive 'Launch settings as data'")
    """Tile of a head size and element size missing from ``attention_tiles``."""


def attention_tile(block_d: int, element_bytes: int) -> AttentionTile:
    """The active ring-attention tile of a padded head size ``block_d`` and ``element_bytes``
    per element: ``attention_tiles``' tile of that case, else ``attention_default_tile``
    (``block_m`` and ``block_n`` capped at 64 x 32 above ``block_d = 128``)."""
    s = attention()
    tile = dict(s.attention_tiles).get((block_d, element_bytes))
    if tile is not None:
        return tile
    tile = s.attention_default_tile
    if block_d > 128:
        tile = tile._replace(block_m=min(tile.block_m, 64), block_n=min(tile.block_n, 32))
    return tile


@dataclass(frozen=True)
class RingFormSettings:
    """The ring form of the carried state (``pmll_lab.ops.carry.ring``, SPEC §3d)."""

    ring_form_tiles: tuple[RingFormTile, ...] = setting(
        (RingFormTile(32, 2, 64, 32, 2, 4), RingFormTile(32, 4, 64, 32, 2, 3),
         RingFormTile(256, 4, 64, 32, 1, 3), RingFormTile(1 << 62, 2, 128, 64, 2, 2),
         RingFormTile(1 << 62, 4, 64, 32, 1, 3)),
        check=Table(RingFormTile),
        why="the fastest per step (13 verifies at ring fill 4 and 3 folds at fill 13 per 16) of "
            "7 tiles (bf16 state) and 4 (fp32): B = 1 64 x 32 x 2 warps x 4 stages (fp32: 3), "
            "B = 8 64 x 32 x 1 x 3, B >= 64 128 x 64 x 2 x 2 (fp32: 64 x 32 x 1 x 3)",
        see="perf-notes 'Launch constants: ring form'; "
            "reports/h200-2026-12-03/logs/tune-ring-onelaunch-3.log")
    """Tiles of the ring verify and flush (``ring_verify``, ``gdn_ring_flush_kernel``):
    ``RingFormTile`` rows (max ``B*HV``, max state element bytes, ``BV``, ``BK``, warps,
    pipeline stages); :func:`ring_form_tiles_row` picks one; ``BV`` is capped at ``vd`` and
    ``BK`` at ``kd`` (``ring.ring_tiles``)."""

    ring_fold_chunk: int = setting(
        32, check=CHUNK,
        why="the fold's [BV, chunk] fp32 output sets the verify's registers; per step (16 "
            "steps, K = 4, bf16 state) 32-key chunks of the B >= 64 tile (BK = 64) took "
            "44.1 / 74.1 us at B = 64 / 128 against 47.2 / 83.1 with 64 (verify at fill 4: "
            "40.0 against 44.1 us at B = 64; with a fold 69.0 against 71.2), 16-key chunks "
            "lose the fold (80.2); tiles with BK <= 32 (fp32, B <= 8) unchanged",
        see="perf-notes 'Launch constants: ring form'; "
            "reports/h200-2026-12-04b/logs/bench-step-fi.log, tune-ring-chunk.log")
    """Keys per chunk of the verify's fold loop (``ring_verify``'s second pass, which only
    a folding sequence runs): 0 for the tile's ``BK``, else a power of two >= 16 (capped at
    ``BK``). The fold's sums run over the window's rows, so the chunk moves no bit."""


    ring_coefficients_first: int = setting(
        2, check=COUNT,
        why="a bf16 verify at B >= 64 (128 x 64 x 2 x 2) took 37.4 / 60.7 us at B = 64 / 128 "
            "with the coefficients first against 39.5 / 64.1 (fold steps 67.1 / 120.1 against "
            "70.5 / 132.1); fp32 (64-row tiles) 74.2 against 70.9, whole-head fp32 tiles no "
            "faster (71.2 against 71.0), so off above 2 bytes",
        see="perf-notes 'Launch constants: ring form'; "
            "reports/h200-2026-12-04c/logs/tune-ring-early.log; "
            "reports/h200-2026-12-04d/logs/tune-ring-fp32-early.log")
    """Largest state element size, in bytes, whose ring verify forms the head's small matrices
    (the Grams of the new rows and the window's keys, the gates, ``Bt``, ``P2``) before its
    state product, where the tile holds a whole head (``BV >= vd``); 0 = never. The Grams then
    run over all keys at once instead of per chunk: a tolerance form either way."""


def ring_form_tiles_row(work: int, state_dtype) -> RingFormTile:
    """The active ``ring_form_tiles`` row for ``work = B * HV`` on a state of ``state_dtype``
    (one of ``STATE_DTYPES``; ``ValueError`` naming ``state_dtype`` for another): the first
    whose ``max_work`` and ``max_state_bytes`` both hold, else the last."""
    size, rows = state_bytes(state_dtype), ring_form().ring_form_tiles
    return next((row for row in rows if work <= row.max_work and size <= row.max_state_bytes),
                rows[-1])


SHIPPED = {"gdn": GdnSettings(), "carry": CarrySettings(), "conv": ConvSettings(),
           "ring": RingSettings(), "attention": AttentionSettings(),
           "ring_form": RingFormSettings()}
"""The tables as shipped, by family."""

_active = dict(SHIPPED)
_FAMILY = {f.name: fam for fam, table in SHIPPED.items() for f in dataclasses.fields(table)}
_FIELD = {f.name: f for table in SHIPPED.values() for f in dataclasses.fields(table)}
assert len(_FIELD) == sum(len(dataclasses.fields(t)) for t in SHIPPED.values()), "names clash"


def gdn() -> GdnSettings:
    """The active GDN table."""
    return _active["gdn"]


def carry() -> CarrySettings:
    """The active carried-state table."""
    return _active["carry"]


def conv() -> ConvSettings:
    """The active conv table."""
    return _active["conv"]


def ring() -> RingSettings:
    """The active PMLL ring table."""
    return _active["ring"]


def attention() -> AttentionSettings:
    """The active ring-attention table."""
    return _active["attention"]


def ring_form() -> RingFormSettings:
    """The active table of the carried state's ring form."""
    return _active["ring_form"]


def describe() -> list[dict]:
    """One dict per setting: ``family``, ``name``, ``value`` (active), ``shipped``, ``when``
    (``"launch"`` or ``"import"``), ``why``, ``see``."""
    return [dict(family=fam, name=f.name, value=getattr(_active[fam], f.name),
                 shipped=f.default, when=f.metadata["when"], why=f.metadata["why"],
                 see=f.metadata["see"])
            for fam, table in SHIPPED.items() for f in dataclasses.fields(table)]


def import_switches() -> str:
    """The settings fixed at import that change a kernel's instructions, as one provenance
    string (``"fma_sums=1 packed_state_tile=1"``): two runs' times describe the same kernels
    only when they agree."""
    g = gdn()
    return " ".join(f"{name}={int(getattr(g, name))}"
                    for name in ("fma_sums", "packed_state_tile"))


@contextlib.contextmanager
def override(**changes):
    """Within the block, launchers read ``changes`` (setting name -> value) instead of the
    active values; on exit (also after an error) the values before the block come back.

    Raises ``ValueError`` naming the settings, before anything changes: names that are no
    setting, settings fixed at import (``fma_sums``, ``packed_state_tile``,
    ``default_state_layout``), values of the wrong form (each setting's ``check``: a ``Rule``,
    or rows whose every column passes its row type's rule, see :func:`_as_row`). Rows may be
    given as plain tuples or lists of their columns: they become the table's row type
    (``VkTile``, ``VkAhead``, ...)."""
    unknown = sorted(n for n in changes if n not in _FIELD)
    if unknown:
        raise ValueError(f"{', '.join(unknown)}: not a launch setting (known: "
                         f"{', '.join(_FIELD)})")
    fixed = sorted(n for n in changes if _FIELD[n].metadata["when"] == "import")
    if fixed:
        raise ValueError(f"{', '.join(fixed)}: fixed when pmll_lab is imported, not overridable "
                         "(fma_sums: PMLL_LAB_FMA_SUMS in the environment; packed_state_tile: "
                         "PMLL_LAB_PACKED_STATE_TILE; "
                         "default_state_layout: pass state_layout=)")
    checked = {n: _checked(n, v) for n, v in changes.items()}
    saved = dict(_active)
    for fam in SHIPPED:
        mine = {n: v for n, v in checked.items() if _FAMILY[n] == fam}
        if mine:
            _active[fam] = dataclasses.replace(_active[fam], **mine)
    try:
        yield
    finally:
        _active.clear()
        _active.update(saved)


def _checked(name: str, value):
    """``value`` in the form ``name``'s table holds it (rows as their row type, lists as
    tuples); ``ValueError`` naming ``name`` (and the row and column at fault)."""
    check = _FIELD[name].metadata["check"]
    if isinstance(check, Rule):
        if not check.test(value):
            raise ValueError(f"{name}: expected {check.text} (shipped: "
                             f"{_FIELD[name].default!r}), got {value!r}")
        return value
    if isinstance(check, OneRow):
        return None if value is None and check.may_be_none else as_row(check.row, value, name)
    if isinstance(value, dict):                      # attention_tiles: {case: tile}
        value = tuple(value.items())
    if not isinstance(value, (tuple, list)) or not (value or check.may_be_empty):
        raise ValueError(f"{name}: expected a {'' if check.may_be_empty else 'non-empty '}"
                         f"tuple of {check.row.__name__} rows ({', '.join(check.row._fields)}), "
                         f"got {value!r}")
    return tuple(as_row(check.row, row, f"{name}: row {i}") for i, row in enumerate(value))


def parse_overrides(items) -> dict:
    """``NAME=VALUE`` strings (``VALUE`` a Python literal: ``16``, ``(64, 32, 2, 2)``, ``True``)
    as a checked override for :func:`override`, for scripts' ``--set`` flags. Raises
    ``ValueError`` naming the item that is not ``NAME=VALUE`` with a literal ``VALUE``, or the
    setting whose name or value :func:`override` refuses."""
    import ast

    over = {}
    for item in items:
        name, eq, value = item.partition("=")
        name = name.strip()
        if not eq or not name:
            raise ValueError(f"{item!r} is not NAME=VALUE")
        if name in over:
            raise ValueError(f"{name} given twice ({item!r})")
        try:
            over[name] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            raise ValueError(f"{item!r}: VALUE is not a Python literal (a number, True, a "
                             "tuple of numbers; write 4611686018427387904, not 1 << 62)") from None
    with override(**over):
        pass
    return over


if __name__ == "__main__":           # python -m pmll_lab.ops.settings: the shipped table
    for r in describe():
        print(f"{r['family']:10} {r['name']:26} {r['value']!r}\n{'':37}{r['why']}\n"
              f"{'':37}see {r['see']}")
