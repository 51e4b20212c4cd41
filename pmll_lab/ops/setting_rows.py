"""The pieces the launch-setting tables are made of: rules a value must pass, the state dtypes
the tables have rows for, and the named row types of the table settings (``VkTile``,
``VkAhead``, ``RingFormTile`` ...), each column annotated with its rule.

``settings`` builds its family tables from these (``setting(...)`` declares a field with its
check and the measurement behind it) and checks every override through ``as_row``; import them
from ``pmll_lab.ops.settings``, which re-exports them.
"""

from __future__ import annotations

import functools
import typing
from dataclasses import dataclass, field
from typing import Annotated, Callable, NamedTuple

class Rule(NamedTuple):
    """What a setting's value, or a column of a row, must be: ``test`` of the value, and
    ``text`` saying it in an error message."""

    test: Callable[[object], bool]
    text: str


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_pow2(v) -> bool:
    return _is_int(v) and v >= 1 and not v & (v - 1)


FLAG = Rule(lambda v: isinstance(v, bool), "a bool")
COUNT = Rule(lambda v: _is_int(v) and v >= 0, "an int >= 0")
POSITIVE = Rule(lambda v: _is_int(v) and v >= 1, "an int >= 1")
POW2 = Rule(_is_pow2, "a power of two")
POW2_16 = Rule(lambda v: _is_pow2(v) and v >= 16, "a power of two >= 16")
VALUE_ROWS = Rule(lambda v: _is_pow2(v) and v >= 2,
                  "a power of two >= 2 (a warp's 4 x 8 threads must see two rows)")
CHUNK = Rule(lambda v: _is_int(v) and (v == 0 or (v >= 16 and _is_pow2(v))),
             "0 or a power of two >= 16")
LAYOUT = Rule(lambda v: v in ("kv", "vk"), "'kv' or 'vk'")


STATE_DTYPES = {"float32": 4, "bfloat16": 2, "float16": 2}
"""The state pools' element types the launch tables have rows for, by ``torch`` dtype name,
with their bytes per element: a 4-byte state reads the tables' fp32 columns, a 2-byte one
their ``half`` columns and rows. The one list: any other dtype is refused
(:func:`state_bytes`), never given another dtype's settings."""


def state_bytes(state_dtype, arg: str = "state_dtype") -> int:
    """Bytes per element of a state pool of ``state_dtype`` (a ``torch.dtype`` or its name,
    ``"bfloat16"``), one of ``STATE_DTYPES``. Raises ``ValueError`` naming ``arg`` for any
    other dtype (a 1-byte float8 state has no rows of its own and takes no other's)."""
    name = str(state_dtype).removeprefix("torch.")
    if name not in STATE_DTYPES:
        raise ValueError(f"{arg}: {name} has no rows in the launch settings (state dtypes: "
                         f"{', '.join(STATE_DTYPES)})")
    return STATE_DTYPES[name]


class KvBlock(NamedTuple):
    """The ``kv_block`` setting: one K-major block for every head size."""

    block_v: Annotated[int, POW2]
    """``BV``: value columns per program (capped at ``vd`` padded to a power of two)."""
    num_warps: Annotated[int, POW2]
    """Warps per program."""


class VkTile(NamedTuple):
    """A row of ``vk_tiles``: the V-major tile for work up to ``max_work``."""

    max_work: Annotated[int, COUNT]
    """Largest work ``B*HV`` (sequences x value heads) the row applies to."""
    value_rows: Annotated[int, VALUE_ROWS]
    """Value rows per program (``BR``) of decode and the chain."""
    carry_value_rows: Annotated[int, VALUE_ROWS]
    """Value rows per program of the carried-state verify and flush."""
    num_warps: Annotated[int, POW2]
    """Warps per program (every launch of the family)."""


class VkRowsHalf(NamedTuple):
    """A row of ``vk_rows_half``: decode's and the chain's value rows on a 2-byte state."""

    max_work: Annotated[int, COUNT]
    """Largest work ``B*HV`` (sequences x value heads) the row applies to."""
    value_rows: Annotated[int, VALUE_ROWS]
    """Value rows per program (``BR``) of decode and the chain, in place of ``VkTile``'s."""


class VkAhead(NamedTuple):
    """A row of ``vk_ahead``: what V-major launches load ahead for work up to ``max_work``.
    Input rows ahead (unrolled rows): row ``t + AHEAD``'s inputs load before row ``t`` runs;
    stash rows ahead: that many pending rows load with the state, the rest one ahead."""

    max_work: Annotated[int, COUNT]
    """Largest work ``B*HV`` (sequences x value heads) the row applies to."""
    rows_ahead: Annotated[int, COUNT]
    """Input rows (tokens) ahead of decode and the chain (``AHEAD``)."""
    verify_rows_ahead_fp32: Annotated[int, COUNT]
    """Input rows ahead of the exact carry verify on a 4-byte (float32) state."""
    verify_rows_ahead_half: Annotated[int, COUNT]
    """Input rows ahead of the exact carry verify on a 2-byte (bfloat16, float16) state."""
    stash_rows_ahead: Annotated[int, COUNT]
    """Pending stash rows loaded with the state by the exact verify and the flush
    (``STASH_AHEAD``)."""

    def verify_rows_ahead(self, state_dtype) -> int:
        """Input rows ahead of the exact carry verify on a state of ``state_dtype`` (one of
        ``STATE_DTYPES``; ``ValueError`` naming ``state_dtype`` for another)."""
        if state_bytes(state_dtype) == 4:
            return self.verify_rows_ahead_fp32
        return self.verify_rows_ahead_half


