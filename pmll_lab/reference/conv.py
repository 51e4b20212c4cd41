"""Float64 references for the causal depthwise conv and its carry protocol (SPEC §3c).

Written for clarity, not speed: loops over sequences and rows, one token at a time. Every
function takes tensors of any float dtype and device, computes in float64 on the CPU, and
returns *new* float64 tensors; nothing passed in is modified.

The conv (Qwen3-Next's ``causal_conv1d_update`` followed by the q/k l2norm). Channel ``c`` of one
sequence keeps a window of its last ``state_len`` inputs, oldest first. A token ``x [dim]`` gives::

    v    = [window[:, state_len-(d_conv-1):], x]          # [dim, d_conv], x last
    y    = sum_j weight[:, j] * v[:, j] + bias
    y    = silu(y)                                        # if activation == "silu"
    y[g] = y[g] * rsqrt(sum(y[g]**2) + l2_eps)            # each group g of head_dim channels
                                                          # among the first qk_channels
    window <- [window[:, 1:], x]                          # x shifted in, oldest dropped

The carry protocol (SPEC §3b/§3c): per slot a stash of ``cap`` input rows and ``pend``, the
number of accepted inputs in the stash not yet shifted into the stored window.

Slot tables are read as the kernels read them: a slot of -1 is a padding lane (zero outputs and
intermediate windows, ``engaged`` 1; no window, stash row or ``pend`` read or written), any other
slot outside ``[0, S)`` a ``ValueError`` naming ``state_indices`` / ``slot_tab``.
"""

from __future__ import annotations

import torch

from pmll_lab.reference._slots import PAD, slot_list

F64 = torch.float64


def _f64(t):
    return None if t is None else t.detach().to("cpu", F64).clone()


def conv_row(window: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias, *,
             activation="silu", qk_channels=0, head_dim=None, l2_eps=1e-6):
    """One token for one sequence: ``window [dim, state_len]``, ``x [dim]``, ``weight
    [dim, d_conv]``, ``bias [dim]`` or None (all float64). Returns ``(y [dim], new_window)``."""
    d_conv = weight.shape[1]
    taps = torch.cat([window[:, window.shape[1] - (d_conv - 1):], x[:, None]], dim=1)
    y = (weight * taps).sum(dim=1)
    if bias is not None:
        y = y + bias
    if activation == "silu":
        y = y * torch.sigmoid(y)
    elif activation is not None:
        raise ValueError(f"activation: must be None or 'silu', got {activation!r}")
    if qk_channels:
        groups = y[:qk_channels].reshape(-1, head_dim)
        groups = groups * torch.rsqrt((groups * groups).sum(dim=1, keepdim=True) + l2_eps)
        y = torch.cat([groups.reshape(-1), y[qk_channels:]])
    new_window = torch.cat([window[:, 1:], x[:, None]], dim=1)
    return y, new_window


def conv_update(conv_state, x, weight, bias=None, *, state_indices=None, activation="silu",
                qk_channels=0, head_dim=None, l2_eps=1e-6):
    """One token per sequence. ``conv_state [S, dim, state_len]``, ``x [B, dim]``,
    ``state_indices [B]`` (default ``arange(B)``; -1: a padding lane, zero outputs, no window
    read or written; any other slot outside ``[0, S)``: ``ValueError`` naming
    ``state_indices``). Returns ``(y [B, dim], conv_state [S, dim, state_len])``, float64; slots
    not in ``state_indices`` are copied unchanged."""
    y, states, _ = conv_chain(conv_state, x[:, None, :], weight, bias, state_indices=state_indices,
                              activation=activation, qk_channels=qk_channels, head_dim=head_dim,
                              l2_eps=l2_eps)
    return y[:, 0], states


def conv_chain(conv_state, x, weight, bias=None, *, state_indices=None, activation="silu",
               qk_channels=0, head_dim=None, l2_eps=1e-6):
    """K tokens per sequence, in order. ``x [B, K, dim]``. Returns ``(y [B, K, dim], conv_state
    [S, dim, state_len], intermediate [B, K-1, dim, state_len])`` (float64): the final windows
    at their slots and the window after each row ``t < K-1`` (zeros for a padding lane, slot
    -1, as are its outputs; ``state_indices`` as in ``conv_update``)."""
    states, x, weight, bias = _f64(conv_state), _f64(x), _f64(weight), _f64(bias)
    B, K, dim = x.shape
    idx = slot_list("state_indices", state_indices, B, states.shape[0])
    y = torch.zeros(B, K, dim, dtype=F64)
    inter = torch.zeros(B, max(K - 1, 0), dim, states.shape[2], dtype=F64)
    for b, slot in enumerate(idx):
        if slot == PAD:
            continue
        window = states[slot]
        for t in range(K):
            y[b, t], window = conv_row(window, x[b, t], weight, bias, activation=activation,
                                       qk_channels=qk_channels, head_dim=head_dim, l2_eps=l2_eps)
            if t < K - 1:
                inter[b, t] = window
        states[slot] = window
    return y, states, inter


