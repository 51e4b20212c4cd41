"""Every family and implementation the package ships, registered by importing their modules.

``python -m pmll_lab.harness`` prints each registered name with its family, label,
provider and the module that registers it (``registry.table``): where to read a kernel's entry.
"""

from pmll_lab.harness import step_forms  # noqa: F401
from pmll_lab.harness import conv_step  # noqa: F401
from pmll_lab.harness import decode  # noqa: F401
from pmll_lab.harness import step_sglang  # noqa: F401
from pmll_lab.harness import step_ring_exact_fold  # noqa: F401
from pmll_lab.harness import verify  # noqa: F401  (after decode, step_forms: it joins theirs)