class AttentionTile(NamedTuple):
    """A ring-attention tile (``attention_tiles``' tiles, ``attention_default_tile``)."""

    block_m: Annotated[int, POSITIVE]
    """Queries per program (``BLOCK_M``; capped at the segment's length)."""
    block_n: Annotated[int, POSITIVE]
    """Ring rows per step (``BLOCK_N``)."""
    num_warps: Annotated[int, POSITIVE]
    """Warps per program."""
    num_stages: Annotated[int, POSITIVE]
    """Software pipeline stages."""


class AttentionCase(NamedTuple):
    """The case an ``attention_tiles`` row is for."""

    block_d: Annotated[int, POSITIVE]
    """Head size padded to a power of two (at least 16), ``BLOCK_D``."""
    element_bytes: Annotated[int, POSITIVE]
    """Bytes per element of q and the ring (2: bf16/fp16, 4: fp32)."""


class AttentionTileRow(NamedTuple):
    """A row of ``attention_tiles``: the tile of one case."""

    case: AttentionCase
    tile: AttentionTile


class RingFormTile(NamedTuple):
    """A row of ``ring_form_tiles``: the tile of the ring verify and flush for work up to
    ``max_work`` on a state of up to ``max_state_bytes`` per element."""

    max_work: Annotated[int, COUNT]
    """Largest work ``B*HV`` (sequences x value heads) the row applies to."""
    max_state_bytes: Annotated[int, POSITIVE]
    """Largest state element size, in bytes, the row applies to."""
    block_v: Annotated[int, POW2_16]
    """``BV``: value rows per program (capped at ``vd`` padded to a power of two)."""
    block_k: Annotated[int, POW2_16]
    """``BK``: keys per chunk (capped at ``kd`` padded to a power of two)."""
    num_warps: Annotated[int, POW2]
    """Warps per program."""
    num_stages: Annotated[int, POSITIVE]
    """Software pipeline stages."""


@dataclass(frozen=True)
class Table:
    """The check of a table setting: a tuple of ``row`` rows (plain tuples or lists of its
    columns are taken), non-empty unless ``may_be_empty``."""

    row: type
    may_be_empty: bool = False


@dataclass(frozen=True)
class OneRow:
    """The check of a setting holding one ``row`` (a plain tuple is taken), or ``None`` where
    ``may_be_none``."""

    row: type
    may_be_none: bool = False


def setting(value, *, check: Rule | Table | OneRow, why: str, see: str, when: str = "launch"):
    """A table field: its shipped ``value``, the ``check`` an override must pass, ``why`` (the
    measurement behind the value, one line), ``see`` (where it is recorded) and ``when`` it is
    read (``"launch"``, or ``"import"`` for the fixed ones)."""
    return field(default=value, metadata=dict(check=check, why=why, see=see, when=when))


@functools.cache
def _column_rules(row_type: type) -> dict:
    """``{column: Rule or nested row type}`` from ``row_type``'s annotations."""
    hints = typing.get_type_hints(row_type, include_extras=True)
    return {c: (hints[c].__metadata__[0] if hasattr(hints[c], "__metadata__") else hints[c])
            for c in row_type._fields}


def as_row(row_type: type, value, where: str):
    """``value`` (a ``row_type``, or a plain tuple or list of its columns in order) as a
    ``row_type`` whose every column passes its rule (``Rule`` in the column's annotation, or
    a nested row type). Raises ``ValueError`` starting with ``where``: a row of the wrong
    number of columns (naming them), or the column at fault and its rule."""
    columns = row_type._fields
    if not isinstance(value, (tuple, list)) or len(value) != len(columns):
        got = f"{len(value)} columns " if isinstance(value, (tuple, list)) else ""
        raise ValueError(f"{where}: expected a row of {len(columns)} columns "
                         f"({row_type.__name__}: {', '.join(columns)}), got {got}{value!r}")
    out = []
    for column, v in zip(columns, value):
        rule = _column_rules(row_type)[column]
        if isinstance(rule, Rule):
            if not rule.test(v):
                raise ValueError(f"{where}: {column} must be {rule.text}, got {v!r} in "
                                 f"{tuple(value)!r}")
        else:
            v = as_row(rule, v, f"{where} {column}")
        out.append(v)
    return row_type(*out)
