"""Bad input to ``gdn_decode`` and ``gdn_chain`` is refused naming the argument (SPEC §2).

Shapes, dtypes, devices, strides, head ratios, K outside 1..8, and with ``validate=True`` the
values (duplicate, negative or out-of-range slots, positive log decays, beta outside [0, 1] or
NaN) raise ``ValueError`` whose message starts with ``<argument>:`` before any kernel runs; the
state is left bitwise as it was. K = 8 itself runs.
"""

from __future__ import annotations

import re

import pytest
import torch

import pmll_lab  # noqa: F401  (first: picks GPU or the Triton interpreter)
from pmll_lab.backend import DEVICE
from pmll_lab.bench import bitwise_equal
from pmll_lab.gdn import gdn_chain, gdn_decode
from pmll_lab.inputs import gdn_inputs


# ---- bad input ---------------------------------------------------------------------------------

def _good(rows=None, dtype=torch.bfloat16):
    B, HK, HV, kd, vd = 2, 1, 2, 16, 16
    x = gdn_inputs(71, B, HK, HV, kd, vd, rows=rows, slots=4, dtype=dtype, state_layout="kv")
    if rows is not None:
        x["intermediate"] = torch.empty(B, rows - 1, HV, kd, vd, device=DEVICE)
    return x


def _call(x, rows, **kw):
    args = dict(state_indices=x["state_indices"], validate=True, state_layout="kv")
    if rows is not None:
        args["intermediate"] = x.get("intermediate")
    args.update(kw)
    fn = gdn_decode if rows is None else gdn_chain
    return fn(x["state"], x["q"], x["k"], x["v"], x["g"], x["beta"], **args)


