"""Launch settings as data (``pmll_lab.ops.settings``): the tables, their pointers, the one
override context, and the launchers reading the active values (plans when they are made)."""

from __future__ import annotations

import inspect
import re

import pytest
import torch

import pmll_lab  # noqa: F401  (first: picks GPU or the Triton interpreter)
from pmll_lab.backend import DEVICE
from pmll_lab.bench import bitwise_equal
from pmll_lab.carry import (GDN_CARRY_CAP, GdnCarry, carry_accept, gdn_carry_verify,
                            gdn_carry_verify_plan)
from pmll_lab.conv import conv_block_config
from pmll_lab.gdn import gdn_chain, gdn_chain_plan, gdn_decode
from pmll_lab.inputs import gdn_inputs
from pmll_lab.ops import settings
from pmll_lab.ops.carry.exact_kernels import gdn_carry_exact_kernel, gdn_carry_exact_split_kernel
from pmll_lab.ops.gdn import decode as D
from pmll_lab.ops.gdn import recurrence
from pmll_lab.ops.pmll import ring
from pmll_lab.ops.pmll.ring_attention import tile_for
from _paths import ROOT


def test_every_setting_has_a_reason_and_a_pointer_that_resolves():
    """Each row names the measurement behind it (one line) and where it is recorded: a section
    of the current perf-notes that exists, the archive sections it names exist (the
    chronological log), and any file it names exists."""
    def headers(name):
        text = (ROOT / "reports" / name).read_text()
        return [line for line in text.splitlines() if line.startswith("## ")]

    notes, archive = headers("perf-notes.md"), headers("perf-notes-archive.md")
    rows = settings.describe()
    assert len(rows) == len({r["name"] for r in rows}) >= 19
    for r in rows:
        see = r["see"]
        assert r["why"] and "\n" not in r["why"] and see, r["name"]
        assert r["value"] == r["shipped"], f"{r['name']}: not the shipped value outside override"
        for v in re.findall(r"perf-notes v(\d+)", see):   # old-style pointers: none left
            assert any(h.startswith(f"## v{v}:") for h in notes), f"{r['name']}: no v{v}"
        for title in re.findall(r"perf-notes '([^']+)'", see):
            assert f"## {title}" in notes, f"{r['name']}: {title}"
        for vs in re.findall(r"archive (v\d+(?:, v\d+)*)", see):
            for v in re.findall(r"v(\d+)", vs):
                assert any(h.startswith(f"## v{v}:") for h in archive), \
                    f"{r['name']}: no archive v{v}"
        for title in re.findall(r"archive '([^']+)'", see):
            assert any(h.startswith(f"## {title}") for h in archive), f"{r['name']}: {title}"
        if "archive" in see or "reports/" in see:
            assert "perf-notes '" in see, f"{r['name']}: measured, but no current section named"
        for path in re.findall(r"(?:reports|notebooks)/[\w./-]+\.(?:log|ipynb)", see):
            assert (ROOT / path).exists(), f"{r['name']}: {path} missing"


def test_shipped_values_are_the_measured_ones():
    """The values the launches compiled with before the tables existed (any change here changes
    constexprs, so it needs a measurement and a bitwise run)."""
    g, c, v, r, a = (settings.SHIPPED[f] for f in ("gdn", "carry", "conv", "ring", "attention"))
    assert g.kv_block is None and g.vk_chunk == 32 and g.vk_qk_hint is True
    assert g.vk_tiles == ((128, 8, 8, 1), (1 << 62, 8, 16, 1))
    assert g.vk_rows_half == ((256, 8), (1 << 62, 16))
    assert settings.SHIPPED["ring_form"].ring_fold_chunk == 32
    assert settings.SHIPPED["ring_form"].ring_coefficients_first == 2
    assert g.vk_ahead == ((32, 4, 4, 4, 8), (512, 4, 4, 4, 4), (1 << 62, 0, 2, 1, 4))
    assert g.chain_unroll_max_rows == 4 and g.default_state_layout == "vk"
    assert (c.exact_split_columns, c.exact_unroll_max_rows, c.carry_prefetch_rows,
            c.accept_block) == (True, 8, True, 128)
    assert c.exact_unroll_max_rows == GDN_CARRY_CAP
    assert (v.conv_block_channels, v.conv_num_warps, v.conv_row_width) == (256, 2, 64)
    assert (r.ring_tile_elems, r.ring_num_warps) == (8192, 8)
    assert dict(a.attention_tiles) == {(64, 2): (64, 64, 4, 3), (128, 2): (64, 64, 4, 3),
                                       (64, 4): (32, 16, 4, 2), (128, 4): (32, 16, 4, 2)}
    assert a.attention_default_tile == (64, 32, 4, 2)


