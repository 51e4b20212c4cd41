"""Shared by the carried-state tests: test_carry.py, test_carry_protocol.py, test_carry_inputs.py.

``_close`` asserts a relative L2 error (``pmll_lab.bench.errors``) against a float64 reference;
``O_TOL`` is the output tolerance per input dtype (fp32 arithmetic over kd-long reductions: 1e-5;
bf16 outputs rounded once, one ulp is 2**-8 relative: 8e-3); ``CAP`` the stash's row capacity.
"""

from __future__ import annotations

from pmll_lab.bench import errors
from pmll_lab.carry import GDN_CARRY_CAP
from pmll_lab.tolerances import O_TOL  # noqa: F401  (the tolerance table experiments share)

CAP = GDN_CARRY_CAP


def _close(name, out, want, tol):
    e = errors(out, want)
    assert e["rel_l2"] <= tol, f"{name}: rel_l2 {e['rel_l2']:.3e} > {tol:.0e} (max_abs {e['max_abs']:.3e})"
