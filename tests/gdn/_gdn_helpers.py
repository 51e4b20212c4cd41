"""Shared by the GDN tests (test_gdn.py, test_gdn_reference.py).

``_check_close`` asserts a relative L2 error ``||x - ref|| / ||ref||`` (``pmll_lab.bench.errors``)
at most ``tol``, and names the tensor, the error and the largest absolute error when it is not.
"""

from __future__ import annotations

from pmll_lab.bench import errors


def _check_close(name, out, ref, tol):
    e = errors(out, ref)
    assert e["rel_l2"] <= tol, f"{name}: rel_l2 {e['rel_l2']:.3e} > {tol:.0e} (max_abs {e['max_abs']:.3e})"