def test_import_time_settings_are_what_the_modules_bound():
    assert bool(recurrence.FMA_SUMS) == settings.gdn().fma_sums
    assert recurrence.DEFAULT_STATE_LAYOUT == settings.gdn().default_state_layout
    for fn in (gdn_decode, gdn_chain, gdn_carry_verify):
        assert inspect.signature(fn).parameters["state_layout"].default == "vk"


def test_override_nests_and_restores_also_after_an_error():
    shipped = settings.gdn()
    with settings.override(vk_chunk=16, carry_prefetch_rows=False):
        assert settings.gdn().vk_chunk == 16 and settings.carry().carry_prefetch_rows is False
        assert recurrence.vk_chunks(64) == (4, 16)
        with settings.override(vk_chunk=64, vk_tiles=[(1 << 62, 4, 4, 1)]):
            assert recurrence.vk_chunks(128) == (2, 64)
            assert settings.gdn().vk_tiles == ((1 << 62, 4, 4, 1),), "lists become tuples"
        assert settings.gdn().vk_chunk == 16 and settings.gdn().vk_tiles == shipped.vk_tiles
        assert settings.carry().carry_prefetch_rows is False
    assert settings.gdn() is shipped and settings.carry().carry_prefetch_rows is True
    with pytest.raises(RuntimeError, match="inside"), settings.override(ring_num_warps=4):
        raise RuntimeError("inside")
    assert settings.ring().ring_num_warps == 8
    assert all(r["value"] == r["shipped"] for r in settings.describe())


@pytest.mark.parametrize("changes, named", [
    (dict(vk_tiles_typo=1, vk_chunk=16), "vk_tiles_typo"),
    (dict(fma_sums=False), "fma_sums"),
    (dict(default_state_layout="vk"), "default_state_layout"),
    (dict(vk_chunk=24), "vk_chunk"),
    (dict(vk_qk_hint=1), "vk_qk_hint"),
    (dict(chain_unroll_max_rows=-1), "chain_unroll_max_rows"),
    (dict(kv_block=(12, 1)), "kv_block"),
    (dict(vk_ahead=((1 << 62, 4, 4, 4),)), "vk_ahead"),
    (dict(vk_tiles=()), "vk_tiles"),
    (dict(attention_tiles={(64, 2): (64, 64, 4)}), "attention_tiles"),
    (dict(attention_default_tile=(64, 32, 0, 2)), "attention_default_tile"),
    (dict(ring_fold_chunk=8), "ring_fold_chunk"),
    (dict(ring_fold_chunk=24), "ring_fold_chunk"),
    (dict(vk_rows_half=((1 << 62, 16, 1),)), "vk_rows_half"),
    (dict(vk_rows_half=((1 << 62, 12),)), "vk_rows_half"),       # arange needs a power of two
    (dict(vk_rows_half=((1 << 62, 1),)), "vk_rows_half"),        # one row: another layout
    (dict(vk_tiles=((1 << 62, 1, 16, 1),)), "vk_tiles"),
    (dict(vk_tiles=((1 << 62, 8, 16, 3),)), "vk_tiles"),
    (dict(ring_form_tiles=((1 << 62, 2, 0, 64, 2, 2),)), "ring_form_tiles"),     # BV 0
    (dict(ring_form_tiles=((1 << 62, 2, 100, 64, 2, 2),)), "ring_form_tiles"),   # not a power
    (dict(ring_form_tiles=((1 << 62, 2, 128, 8, 2, 2),)), "ring_form_tiles"),    # BK < 16
    (dict(ring_form_tiles=((1 << 62, 2, 128, 64, 0, 2),)), "ring_form_tiles"),   # no warps
    (dict(ring_form_tiles=((1 << 62, 2, 128, 64, 2, 0),)), "ring_form_tiles"),   # no stages
    (dict(ring_coefficients_first=-1), "ring_coefficients_first"),
])
def test_override_refuses_bad_names_and_values_before_changing_anything(changes, named):
    with pytest.raises(ValueError, match=f"^{named}:"):
        with settings.override(**changes):
            pytest.fail("the block must not run")
    assert all(r["value"] == r["shipped"] for r in settings.describe())


