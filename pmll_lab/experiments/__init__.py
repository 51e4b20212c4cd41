"""Sweep point functions and plotting helpers used by the notebooks, one module per family."""
