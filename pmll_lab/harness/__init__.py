"""What is run, and the one runner that runs it.

``registry``: families (a kernel contract with its float64 reference) and implementations (ours
and the peers'), each name written once; ``runner``: check, then time, rows of one schema;
``workloads``: the sweeps each notebook runs, as data (``workloads.toml``); one module per family
(``step``: the whole speculative step) with its implementations beside it (``step_forms``).
Adding a kernel: ``docs/adding-a-kernel.md``.
"""

from pmll_lab.harness import catalog  # noqa: E402,F401  (registers the shipped families)
