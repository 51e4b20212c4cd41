"""Every family and implementation the package ships, registered by importing their modules."""

from pmll_lab.harness import step_forms  # noqa: F401
from pmll_lab.harness import conv_step  # noqa: F401
from pmll_lab.harness import decode  # noqa: F401
from pmll_lab.harness import step_sglang  # noqa: F401
from pmll_lab.harness import step_ring_exact_fold  # noqa: F401
from pmll_lab.harness import verify  # noqa: F401  (after decode, step_forms: it joins theirs)