def test_table_rows_have_named_columns_and_plain_tuples_become_rows():
    """Every table holds rows of its row type, shipped or overridden with plain tuples (or
    lists); a row of the wrong width is refused naming the setting, the row and the columns."""
    g, a = settings.SHIPPED["gdn"], settings.SHIPPED["attention"]
    for rows, row_type in ((g.vk_tiles, settings.VkTile), (g.vk_rows_half, settings.VkRowsHalf),
                           (g.vk_ahead, settings.VkAhead),
                           (a.attention_tiles, settings.AttentionTileRow),
                           (settings.SHIPPED["ring_form"].ring_form_tiles,
                            settings.RingFormTile)):
        assert rows and all(type(r) is row_type for r in rows), row_type
    assert type(a.attention_default_tile) is settings.AttentionTile
    with settings.override(vk_tiles=[[1 << 62, 4, 4, 1]], kv_block=(16, 2),
                           attention_tiles={(64, 2): (32, 32, 2, 2)}):
        (tile,) = settings.gdn().vk_tiles
        assert type(tile) is settings.VkTile and tile.carry_value_rows == 4
        assert settings.gdn().kv_block.block_v == 16
        (row,) = settings.attention().attention_tiles
        assert row.case.block_d == 64 and row.tile.num_warps == 2
    with pytest.raises(ValueError, match=r"^vk_ahead: row 1: expected a row of 5 columns "
                                         r"\(VkAhead: max_work, rows_ahead, "):
        with settings.override(vk_ahead=((32, 4, 4, 4, 8), (1 << 62, 0, 2, 4))):
            pass
    with pytest.raises(ValueError, match=r"^vk_tiles: row 0: num_warps must be a power of two"):
        with settings.override(vk_tiles=((1 << 62, 8, 16, 3),)):
            pass


def test_lookups_refuse_a_state_dtype_without_rows():
    """A state dtype the tables have no rows for (a 1-byte float8, float64) is refused with
    the argument named, never given another dtype's settings (a float8 state would otherwise
    take the 2-byte columns by its size); the supported ones take their rows."""
    from pmll_lab.ops.carry.ring import ring_tiles

    assert set(settings.STATE_DTYPES) == {"float32", "bfloat16", "float16"}
    for bad in (torch.float8_e4m3fn, "float8_e5m2", torch.float64):
        with pytest.raises(ValueError, match="^state_dtype: .* has no rows"):
            recurrence.vk_config(64, 64, 8, state_dtype=bad)
        with pytest.raises(ValueError, match="^state_dtype: "):
            recurrence.vk_config(64, 64, 8, "carry", state_dtype=bad)
        with pytest.raises(ValueError, match="^state_dtype: "):
            settings.vk_ahead_row(8).verify_rows_ahead(bad)
        with pytest.raises(ValueError, match="^state_dtype: "):
            ring_tiles(8, bad, 64, 64)
    assert recurrence.vk_config(64, 64, 1 << 20, state_dtype=torch.float16)[1] == 16
    assert recurrence.vk_config(64, 64, 1 << 20, state_dtype="bfloat16")[1] == 16
    assert recurrence.vk_config(64, 64, 1 << 20, state_dtype=torch.float32)[1] == 8
    assert ring_tiles(1, torch.float32, 64, 64) == (64, 32, 2, 3)
    assert ring_tiles(1, torch.float16, 64, 64) == (64, 32, 2, 4)