# ---- the carry protocol ------------------------------------------------------------------------

def conv_carry_verify(conv_state, stash, pend, x, weight, bias=None, *, slot_tab, lazy=False,
                      activation="silu", qk_channels=0, head_dim=None, l2_eps=1e-6):
    """One verify of ``K`` draft rows per sequence with the carried conv window.

    ``conv_state [S, dim, state_len]``, ``stash [S, cap, dim]``, ``pend [S]``, ``x [B, K, dim]``,
    ``slot_tab [B]`` (-1: a padding lane, zero outputs, ``engaged`` 1, nothing read or written;
    any other slot outside ``[0, S)``: ``ValueError`` naming ``slot_tab``). For sequence ``b``
    (``slot = slot_tab[b]``, ``p = pend[slot]``):

    1. shift the ``p`` pending stashed inputs ``stash[slot, :p]`` into the window;
    2. eager (``lazy=False``): write the window back when ``p > 0``; lazy: only when
       ``p + K > cap``. After a write-back the new rows are stashed at ``0..K-1``, otherwise
       at ``p..p+K-1``;
    3. run the K rows from the shifted window, giving ``y [B, K, dim]``;
    4. ``engaged[b] = 2`` after a write-back, else 1.

    Returns ``(y, engaged [B] int64, conv_state, stash)`` (new tensors; ``pend`` is the
    caller's, updated by ``carry_accept``).
    """
    states, stash, x, weight, bias = _f64(conv_state), _f64(stash), _f64(x), _f64(weight), _f64(bias)
    pend = [int(p) for p in pend]
    cap = stash.shape[1]
    B, K, dim = x.shape
    y = torch.zeros(B, K, dim, dtype=F64)
    engaged = torch.ones(B, dtype=torch.int64)
    for b, slot in enumerate(slot_list("slot_tab", slot_tab, B, states.shape[0])):
        if slot == PAD:
            continue
        p = pend[slot]
        window = states[slot]
        for r in range(p):
            window = torch.cat([window[:, 1:], stash[slot, r][:, None]], dim=1)
        write_back = (p + K > cap) if lazy else (p > 0)
        if write_back:
            states[slot] = window
        first = 0 if write_back else p
        for t in range(K):
            y[b, t], window = conv_row(window, x[b, t], weight, bias, activation=activation,
                                       qk_channels=qk_channels, head_dim=head_dim, l2_eps=l2_eps)
            stash[slot, first + t] = x[b, t]
        engaged[b] = 2 if write_back else 1
    return y, engaged, states, stash


def carry_accept(pend, slot_tab, engaged, accepted):
    """Pending counts after acceptance: ``pend[slot] = a`` after a write-back (``engaged == 2``),
    else ``pend[slot] + a``. Returns a new int64 tensor. A padding lane (slot -1) changes
    nothing; any other slot outside ``[0, S)``: ``ValueError`` naming ``slot_tab``."""
    pend = pend.detach().to("cpu", torch.int64).clone()
    for b, slot in enumerate(slot_list("slot_tab", slot_tab, len(slot_tab), pend.shape[0])):
        if slot == PAD:
            continue
        a = int(accepted[b])
        pend[slot] = a if int(engaged[b]) == 2 else pend[slot] + a
    return pend


def conv_carry_flush(conv_states, stashes, pends, slot_tab):
    """Fold every slot's pending inputs into its window, for each layer; ``pend`` untouched.

    ``conv_states``, ``stashes``, ``pends``: lists over layers. Returns the list of new windows.
    Padding lanes (slot -1) are skipped; any other slot outside ``[0, S)``: ``ValueError``
    naming ``slot_tab``."""
    out = []
    for conv_state, stash, pend in zip(conv_states, stashes, pends):
        states, stash = _f64(conv_state), _f64(stash)
        for slot in slot_list("slot_tab", slot_tab, len(slot_tab), states.shape[0]):
            if slot == PAD:
                continue
            for r in range(int(pend[slot])):
                states[slot] = torch.cat([states[slot][:, 1:], stash[slot, r][:, None]], dim=1)
        out.append(states)
    return out
