"""Bad input to the conv API is refused naming the argument (SPEC §3c).

``conv_update``, ``conv_chain``, ``conv_carry_verify``, ``conv_carry_flush`` and ``ConvCarry``
raise ``ValueError`` whose message starts with the argument's name (shapes, dtypes, devices,
strides, options, and with ``validate=True`` the slot and pending values) before any kernel
runs; the windows are left bitwise as they were.
"""

from __future__ import annotations

import pytest
import torch

import pmll_lab  # noqa: F401  (first: picks GPU or interpreter)
from pmll_lab.backend import DEVICE
from pmll_lab.bench import bitwise_equal
from pmll_lab.conv import (
    ConvCarry,
    conv_carry_flush,
    conv_carry_verify,
    conv_chain,
    conv_update,
)
from pmll_lab.inputs import conv_inputs


# ---- bad input --------------------------------------------------------------------------------

def _base(dtype=torch.float32, K=None):
    d = conv_inputs(100, 2, 64, rows=K, slots=4, dtype=dtype)
    return d


def _update_cases():
    d = _base()
    st, x, w, b, idx = d["conv_state"], d["x"], d["weight"], d["bias"], d["state_indices"]
    meta = torch.empty(2, 64, device="meta")
    return [
        ("conv_state", dict(conv_state=st[0])),
        ("conv_state", dict(conv_state=st.half(), x=x.half(), weight=w.half(), bias=b.half())),
        ("conv_state", dict(conv_state=st.to("meta"))),
        ("x", dict(x=x[:, :32])),
        ("x", dict(x=x.bfloat16())),
        ("x", dict(x=meta)),
        ("x", dict(x=torch.randn(64, 2).to(DEVICE).t())),
        ("weight", dict(weight=w[:32])),
        ("weight", dict(weight=w.bfloat16())),
        ("bias", dict(bias=b[:10])),
        ("conv_state", dict(weight=torch.randn(64, 6).to(DEVICE))),   # state_len 3 < 5
        ("activation", dict(activation="relu")),
        ("qk_channels", dict(qk_channels=48, head_dim=32)),
        ("head_dim", dict(qk_channels=32)),
        ("qk_channels", dict(qk_channels=128, head_dim=32)),
        ("l2_eps", dict(l2_eps=0.0)),
        ("l2_eps", dict(l2_eps=float("inf"))),
        ("l2_eps", dict(l2_eps=float("nan"))),
        ("l2_eps", dict(l2_eps="1e-6")),
        ("out_dtype", dict(out_dtype=torch.float16)),
        ("state_indices", dict(state_indices=idx.float())),
        ("state_indices", dict(state_indices=idx[:1])),
        ("state_indices", dict(state_indices=torch.tensor([1, 1], dtype=torch.int32).to(DEVICE),
                               validate=True)),
        ("state_indices", dict(state_indices=torch.tensor([0, 4], dtype=torch.int32).to(DEVICE),
                               validate=True)),
        ("state_indices", dict(state_indices=torch.tensor([-2, 2], dtype=torch.int32).to(DEVICE),
                               validate=True)),
        ("state_indices", dict(conv_state=st[:1])),                   # S < B, no indices
        ("state_indices", dict(conv_state=st[:1], state_indices=idx)),   # S < B with indices
        ("state_indices", dict(state_indices=[0, 1])),
        # read at offset b: a strided view [3, 1] of [3, 0, 1, 0] would address slots [3, 0]
        ("state_indices", dict(state_indices=torch.tensor([3, 0, 1, 0], dtype=torch.int32)
                               .to(DEVICE)[::2], validate=True)),
    ]


@pytest.mark.parametrize("name,override", _update_cases())
def test_update_bad_input(name, override):
    d = _base()
    args = dict(conv_state=d["conv_state"], x=d["x"], weight=d["weight"], bias=d["bias"])
    args.update(override)
    before = d["conv_state"].clone()
    with pytest.raises(ValueError, match=f"^{name}"):
        conv_update(args.pop("conv_state"), args.pop("x"), args.pop("weight"), args.pop("bias"),
                    **args)
    assert bitwise_equal(d["conv_state"], before)


