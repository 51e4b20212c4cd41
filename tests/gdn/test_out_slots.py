"""Separate read and write slots (``out_state_indices``) in gdn_decode / gdn_chain and their plans.

The new state goes to ``out_state_indices[b]``; the read slot keeps its state (FlashInfer's
``output_state_indices``). Checked bitwise against in-place decoding of a copy, with every slot
that is neither written nor padding, and sentinel guards around the state buffer, untouched.
"""

from __future__ import annotations

import pytest
import torch

import pmll_lab  # noqa: F401  (first: picks GPU or the Triton interpreter)
from pmll_lab.backend import DEVICE
from pmll_lab.bench import bitwise_equal
from pmll_lab.gdn import gdn_chain, gdn_chain_plan, gdn_decode, gdn_decode_plan
from pmll_lab.inputs import gdn_inputs

S, HK, HV, KD, VD = 6, 1, 2, 16, 24
READ = [2, 0, 4, -1]            # lane 3 is padding
WRITE = [5, 0, 1, -1]           # lane 1 writes in place; lanes 0, 2 fork to slots 5, 1


def _idx(slots, dtype=torch.int32):
    return torch.tensor(slots, dtype=dtype, device=DEVICE)


def _guarded_state(seed, layout):
    st = gdn_inputs(seed, 1, HK, HV, KD, VD, slots=S, dtype=torch.float32,
                    state_layout="kv")["state"]
    st = st if layout == "kv" else st.transpose(-1, -2).contiguous()
    big = torch.full((S + 2, *st.shape[1:]), 777.0, device=DEVICE)
    big[1:-1] = st
    return big[1:-1], big


def _rows(K):
    x = gdn_inputs(61, len(READ), HK, HV, KD, VD, rows=K, dtype=torch.bfloat16, state_layout="kv")
    rows = [x[n] for n in ("q", "k", "v", "g", "beta")]
    return rows if K > 1 else [t[:, 0].contiguous() for t in rows]


def _expected(st0, rows, K, layout):
    """In-place decoding of the live lanes on a copy, then the new states moved to WRITE."""
    live = [i for i, s in enumerate(READ) if s >= 0]
    b = st0.clone()
    sel = [t[live].contiguous() for t in rows]
    idx = _idx([READ[i] for i in live])
    if K == 1:
        o = gdn_decode(b, *sel, state_indices=idx, state_layout=layout)
    else:
        o = gdn_chain(b, *sel, state_indices=idx, state_layout=layout)
    want = st0.clone()
    for i in live:
        want[WRITE[i]] = b[READ[i]]
    return o, want, live


@pytest.mark.parametrize("layout", ["kv", "vk"])
@pytest.mark.parametrize("K,plan", [(1, False), (3, False), (1, True), (3, True)])
def test_write_slots(layout, K, plan):
    st, big = _guarded_state(62, layout)
    st0 = st.clone()
    rows = _rows(K)
    kw = dict(state_indices=_idx(READ), out_state_indices=_idx(WRITE, torch.int64),
              validate=True, state_layout=layout)
    if K == 1:
        o = gdn_decode_plan(st, *rows, **kw)() if plan else gdn_decode(st, *rows, **kw)
    else:
        o = gdn_chain_plan(st, *rows, **kw)() if plan else gdn_chain(st, *rows, **kw)
    o_want, want, live = _expected(st0, rows, K, layout)
    assert bitwise_equal(o[live], o_want), "outputs"
    assert bool((o[3] == 0).all()), "padding lane outputs"
    assert bitwise_equal(st, want), "written slots hold the new states, every other slot as before"
    assert bitwise_equal(st[[2, 4, 3]], st0[[2, 4, 3]]), "read-only slots untouched"
    assert bool((big[0] == 777.0).all()) and bool((big[-1] == 777.0).all()), "guard written"


def test_chain_snapshots_with_write_slots():
    """Snapshots are per lane, whatever the write slot; the chain with write slots is the chain
    in place followed by a copy, bitwise (snapshots included)."""
    K = 3
    st, _ = _guarded_state(63, "vk")
    st0 = st.clone()
    rows = _rows(K)
    inter = torch.full((len(READ), K - 1, *st.shape[1:]), 5.0, device=DEVICE)
    gdn_chain(st, *rows, state_indices=_idx(READ), out_state_indices=_idx(WRITE),
              intermediate=inter, state_layout="vk")
    b = st0.clone()
    inter2 = torch.empty(3, K - 1, *st.shape[1:], device=DEVICE)
    gdn_chain(b, *[t[:3].contiguous() for t in rows], state_indices=_idx(READ[:3]),
              intermediate=inter2, state_layout="vk")
    assert bitwise_equal(inter[:3], inter2) and bool((inter[3] == 5.0).all())


def test_validate_refuses_cross_lane_overlaps():
    st, _ = _guarded_state(64, "kv")
    rows = _rows(1)
    bad = {
        "lane 0 writes a slot lane 1 reads": [0, 3, 1, -1],
        "two lanes write one slot": [5, 5, 1, -1],
        "write slot out of range": [6, 0, 1, -1],
        "padding in only one index": [5, 0, 1, 3],
        "live lane with a -1 write slot": [-1, 0, 1, -1],
    }
    for why, write in bad.items():
        before = st.clone()
        with pytest.raises(ValueError, match="out_state_indices"):
            gdn_decode(st, *rows, state_indices=_idx(READ), out_state_indices=_idx(write),
                       validate=True, state_layout="kv")
        assert bitwise_equal(st, before), why
    with pytest.raises(ValueError, match="out_state_indices"):
        gdn_decode(st, *rows, state_indices=_idx(READ), out_state_indices=_idx(WRITE[:3]),
                   state_layout="kv")
    with pytest.raises(ValueError, match="out_state_indices"):
        gdn_chain(st, *_rows(2), state_indices=_idx(READ),
                  out_state_indices=_idx(WRITE).float(), validate=True, state_layout="kv")
    # a write slot equal to the lane's own read slot, and swaps are fine only lane-to-itself
    gdn_decode(st, *rows, state_indices=_idx(READ), out_state_indices=_idx(READ), validate=True,
               state_layout="kv")
    with pytest.raises(ValueError, match="out_state_indices"):
        gdn_decode(st, *rows, state_indices=_idx(READ), out_state_indices=_idx([0, 2, 4, -1]),
                   validate=True, state_layout="kv")
