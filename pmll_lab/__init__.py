"""pmll_lab: a workbench for the GPU kernels that keep a model's recurrent memory while decoding.

Families (each: float64 reference in ``pmll_lab.reference``, Triton kernels in ``pmll_lab.ops``,
public launchers in the top-level module, tests in ``tests/<family>/``, a notebook in ``notebooks/``):

- ``pmll_lab.pmll``: the PMLL persistent key/value memory ring and the attention that reads it
  in place, ``pmll_step`` (SPEC §1); ``pmll_lab.models.gpt2_pmll`` runs GPT-2 through it.
- ``pmll_lab.gdn``: Gated DeltaNet decode and the K-row chain with snapshots (SPEC §2, §3a).
- ``pmll_lab.conv``: the causal depthwise conv that feeds GDN (SPEC §3c).
- ``pmll_lab.carry``: carried-state verify, accept and flush (SPEC §3b, §3c).

``pmll_lab.backend`` is imported first: it decides GPU or Triton interpreter before any kernel
module is imported.
"""

from pmll_lab import backend  # noqa: F401  (must come first: sets TRITON_INTERPRET on CPU)
from pmll_lab.backend import DEVICE, INTERPRET  # noqa: F401

__version__ = "0.1.0"

PRESETS = ("quick", "full")
"""The presets every notebook and every workload of ``pmll_lab/harness/workloads.toml`` define
(``python -m pmll_lab report --preset``): here, below the harness and the report builder that
both read them."""