def test_launchers_read_the_active_settings():
    """Each family's launch arguments follow an override and come back after it."""
    assert recurrence.block_config(64, 64) == (64, 64, 1)
    with settings.override(kv_block=(16, 2)):
        assert recurrence.block_config(64, 64) == (64, 16, 2)
    assert recurrence.block_config(64, 64) == (64, 64, 1)
    assert recurrence.vk_config(128, 128, 1 << 20, "carry", state_dtype="float32") == (128, 16, 1)
    with settings.override(vk_tiles=((1 << 62, 8, 4, 1),)):
        assert recurrence.vk_config(128, 128, 1 << 20, "carry",
                                    state_dtype="float32") == (128, 4, 1)
    assert settings.vk_ahead_row(1).verify_rows_ahead(torch.float32) == 4
    assert settings.vk_ahead_row(1).stash_rows_ahead == 8
    with settings.override(vk_ahead=((1 << 62, 1, 2, 3, 5),)):
        row = settings.vk_ahead_row(1)
        assert (row.verify_rows_ahead(torch.bfloat16), row.stash_rows_ahead) == (3, 5)
    assert conv_block_config(512, None) == (64, 64, 4, 2)
    with settings.override(conv_block_channels=128, conv_num_warps=4, conv_row_width=32):
        assert conv_block_config(512, None) == (32, 32, 4, 4)
    assert ring.ring_tile(128, 1000) == (64, 128)
    with settings.override(ring_tile_elems=2048):
        assert ring.ring_tile(128, 1000) == (16, 128)
    assert tile_for(64, torch.bfloat16, 4096)["num_stages"] == 3
    with settings.override(attention_tiles=(((64, 2), (32, 32, 2, 2)),)):
        t = tile_for(64, torch.bfloat16, 4096)
        assert (t["BLOCK_M"], t["BLOCK_N"], t["num_warps"], t["num_stages"]) == (32, 32, 2, 2)
        assert tile_for(128, torch.bfloat16, 4096)["BLOCK_N"] == 32, "default tile when missing"

    x = gdn_inputs(3, 2, 1, 2, 32, 16, rows=3, slots=3, dtype=torch.float32, state_layout="kv")
    carry = GdnCarry.empty(3, 2, 32, 16, state_layout="kv")

    def verify_plan():        # the launch a verify makes, read off its plan (launches nothing)
        return gdn_carry_verify_plan(x["state"], carry, x["q"], x["k"], x["v"], x["g"],
                                     x["beta"], slot_tab=x["state_indices"], lazy=True,
                                     scale=1.0, state_layout="kv")

    plan = verify_plan()
    assert plan.kernel is gdn_carry_exact_split_kernel
    assert plan.kwargs["PREFETCH"] and plan.kwargs["UNROLL"]
    with settings.override(exact_split_columns=False, carry_prefetch_rows=False,
                           exact_unroll_max_rows=2):
        plan = verify_plan()
        assert plan.kernel is gdn_carry_exact_kernel
        assert not plan.kwargs["PREFETCH"] and not plan.kwargs["UNROLL"]


def test_a_plan_keeps_the_settings_it_was_made_with():
    """``LaunchPlan`` reads the settings when it is made: a chain plan made under a runtime row
    loop keeps it after the override ends, and gives the unrolled launch's bits."""
    x = gdn_inputs(5, 2, 1, 2, 32, 16, rows=3, slots=3, dtype=torch.bfloat16, state_layout="kv")
    rows = [x[n] for n in ("q", "k", "v", "g", "beta")]
    a, b = x["state"].clone(), x["state"].clone()
    with settings.override(chain_unroll_max_rows=0):
        plan = gdn_chain_plan(a, *rows, state_indices=x["state_indices"], state_layout="kv")
    assert plan.kwargs["UNROLL"] is False
    assert gdn_chain_plan(b.clone(), *rows, state_indices=x["state_indices"],
                          state_layout="kv").kwargs["UNROLL"]
    o_plan = plan().clone()
    o = gdn_chain(b, *rows, state_indices=x["state_indices"], state_layout="kv")
    assert bitwise_equal(o_plan, o) and bitwise_equal(a, b)
    assert plan.kwargs["UNROLL"] is False