def _bad_cases():
    # (name, rows, mutate(x) -> kwargs override or None, argument named)
    def setx(key, fn):
        def m(x):
            x[key] = fn(x)
        return m

    cases = [
        ("q ndim", None, setx("q", lambda x: x["q"][None]), "q"),
        ("k shape", None, setx("k", lambda x: x["k"][:, :, :8]), "k"),
        ("kd vs state", None, lambda x: (x.__setitem__("q", x["q"][..., :8]),
                                         x.__setitem__("k", x["k"][..., :8])), "q"),
        ("v head size", None, setx("v", lambda x: x["v"][..., :8]), "v"),
        ("v heads", None, setx("v", lambda x: x["v"][:, :1]), "v"),
        ("g shape", None, setx("g", lambda x: x["g"][:, :1]), "g"),
        ("beta dtype", None, setx("beta", lambda x: x["beta"].bfloat16()), "beta"),
        ("g dtype", 2, setx("g", lambda x: x["g"].double()), "g"),
        ("HV % HK", None, lambda x: x.update(gdn_inputs(72, 2, 2, 3, 16, 16, slots=4,
                                                        state_layout="kv")), "q"),
        ("K > 8", 9, None, "q"),
        ("k dtype", None, setx("k", lambda x: x["k"].float()), "k"),
        ("v dtype", 2, setx("v", lambda x: x["v"].half()), "v"),
        ("q int dtype", None, lambda x: [x.__setitem__(n, x[n].to(torch.int32))
                                         for n in ("q", "k", "v")], "q"),
        ("state dtype", None, setx("state", lambda x: x["state"].double()), "state"),
        ("state ndim", None, setx("state", lambda x: x["state"][0]), "state"),
        ("indices dtype", None, setx("state_indices", lambda x: x["state_indices"].float()),
         "state_indices"),
        ("indices shape", 2, setx("state_indices", lambda x: x["state_indices"][:1]),
         "state_indices"),
        ("q device", None, setx("q", lambda x: torch.empty(x["q"].shape, dtype=x["q"].dtype,
                                                           device="meta")), "q"),
        ("indices device", 2, setx("state_indices",
                                   lambda x: torch.empty(2, dtype=torch.int32, device="meta")),
         "state_indices"),
        ("q last dim strided", None,
         setx("q", lambda x: torch.repeat_interleave(x["q"], 2, -1)[..., ::2]), "q"),
        ("v last dim strided", 3,
         setx("v", lambda x: torch.repeat_interleave(x["v"], 2, -1)[..., ::2]), "v"),
        ("state last dim strided", None,
         setx("state", lambda x: x["state"].transpose(2, 3)), "state"),
        ("intermediate shape", 3, setx("intermediate", lambda x: x["intermediate"][:, :1]),
         "intermediate"),
        ("intermediate dtype", 3, setx("intermediate", lambda x: x["intermediate"].bfloat16()),
         "intermediate"),
        ("intermediate strided", 3,
         setx("intermediate", lambda x: x["intermediate"].transpose(3, 4)), "intermediate"),
        # a written buffer whose elements share memory: the kernel would write over itself
        ("state expanded over slots", None,
         setx("state", lambda x: x["state"][:1].expand(x["state"].shape)), "state"),
        ("state rows overlapping", 2, setx("state", lambda x: x["state"].as_strided(
            x["state"].shape, (x["state"].stride(0), x["state"].stride(1),
                               x["state"].shape[3] // 2, 1))), "state"),
        ("intermediate batch stride 0", 3, setx("intermediate", lambda x: x["intermediate"][:1]
                                               .expand(x["intermediate"].shape)),
         "intermediate"),
        ("duplicate indices", 2,
         setx("state_indices", lambda x: x["state_indices"][:1].repeat(2)), "state_indices"),
        ("index out of range", None,
         setx("state_indices", lambda x: torch.tensor([0, 4], dtype=torch.int32, device=DEVICE)),
         "state_indices"),
        ("negative index", 2,
         setx("state_indices", lambda x: torch.tensor([-2, 1], dtype=torch.int32, device=DEVICE)),
         "state_indices"),
        ("g positive", 2, setx("g", lambda x: x["g"].abs() + 0.1), "g"),
        ("beta > 1", None, setx("beta", lambda x: x["beta"] + 1.0), "beta"),
        ("beta NaN", 2, setx("beta", lambda x: x["beta"] * float("nan")), "beta"),
        # the kernel reads entry b at offset b: a strided view [3, 1] of [3, 0, 1, 0] would
        # address slots [3, 0] (passes validate); rejected for its strides
        ("indices strided", None, setx("state_indices", lambda x: torch.tensor(
            [3, 0, 1, 0], dtype=torch.int32, device=DEVICE)[::2]), "state_indices"),
        ("indices strided chain", 3, setx("state_indices", lambda x: torch.tensor(
            [1, 0, 3, 0], dtype=torch.int32, device=DEVICE)[::2]), "state_indices"),
        ("indices list", None, setx("state_indices", lambda x: [0, 1]), "state_indices"),
        ("more sequences than slots", 2, setx("state", lambda x: x["state"][:1]),
         "state_indices"),
        ("kd zero", None, lambda x: x.update(state=x["state"][:, :, :0], q=x["q"][..., :0],
                                             k=x["k"][..., :0]), "state"),
        ("vd zero", 2, lambda x: x.update(state=x["state"][..., :0], v=x["v"][..., :0],
                                          intermediate=x["intermediate"][..., :0]), "state"),
    ]
    return cases


@pytest.mark.parametrize("name,rows,mutate,arg", _bad_cases(), ids=[c[0] for c in _bad_cases()])
def test_bad_input_raises_naming_the_argument(name, rows, mutate, arg):
    x = _good(rows)
    if mutate is not None:
        mutate(x)
    state_before = x["state"].clone()
    with pytest.raises(ValueError, match=rf"^{arg}:"):
        _call(x, rows)
    assert bitwise_equal(x["state"], state_before), "a rejected call touched the state"


def test_bad_scalar_arguments():
    x = _good(2)
    with pytest.raises(ValueError, match=r"^out_dtype:"):
        _call(x, 2, out_dtype=torch.int32)
    with pytest.raises(ValueError, match=r"^scale:"):
        _call(x, 2, scale="0.1")
    for name in ("use_qk_l2norm", "validate"):     # bools: a string's truth is not taken
        for rows in (None, 2):
            with pytest.raises(ValueError, match=f"^{name}: expected a bool"):
                _call(_good(rows), rows, **{name: "no"})
    # state_indices=None needs B <= S
    y = _good(None)
    y["state"] = y["state"][:1]
    with pytest.raises(ValueError, match=r"^state_indices:"):
        _call(y, None, state_indices=None)


def test_chain_k_zero_and_k_max_boundaries():
    x = _good(1)
    x["q"] = x["q"][:, :0]
    with pytest.raises(ValueError, match=r"^q:"):
        _call(x, 1)
    x = _good(8)
    o = _call(x, 8)          # K = 8 is legal
    assert o.shape == (2, 8, 2, 16)


def test_input_makers_name_a_bad_argument():
    """The seeded input makers refuse nonsense before drawing, naming the argument: a dtype
    given as a string or an int dtype, a size below 1, too few slots;
    NumPy integers (as grids give them) are sizes like ints."""
    import numpy as np

    from pmll_lab.inputs import conv_inputs, gdn_inputs, pmll_inputs

    base = dict(seed=0, batch=2, num_k_heads=2, num_v_heads=4, k_dim=8, v_dim=8)
    for kw, message in ((dict(dtype="bf16"), "dtype: expected a floating torch.dtype"),
                        (dict(dtype=torch.int32), "dtype: expected a floating torch.dtype"),
                        (dict(batch=-1), "batch: must be an int >= 1 (and < 2**63), got -1"),
                        (dict(rows=0), "rows: must be an int >= 1 (and < 2**63), got 0"),
                        (dict(k_dim=2.0), "k_dim: must be an int >= 1 (and < 2**63), got 2.0"),
                        (dict(slots=1), "slots: must be >= batch"),
                        (dict(seed=-1), "seed: must be an int >= 0"),
                        (dict(seed=2 ** 70), "seed: must be an int >= 0 (and < 2**63)")):
        with pytest.raises(ValueError, match="^" + re.escape(message)):
            gdn_inputs(**{**base, **kw})
    x = gdn_inputs(**{**base, "batch": np.int64(2), "rows": np.int32(3)})
    assert x["q"].shape == (2, 3, 2, 8) and x["q"].abs().sum() > 0
    with pytest.raises(ValueError, match=r"^heads: must be an int >= 1 \(and < 2\*\*63\), got 0"):
        pmll_inputs(0, 1, 0, 4, 8)
    with pytest.raises(ValueError, match=r"^slots: must be >= batch \(2\), got 1"):
        conv_inputs(0, 2, 8, slots=1)
    with pytest.raises(ValueError, match=r"^state_len: must be >= max\(1, d_conv - 1\) = 3"):
        conv_inputs(0, 2, 8, d_conv=4, state_len=1)
