"""Model architectures run through pmll_lab's kernels (one module per model family)."""