def test_chain_bad_input():
    d = _base(K=3)
    st, x, w, b = d["conv_state"], d["x"], d["weight"], d["bias"]
    with pytest.raises(ValueError, match="^x"):
        conv_chain(st, torch.randn(2, 17, 64).to(DEVICE), w, b)
    with pytest.raises(ValueError, match="^x"):
        conv_chain(st, x[:, 0], w, b)
    with pytest.raises(ValueError, match="^intermediate"):
        conv_chain(st, x, w, b, intermediate=torch.empty(2, 3, 64, 3, device=DEVICE))
    with pytest.raises(ValueError, match="^intermediate"):
        conv_chain(st, x, w, b, intermediate=torch.empty(2, 2, 64, 3, dtype=torch.bfloat16,
                                                         device=DEVICE))
    with pytest.raises(ValueError, match="^state_indices"):
        conv_chain(st, x, w, b, state_indices=torch.tensor([3, 3], dtype=torch.int32).to(DEVICE),
                   validate=True)
    before = st.clone()
    with pytest.raises(ValueError, match="^state_indices"):
        conv_chain(st, x, w, b, state_indices=torch.tensor([1, 0, 2, 0]).to(DEVICE)[::2],
                   validate=True)
    assert bitwise_equal(st, before)


def test_carry_bad_input():
    d = _base(K=3)
    st, x, w, b = d["conv_state"], d["x"], d["weight"], d["bias"]
    slot_tab = torch.tensor([2, 0], dtype=torch.int32, device=DEVICE)
    carry = ConvCarry.empty(4, 64, cap=4, dtype=torch.float32)

    def verify(**kw):
        args = dict(conv_state=st, conv_carry=carry, x=x, weight=w, bias=b, slot_tab=slot_tab)
        args.update(kw)
        return conv_carry_verify(args.pop("conv_state"), args.pop("conv_carry"), args.pop("x"),
                                 args.pop("weight"), args.pop("bias"), **args)

    with pytest.raises(ValueError, match="^x"):           # K > CAP
        verify(conv_carry=ConvCarry.empty(4, 64, cap=2, dtype=torch.float32))
    with pytest.raises(ValueError, match="^conv_carry"):
        verify(conv_carry=ConvCarry.empty(4, 64, cap=4, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="^conv_carry"):
        verify(conv_carry=ConvCarry.empty(4, 32, cap=4, dtype=torch.float32))
    with pytest.raises(ValueError, match="^conv_carry"):
        verify(conv_carry=ConvCarry.empty(3, 64, cap=4, dtype=torch.float32))
    with pytest.raises(ValueError, match="^conv_carry"):
        verify(conv_carry=(carry.stash, carry.pend))
    with pytest.raises(ValueError, match="^slot_tab"):
        verify(slot_tab=slot_tab[:1])
    with pytest.raises(ValueError, match="^slot_tab"):
        verify(slot_tab=slot_tab.float())
    with pytest.raises(ValueError, match="^slot_tab"):    # strided view of [2, 0, 1, 0]
        verify(slot_tab=torch.tensor([2, 0, 1, 0], dtype=torch.int32, device=DEVICE)[::2],
               validate=True)
    with pytest.raises(ValueError, match="^slot_tab"):    # more sequences than slots
        verify(conv_state=st[:1], conv_carry=ConvCarry.empty(1, 64, cap=4, dtype=torch.float32))
    with pytest.raises(ValueError, match="^lazy"):
        verify(lazy="yes")
    with pytest.raises(ValueError, match="^x"):
        verify(x=x.bfloat16())
    with pytest.raises(ValueError, match="^slot_tab"):
        verify(slot_tab=torch.tensor([1, 1], dtype=torch.int32, device=DEVICE), validate=True)
    with pytest.raises(ValueError, match="^slot_tab"):
        verify(slot_tab=torch.tensor([1, 4], dtype=torch.int32, device=DEVICE), validate=True)
    carry.pend[2] = 5
    with pytest.raises(ValueError, match="^conv_carry.pend"):
        verify(validate=True)
    carry.pend[2] = -1
    with pytest.raises(ValueError, match="^conv_carry.pend"):
        verify(validate=True)
    carry.pend.zero_()
    carry.pend[3] = 9          # slot 3 is not in the batch: not read, not checked (as in GDN)
    verify(validate=True)
    assert int(carry.pend[3]) == 9
    with pytest.raises(ValueError, match="^stash"):
        ConvCarry(torch.zeros(4, 4, 64, dtype=torch.float16), torch.zeros(4, dtype=torch.int32))
    with pytest.raises(ValueError, match="^pend"):
        ConvCarry(torch.zeros(4, 4, 64), torch.zeros(4, dtype=torch.int64))
    with pytest.raises(ValueError, match="^pend"):     # carry_accept reads pend at stride 1
        ConvCarry(torch.zeros(4, 4, 64), torch.zeros(8, dtype=torch.int32)[::2])
    carry.pend.zero_()
    carry.stash.fill_(2.0)
    for slots in ([4], [-1], 9, [0.5], "ab", None, torch.tensor([0.0])):
        with pytest.raises(ValueError, match="^slots"):
            carry.reset(slots)
    assert int(carry.pend.abs().sum()) == 0 and bool((carry.stash == 2.0).all())
    with pytest.raises(ValueError, match="^device"):
        ConvCarry.empty(4, 64, device="bogus")
    with pytest.raises(ValueError, match="^dtype"):
        ConvCarry.empty(4, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match="^cap"):
        ConvCarry.empty(4, 64, cap=0)


def test_flush_bad_input():
    d = _base()
    st = d["conv_state"]
    slot_tab = torch.tensor([2, 0], dtype=torch.int32, device=DEVICE)
    c = ConvCarry.empty(4, 64, dtype=torch.float32)
    c2 = ConvCarry.empty(4, 64, dtype=torch.float32)
    with pytest.raises(ValueError, match="^conv_states"):
        conv_carry_flush([], [], slot_tab)
    with pytest.raises(ValueError, match="^conv_carries"):
        conv_carry_flush([st, st.clone()], [c], slot_tab)
    with pytest.raises(ValueError, match=r"^conv_states\[1\]"):
        conv_carry_flush([st, st[:, :32].clone()], [c, c2], slot_tab)
    with pytest.raises(ValueError, match=r"^conv_states\[1\]"):
        conv_carry_flush([st, st.transpose(1, 2).contiguous().transpose(1, 2)], [c, c2], slot_tab)
    with pytest.raises(ValueError, match=r"^conv_carries\[1\]"):
        conv_carry_flush([st, st.clone()], [c, ConvCarry.empty(4, 64, dtype=torch.bfloat16)],
                         slot_tab)
    with pytest.raises(ValueError, match="^slot_tab"):
        conv_carry_flush([st], [c], [2, 0])
    with pytest.raises(ValueError, match="^slot_tab"):    # strided view of [2, 0, 1, 0]
        conv_carry_flush([st], [c], torch.tensor([2, 0, 1, 0], device=DEVICE)[::2])
    with pytest.raises(ValueError, match="^slot_tab"):    # 6 sequences, 4 slots
        conv_carry_flush([st], [c], torch.arange(6, device=DEVICE))
    with pytest.raises(ValueError, match="^slot_tab"):
        conv_carry_flush([st], [c], torch.tensor([1, 1], dtype=torch.int32, device=DEVICE),
                         validate=True)
    c2.pend[0] = 9
    with pytest.raises(ValueError, match=r"^conv_carries\[1\].pend"):
        conv_carry_flush([st, st.clone()], [c, c2], slot_tab, validate=True)


@pytest.mark.parametrize("validate", [None, 0, "no"])
def test_validate_must_be_a_bool_in_every_conv_launcher(validate):
    """``validate=None`` used to skip the checks and ``"no"`` to run them: every launcher
    (and ``gdn_carry_flush``) refuses a non-bool, naming it, before any launch."""
    from pmll_lab.carry import GdnCarry, gdn_carry_flush
    from pmll_lab.inputs import gdn_inputs

    d, dk = _base(), _base(K=2)
    c = ConvCarry.empty(4, 64, dtype=torch.float32)
    before = d["conv_state"].clone()
    calls = [
        lambda: conv_update(d["conv_state"], d["x"], d["weight"], d["bias"],
                            state_indices=d["state_indices"], validate=validate),
        lambda: conv_chain(dk["conv_state"], dk["x"], dk["weight"], dk["bias"],
                           state_indices=dk["state_indices"], validate=validate),
        lambda: conv_carry_verify(dk["conv_state"], c, dk["x"], dk["weight"], dk["bias"],
                                  slot_tab=dk["state_indices"], validate=validate),
        lambda: conv_carry_flush([d["conv_state"]], [c], d["state_indices"], validate=validate),
    ]
    g = gdn_inputs(1, 2, 1, 2, 16, 16, slots=4, dtype=torch.float32)
    carry = GdnCarry.empty(4, 2, 16, 16, cap=4, state_layout="vk")
    calls.append(lambda: gdn_carry_flush([g["state"]], [carry], g["state_indices"],
                                         validate=validate))
    for call in calls:
        with pytest.raises(ValueError, match=r"^validate: expected a bool"):
            call()
    assert bitwise_equal(d["conv_state"], before)


def test_conv_inputs_make_what_conv_update_takes_at_every_width():
    """``d_conv = 1`` keeps a one-column window (``max(1, d_conv - 1)``), as ``conv_update``
    requires; the update then matches the float64 reference."""
    from pmll_lab.reference.conv import conv_update as ref_update

    d = conv_inputs(7, 2, 32, d_conv=1, dtype=torch.float32)
    assert d["conv_state"].shape == (2, 32, 1)
    st = d["conv_state"].double().cpu()
    want = ref_update(st, d["x"].double().cpu(), d["weight"].double().cpu(),
                      d["bias"].double().cpu(), state_indices=d["state_indices"].cpu())
    got = conv_update(d["conv_state"], d["x"], d["weight"], d["bias"],
                      state_indices=d["state_indices"])
    y_ref, st_ref = want
    assert torch.allclose(got.double().cpu(), y_ref, rtol=1e-5, atol=1e-6)
    assert torch.allclose(d["conv_state"].double().cpu(), st_ref, rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match=r"^state_len: must be >= max\(1, d_conv - 1\) = 2"):
        conv_inputs(7, 2, 32, d_conv=3, state_len=1)


def test_conv_carry_dtype_message_and_numpy_sizes():
    """A str dtype and NumPy sizes (which would reach a kernel's size argument as NumPy
    values and fail there) are refused, each naming its argument and the fix."""
    import numpy as np

    with pytest.raises(ValueError, match=r"^dtype: must be torch.float32 or torch.bfloat16, "
                                         r"got 'bfloat16'"):
        ConvCarry.empty(3, 32, dtype="bfloat16")
    with pytest.raises(ValueError, match=r"^slots: expected an int, got int64 \(a NumPy "
                                         r"integer: pass int\(slots\)\)"):
        ConvCarry.empty(np.int64(3), 32, dtype=torch.float32)
    d = _base()
    with pytest.raises(ValueError, match=r"^qk_channels: expected an int, got int64"):
        conv_update(d["conv_state"], d["x"], d["weight"], d["bias"],
                    state_indices=d["state_indices"], qk_channels=np.int64(32), head_dim=16)
