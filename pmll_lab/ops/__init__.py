"""Triton kernels and their launchers, one sub-package per operator family."""