def test_accept_block_changes_the_grid_not_the_counts():
    """``accept_block`` smaller than the batch: several programs, the same ``pend`` update."""
    S, B = 9, 7
    gen = torch.Generator().manual_seed(8)
    slots = torch.randperm(S, generator=gen)[:B].to(torch.int32).to(DEVICE)
    eng = torch.randint(1, 3, (B,), generator=gen, dtype=torch.int32).to(DEVICE)
    acc = torch.randint(0, 4, (B,), generator=gen, dtype=torch.int32).to(DEVICE)
    start = torch.randint(0, 4, (S,), generator=gen, dtype=torch.int32).to(DEVICE)
    want = start.clone()
    for s, e_, a_ in zip(slots.tolist(), eng.tolist(), acc.tolist()):
        want[s] = a_ if e_ == 2 else want[s] + a_
    for block in (128, 2):
        c = GdnCarry.empty(S, 1, 16, 16)
        c.pend.copy_(start)
        with settings.override(accept_block=block):
            carry_accept(c, slots, eng, acc, rows=3)
        assert torch.equal(c.pend, want), block


OLD_GLOBALS = ("VK_TILES", "VK_AHEAD", "VK_CHUNK", "VK_QK_HINT", "CARRY_PREFETCH_ROWS",
               "EXACT_SPLIT_COLUMNS", "EXACT_UNROLL_MAX_ROWS", "CHAIN_UNROLL_MAX_ROWS",
               "ACCEPT_BLOCK", "TILE_ELEMS", "BLOCK_CHANNELS", "DEFAULT_ROW_WIDTH", "TILES",
               "DEFAULT_TILE", "block_config_override")


def test_no_script_or_test_sets_a_launch_setting_as_a_module_global():
    """The launchers read ``settings``, so assigning the old globals would change nothing:
    neither they nor a monkeypatch of them may come back."""
    from pmll_lab.ops.carry import exact, exact_kernels, stash
    from pmll_lab.ops.conv import common
    from pmll_lab.ops.pmll import ring_attention

    for mod in (recurrence, D, exact, exact_kernels, stash, common, ring,
                ring_attention):
        assert not [n for n in OLD_GLOBALS if hasattr(mod, n)], mod.__name__
    names = "|".join(OLD_GLOBALS + ("NUM_WARPS",))
    assign = re.compile(rf"\.({names})\s*(,[^=\n]*)?=(?!=)|setattr\([^)]*[\"']({names})[\"']")
    found = [f"{p.relative_to(ROOT)}:{n + 1}" for p in sorted((ROOT / "scripts").glob("*.py"))
             + sorted((ROOT / "tests").rglob("*.py"))
             for n, line in enumerate(p.read_text().splitlines()) if assign.search(line)]
    assert not found, f"module-global launch settings set in: {found}"


def test_parse_overrides_reads_literals_and_refuses_the_rest():
    """``NAME=VALUE`` strings of the scripts' ``--set`` flags: literals parsed, every value
    checked as ``override`` checks it, and nothing active changed."""
    over = settings.parse_overrides(["ring_fold_chunk=16",
                                     "ring_form_tiles=((8, 2, 64, 32, 2, 2),)"])
    assert over == {"ring_fold_chunk": 16, "ring_form_tiles": ((8, 2, 64, 32, 2, 2),)}
    for items, named in ((["ring_fold_chunk"], "is not NAME=VALUE"),
                         ([""], "is not NAME=VALUE"), (["=4"], "is not NAME=VALUE"),
                         (["ring_fold_chunk=1 << 4"], "VALUE is not a Python literal"),
                         (["ring_fold_chunk=16", "ring_fold_chunk=32"],
                          "ring_fold_chunk given twice"),
                         (["ring_fold_chunk=24"], "^ring_fold_chunk:"),
                         (["no_such=1"], "not a launch setting")):
        with pytest.raises(ValueError, match=named):
            settings.parse_overrides(items)
    assert all(r["value"] == r["shipped"] for r in settings.describe())
