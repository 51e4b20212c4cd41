"""The tolerances every check against a float64 reference uses: one table for the notebooks'
point functions (``pmll_lab.experiments``) and the tests.

Each is a bound on ``rel_l2 = ||x - ref|| / ||ref||``. Per-dtype tables take the dtype's name
(``"bfloat16"``) or the ``torch.dtype`` itself.
"""

from __future__ import annotations


class ByDtype(dict):
    """A tolerance per dtype, looked up by name (``"float32"``) or by ``torch.float32``."""

    def __missing__(self, key):
        name = str(key).removeprefix("torch.")
        if name != key and name in self:
            return self[name]
        raise KeyError(key)


STATE_TOL = 1e-5
"""fp32 states, snapshots and stash rows: fp32 arithmetic over kd-long reductions."""
O_TOL = ByDtype(float32=1e-5, float16=1e-3, bfloat16=8e-3)
"""Outputs, rounded once to the input dtype (fp32: as ``STATE_TOL``)."""
HALF_STATE_TOL = ByDtype(bfloat16=8e-3, float16=1e-3)
"""A bf16/fp16 state against the float64 reference with the same rounding points: an fp32 value
and its float64 twin can round to neighbouring values (one ulp), carried on by later rows."""
RING_WRITE_TOL = ByDtype(float32=1e-6, bfloat16=1.6e-2, float16=2e-3)
"""A gated ring write: 8 unit roundoffs (a blend is rounded once per token on a slot). Ungated
writes and reads are copies: 0."""
RING_ATTENTION_TOL = ByDtype(float32=1e-5, bfloat16=1.6e-2, float16=2e-3)
"""The fused ring attention: probabilities and output each rounded once to the dtype (as
FlashAttention and SDPA round), 8 unit roundoffs of a 16-bit dtype."""
STEP_TOL = ByDtype(float32=8e-3, bfloat16=2e-2, float16=1e-2)
"""A whole speculative step's accepted outputs (bf16) against float64 decoding of the accepted
rows (and against plain decoding on the device), per state dtype: one bf16 rounding of the
outputs (8e-3), or the 2-byte state's own rounding carried over the steps."""
STEP_STATE_TOL = ByDtype(float32=2e-4, bfloat16=2e-2, float16=1e-2)
"""The same step's effective states, per state dtype: an fp32 state holds the ring form's
products (bf16 head and tail of the state, ``RING_TOL``: up to 1.8e-6) and a peer's ring
materialised from its rows (SGLang's: up to 8.2e-5 on the first four sequences of every point
of run h100-2026-12-07f), below a checkpoint rounded once through bf16 (2.3e-4 after a few
decayed steps; a whole state rounded, ~2e-3); a 2-byte state its own rounding carried over the
steps."""
RING_TOL = ByDtype(float32=1e-4, bfloat16=2e-2, float16=5e-3)
"""The ring form's outputs and states against the float64 exact protocol, per state dtype. fp32:
the state's products from a bf16 head and tail, the small ones from three bf16 pieces (~4e-7
before the outputs' rounding); bf16/fp16: the state's own rounding."""
MODEL_TOL = 1e-4
"""Logits of a 12-layer fp32 model computed two ways (segmented vs whole sequence)."""

TOLERANCES = {
    "state": STATE_TOL, "output": O_TOL, "half state": HALF_STATE_TOL,
    "ring write": RING_WRITE_TOL, "ring attention": RING_ATTENTION_TOL, "model": MODEL_TOL,
    "speculative step": STEP_TOL, "speculative step, states": STEP_STATE_TOL,
    "ring form": RING_TOL,
}
"""Every tolerance above by what it bounds."""
