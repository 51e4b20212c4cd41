"""Argument checks shared by every public launcher.

Every check raises ``ValueError`` whose message starts with the argument's name, before any
kernel is launched (SPEC §3 "Bad input"). Buffers a launch writes must not share memory with
each other or with what it reads (``apart``, from data pointers, shapes and strides only: no
sync).

``validate=True`` means one thing in every launcher that takes it (GDN decode, the chain and
their plans; the carried-state verify, flush and accept; the ring form's verify, accept and
flush; the conv launchers; ``pmll_write``, ``pmll_step``). It adds the value checks, which on a
GPU read values back (a device sync):

- finite values (``finite_inputs``, ``finite_slots``, ``finite_pending``): no NaN or infinity
  in a float input the launch reads (rows, gates and the gating inputs, conv weights, PMLL
  gates) nor in the state it reads (the live slots' states and conv windows, a carry's pending
  stash rows, a ring's live rows, a PMLL ring); the one infinity allowed is ``g = -inf``, a row
  that forgets the history (``exp(g) = 0``). Padding lanes' rows and slots no lane reads are
  not read, so not checked;
- ranges (``range_values``): ``g <= 0``, ``beta`` and PMLL gates in ``[0, 1]``, pending counts,
  ring cursors, accepted counts, ``engaged``; no plain launch on a slot with pending carry rows
  (``nothing_pending``);
- slot tables (``indices_values``): entries in ``[0, S)`` or -1 (a padding lane), no live slot
  twice, no lane writing a slot another lane reads.

Slot tables and the counts that address memory, when in host memory (every CPU run), are
checked in full whatever ``validate`` says (``host_indices``: free there; a bad slot would be a
memory fault or a race). The values are checked only under ``validate``.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Iterable, Sequence

import torch

from pmll_lab import cuda_ext

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def tensor(
    name: str,
    t,
    *,
    ndim: int | None = None,
    shape: Sequence[int | None] | None = None,
    dtype: torch.dtype | Iterable[torch.dtype] | None = None,
    device: torch.device | None = None,
    last_contiguous: bool = False,
    contiguous: bool = False,
    like: str | None = None,
) -> torch.Tensor:
    """Check one tensor argument; ``None`` entries in ``shape`` match any size; ``like`` names
    the argument whose dtype ``dtype`` is (the message then says so). Returns ``t``."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    ts = t.shape
    if ndim is not None and len(ts) != ndim:
        raise ValueError(f"{name}: expected {ndim} dims, got shape {tuple(ts)}")
    if shape is not None:
        bad = len(ts) != len(shape)
        if not bad:
            for s, a in zip(shape, ts):
                if s is not None and s != a:
                    bad = True
                    break
        if bad:
            want = tuple("*" if s is None else s for s in shape)
            raise ValueError(f"{name}: expected shape {want}, got {tuple(ts)}")
    if dtype is not None:
        allowed = (dtype,) if isinstance(dtype, torch.dtype) else tuple(dict.fromkeys(dtype))
        if t.dtype not in allowed:
            names = ", ".join(str(d).replace("torch.", "") for d in allowed)
            got = str(t.dtype).replace("torch.", "")
            if like is not None:
                raise ValueError(f"{name}: dtype must match {like}'s ({names}), got {got}")
            raise ValueError(f"{name}: dtype must be one of {names}, got {got}")
    if device is not None and t.device != device:
        want = device if isinstance(device, torch.device) else torch.device(device)
        if t.device != want and not (t.device.type == want.type and want.index is None):
            raise ValueError(f"{name}: expected a tensor on {device}, got one on {t.device}")
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{name}: must be contiguous (strides {t.stride()})")
    if last_contiguous and len(ts) > 0 and ts[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name}: last dim must be contiguous (stride 1), got strides {t.stride()}")
    return t


def no_overlap(name: str, t: torch.Tensor) -> torch.Tensor:
    """``ValueError`` naming ``name`` when elements of ``t`` may share memory: a buffer a kernel
    writes must give each element its own (a stride-0 dim from ``expand``, or strides that
    interleave, would make a kernel write over itself). Sufficient test: sorted by stride, each
    dim longer than 1 must step past the span of the smaller ones; layouts that fail it and yet
    do not overlap are rare and rejected too. Host only. Returns ``t``."""
    span = 1
    for st, n in sorted((abs(st), n) for st, n in zip(t.stride(), t.shape) if n > 1):
        if st < span:
            raise ValueError(f"{name}: its elements may share memory (shape {tuple(t.shape)}, "
                             f"strides {t.stride()}): a buffer that is written needs each "
                             "element in its own memory (no expand or overlapping as_strided)")
        span += st * (n - 1)
    return t


def _layout(t: torch.Tensor) -> tuple[int, list[tuple[int, int]], int]:
    """``(first byte, [(stride, size)] in bytes outermost first, element bytes)`` of ``t``'s
    elements: dims of one element and stride-0 dims (``expand``) dropped, adjacent dims that
    step as one merged."""
    e = t.element_size()
    dims = sorted(((st * e, n) for st, n in zip(t.stride(), t.shape) if n > 1 and st != 0),
                  reverse=True)
    merged: list[tuple[int, int]] = []
    for st, n in reversed(dims):                      # innermost first
        if merged and merged[-1][0] * merged[-1][1] == st:
            merged[-1] = (merged[-1][0], merged[-1][1] * n)
        else:
            merged.append((st, n))
    return t.data_ptr(), merged[::-1], e


def _span(dims, e) -> int:
    return sum(st * (n - 1) for st, n in dims) + e


def _overlap(a0: int, da, ea: int, b0: int, db, eb: int) -> bool:
    """Whether byte sets of two strided layouts (``_layout``) may intersect: False when proved
    disjoint, by their extents or by an outer stride they share (each one's inner elements then
    lie in a window shorter than that stride, and the question repeats on the inner dims for
    the few outer offsets that could meet); True when they meet or that proof does not apply."""
    wa, wb = _span(da, ea), _span(db, eb)
    if a0 + wa <= b0 or b0 + wb <= a0:
        return False
    if not da and not db:
        return True
    s = max(d[0][0] for d in (da, db) if d)

    def outer(d, w, e):
        if d and d[0][0] == s:
            n, inner = d[0][1], d[1:]
        elif w <= s:
            n, inner = 1, d                            # one outer step
        else:
            return None
        iw = _span(inner, e)
        return None if iw > s else (n, inner, iw)

    oa, ob = outer(da, wa, ea), outer(db, wb, eb)
    if oa is None or ob is None:
        return True                                    # interleaved otherwise: assume they meet
    (na, ia, iwa), (nb, ib, iwb) = oa, ob
    d = b0 - a0                                        # B's step j at d + j*s from A's step 0
    lo = max(-(nb - 1), (d - iwa) // s + 1)            # m = i - j with -iwb < d - m*s < iwa
    hi = min(na - 1, -(-(d + iwb) // s) - 1)
    return any(_overlap(0, ia, ea, d - m * s, ib, eb) for m in range(lo, hi + 1))


def may_share_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors may have an element in the same memory: False for different devices,
    an empty tensor, disjoint address ranges, or views of one buffer that a shared outer stride
    keeps apart (two layers' or heads' slices of one pool, the stash and state of one slot
    row); True otherwise, layouts too interleaved to tell apart cheaply included. Host only:
    data pointers, shapes and strides, no device sync."""
    if a.device != b.device or a.numel() == 0 or b.numel() == 0:
        return False
    a0, da, ea = _layout(a)
    b0, db, eb = _layout(b)
    return _overlap(a0, da, ea, b0, db, eb)


def apart(writes: dict, reads: dict | None = None) -> None:
    """``ValueError`` naming both arguments when a buffer a launch writes (``writes``: name ->
    tensor, ``None`` entries skipped) may share memory (``may_share_memory``) with another it
    writes or with one it reads (``reads``; inputs may share memory with each other, as views
    of one fused projection do). A kernel writing into a buffer it also reads elsewhere, or two
    outputs on one memory, would corrupt another lane's state or race. Run before any kernel;
    host only (no device sync)."""
    ws = [(n, t) for n, t in writes.items() if isinstance(t, torch.Tensor)]
    rs = [(n, t) for n, t in (reads or {}).items() if isinstance(t, torch.Tensor)]
    for i, (name, t) in enumerate(ws):
        for other, u, what in [(o, x, "writes") for o, x in ws[i + 1:]] + \
                [(o, x, "reads") for o, x in rs]:
            if may_share_memory(t, u):
                raise ValueError(
                    f"{name}: shares memory with {other}, which this launch also {what} "
                    f"({name} {tuple(t.shape)} at {t.data_ptr():#x}, {other} "
                    f"{tuple(u.shape)} at {u.data_ptr():#x}): outputs must not overlap "
                    "each other or an input the kernels read")


def same_device(ref_name: str, ref: torch.Tensor, **others: torch.Tensor | None) -> None:
    """Every tensor in ``others`` (``None`` entries skipped) lives on ``ref``'s device. A
    non-tensor ``ref`` or entry raises ``ValueError`` naming it."""
    if not isinstance(ref, torch.Tensor):
        raise ValueError(f"{ref_name}: expected a torch.Tensor, got {type(ref).__name__}")
    for name, t in others.items():
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.device != ref.device:
            raise ValueError(f"{name}: on {t.device}, but {ref_name} is on {ref.device}")


def positive_int(name: str, value, *, minimum: int = 1, maximum: int | None = None) -> int:
    """A Python int (not a bool) in ``[minimum, maximum]``; ``ValueError`` naming ``name``
    otherwise. A NumPy integer is refused with the cast to write: the callers keep the value
    they were given, and a kernel's size argument must be a Python int."""
    if isinstance(value, bool) or not isinstance(value, int):
        hint = (f" (a NumPy integer: pass int({name}))"
                if isinstance(value, numbers.Integral) and not isinstance(value, bool) else "")
        raise ValueError(f"{name}: expected an int, got {type(value).__name__}{hint}")
    if value < minimum or (maximum is not None and value > maximum):
        hi = "" if maximum is None else f" and <= {maximum}"
        raise ValueError(f"{name}: must be >= {minimum}{hi}, got {value}")
    return value


def device_memory(dev: torch.device) -> int | None:
    """Bytes of memory ``dev`` has: a CUDA device's total memory, the host's physical memory
    for the CPU; ``None`` where the platform does not say."""
    if dev.type == "cuda":
        return torch.cuda.get_device_properties(dev).total_memory
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        return None


def fits(name: str, nbytes: int, dev: torch.device, what: str) -> None:
    """``ValueError`` naming ``name`` when ``nbytes`` (``what``: the tensors a call is about to
    allocate on ``dev``) exceed the device's whole memory (``device_memory``): a size no
    allocation can hold, refused before any allocation or kernel."""
    have = device_memory(dev)
    if have is not None and nbytes > have:
        raise ValueError(f"{name}: {what} would take {nbytes:,} bytes, more than the whole "
                         f"memory of {dev} ({have:,} bytes)")


def flag(name: str, value) -> bool:
    """A Python bool (not an int, a numpy bool or a string, whose truth would be taken silently
    or reach a kernel's constexpr as another type). Returns it."""
    if not isinstance(value, bool):
        raise ValueError(f"{name}: expected a bool, got {type(value).__name__}")
    return value


def optional_float(name: str, value) -> float | None:
    """``None``, or a finite real number (int or float, not bool) returned as a float: a NaN
    or infinite scale would reach every output of a kernel silently."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name}: expected a float or None, got {type(value).__name__}")
    if not math.isfinite(value):
        raise ValueError(f"{name}: must be finite, got {value!r}")
    return float(value)


def positive_float(name: str, value) -> float:
    """A real number (not bool), finite and > 0. Returns it as a float."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name}: expected a positive float, got {type(value).__name__}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name}: must be finite and > 0, got {value!r}")
    return float(value)


def device(name: str, value, default: torch.device) -> torch.device:
    """A device argument: ``None`` (``default``), a ``torch.device``, a string or a CUDA ordinal
    naming one that this machine has (a CUDA device needs CUDA and an index below the device
    count)."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (str, torch.device, int)):
        raise ValueError(f"{name}: expected None, a str, an int or a torch.device, got "
                         f"{type(value).__name__}")
    try:
        dev = torch.device(value)
    except (RuntimeError, ValueError) as exc:
        raise ValueError(f"{name}: not a device ({exc})") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{name}: {dev} requested, but CUDA is not available here")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"{name}: {dev} requested, but there are "
                             f"{torch.cuda.device_count()} CUDA devices")
    return dev


def int_list(name: str, value) -> list[int]:
    """Host integers: an int (one entry) or an iterable of ints (numpy ints too). Bools, floats
    (even integral ones), strings and ``None`` raise ``ValueError`` naming ``name``."""
    if isinstance(value, (bool, str, bytes)) or value is None:
        raise ValueError(f"{name}: expected an int or a sequence of ints, got {value!r}")
    if isinstance(value, numbers.Integral):
        return [int(value)]
    try:
        items = list(value)
    except TypeError:
        raise ValueError(f"{name}: expected an int or a sequence of ints, got "
                         f"{type(value).__name__}") from None
    for v in items:
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            raise ValueError(f"{name}: entries must be ints, got {v!r} ({type(v).__name__})")
    return [int(v) for v in items]


def index_tensor(name: str, value, size: int, *, device=None, distinct: bool = False) -> torch.Tensor:
    """Indices given as an int, a sequence of ints or an integer tensor (0-D or 1-D), checked to
    lie in ``[0, size)`` (and to be distinct if asked). Returns int64 ``[n]`` on ``device``
    (default: the tensor's own, else CPU). Checking a device tensor's values syncs: for host-side
    bookkeeping (``reset``), not for launchers."""
    if isinstance(value, torch.Tensor):
        if value.dtype == torch.bool or value.dtype.is_floating_point or value.dtype.is_complex \
                or value.dim() > 1:
            raise ValueError(f"{name}: expected integer indices (0-D or 1-D), got {value.dtype} "
                             f"of shape {tuple(value.shape)}")
        idx = value.reshape(-1).to(torch.int64)
    else:
        idx = torch.tensor(int_list(name, value), dtype=torch.int64)
    if device is not None:
        idx = idx.to(device)
    indices_values(name, idx, size, distinct=distinct)
    return idx


def choice(name: str, value, options: Sequence) -> None:
    if value not in options:
        raise ValueError(f"{name}: must be one of {list(options)}, got {value!r}")


def impl(launcher: str, value) -> str:
    """``impl`` of the public launcher named ``launcher``: ``"triton"`` (every launcher), or
    ``"cuda"`` where it has a CUDA C++ twin (``cuda_ext.TWIN_LAUNCHERS``). ``ValueError``
    naming ``impl`` otherwise (for ``"cuda"``: which launchers have a twin). Returns ``value``."""
    choice("impl", value, ("triton", "cuda"))
    if value == "cuda" and launcher not in cuda_ext.TWIN_LAUNCHERS:
        raise ValueError(f"impl: {launcher} has no CUDA C++ twin (impl='cuda' is taken by "
                         f"{', '.join(cuda_ext.TWIN_LAUNCHERS)}); use impl='triton'")
    return value


# ---- value checks (device sync: only with validate=True) -------------------------------------

def indices_values(name: str, idx: torch.Tensor, size: int, *, distinct: bool = True,
                   padding: bool = False) -> None:
    """``idx`` entries lie in ``[0, size)`` and, if ``distinct``, appear once each. With
    ``padding``, entries of -1 (padding lanes, SPEC §2 "Serving conventions") are allowed and
    left out of both checks."""
    if padding:
        idx = idx[idx != -1]
    if idx.numel() == 0:
        return
    lo, hi = int(idx.min()), int(idx.max())
    if lo < 0 or hi >= size:
        extra = " or be -1 (a padding lane)" if padding else ""
        raise ValueError(f"{name}: entries must lie in [0, {size}){extra}, got range [{lo}, {hi}]")
    if distinct and torch.unique(idx).numel() != idx.numel():
        raise ValueError(f"{name}: entries must be distinct within one launch")


def on_host(t) -> bool:
    """``t`` is a tensor in host memory (every CPU run's slot tables): its values can be read
    with no device sync, so the checks that ``validate=True`` runs on a GPU cost nothing here."""
    return isinstance(t, torch.Tensor) and t.device.type == "cpu"


def host_indices(name: str, idx, size: int, *, padding: bool = True) -> None:
    """When ``idx`` is on the host (``on_host``), its entries lie in ``[0, size)`` (or are -1,
    a padding lane, with ``padding``) and no live entry appears twice: ``ValueError`` naming
    ``name`` otherwise. A kernel given an out-of-range slot reads or writes outside its buffers
    (on the CPU a segmentation fault), two lanes of one slot race on its state; on the host the
    check is free, so it runs whatever ``validate`` says. On a GPU the check stays with
    ``validate=True`` (it would sync)."""
    if on_host(idx):
        indices_values(name, idx, size, distinct=True, padding=padding)


def nothing_pending(name: str, pend: torch.Tensor, state_indices, batch: int, *,
                    written: bool = False) -> None:
    """No lane of a plain launch (decode, chain, conv update) reads a slot whose carried-state
    stash still holds accepted rows not folded into the stored state (``pend [S] > 0``;
    ``state_indices``: the lanes' slots, -1 padding, ``None`` for ``arange(batch)``). Such a
    slot's stored state lags its sequence by those rows, so a plain launch on it starts from
    a stale state and silently gives wrong outputs and a wrong state. ``written``: the slots
    are the launch's write slots (``out_state_indices``: a fork's target), whose pending rows
    belong to the state about to be replaced: the next verify would fold them into the new
    one. ``ValueError`` naming ``name``; one device sync (``validate=True`` only)."""
    read = (torch.arange(batch, device=pend.device) if state_indices is None
            else state_indices.long().to(pend.device))
    slots = read[read >= 0]
    held = pend[slots]
    if bool((held > 0).any()):
        i = int((held > 0).nonzero()[0])
        if written:
            raise ValueError(
                f"{name}: write slot {int(slots[i])} holds {int(held[i])} accepted carry rows of "
                "the state this launch replaces: the next verify would fold them into the new "
                "state; reset that slot's carry first (GdnCarry.reset), or fork whole slots "
                "with SpecDecodeStep.copy_slots")
        raise ValueError(
            f"{name}: slot {int(slots[i])} holds {int(held[i])} accepted carry rows not yet "
            "folded into its state: a plain launch there would start from a stale state; fold "
            "them first (pmll_lab.carry.gdn_carry_flush / conv_carry_flush, then clear pend) "
            "or verify with the carry")


def range_values(name: str, t: torch.Tensor, lo: float, hi: float) -> None:
    """Every entry of ``t`` lies in ``[lo, hi]`` (NaN fails)."""
    if t.numel() == 0:
        return
    bad = ~((t >= lo) & (t <= hi))
    if bool(bad.any()):
        first = t[bad].flatten()[0].item()
        raise ValueError(f"{name}: entries must lie in [{lo}, {hi}], found {first}")


def finite_values(name: str, t: torch.Tensor) -> None:
    """Every entry of ``t`` is finite (no NaN, no infinity)."""
    if t.numel() and not bool(torch.isfinite(t).all()):
        bad = t[~torch.isfinite(t)].flatten()[0].item()
        raise ValueError(f"{name}: entries must be finite, found {bad}")


def finite_inputs(lanes: dict, live: torch.Tensor | None = None,
                  whole: dict | None = None) -> None:
    """``validate=True``'s rule for a launch's float inputs (module docstring): ``lanes``
    (name -> ``[B, ...]`` per-lane tensor) finite on the live lanes (``live [B]`` bool; ``None``:
    every lane; a padding lane's rows are never read), ``whole`` (name -> tensor: per-head
    gating parameters, conv weights) finite everywhere. ``None`` entries and integer tensors
    are skipped; ``ValueError`` naming the first argument that fails (``finite_values``)."""
    for name, t in lanes.items():
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            finite_values(name, t if live is None else t[live])
    for name, t in (whole or {}).items():
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            finite_values(name, t)


def live_slots(idx, batch: int, device) -> torch.Tensor:
    """int64 slots the lanes read: ``idx`` without its padding entries (-1), or
    ``arange(batch)`` for ``idx=None`` (the launchers' default table)."""
    if idx is None:
        return torch.arange(batch, device=device)
    idx = idx.long()
    return idx[idx >= 0]


def finite_slots(name: str, t: torch.Tensor, slots: torch.Tensor, unit: str = "slot") -> None:
    """``validate=True``'s rule for the state a launch reads: the rows ``t[slots]`` (int64, the
    live lanes' slots) hold only finite entries. ``ValueError`` naming ``name``, the slot (or
    another ``unit``) and the value found: a NaN or an infinity in a state reaches every later
    output of that slot silently."""
    if slots.numel() == 0 or t.numel() == 0:
        return
    rows = t[slots]
    bad = ~torch.isfinite(rows.reshape(rows.shape[0], -1)).all(1)
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        val = rows[i][~torch.isfinite(rows[i])].flatten()[0].item()
        raise ValueError(f"{name}: {unit} {int(slots[i])} holds a non-finite value ({val})")


def finite_pending(name: str, parts: dict, slots: torch.Tensor, counts: torch.Tensor) -> None:
    """The rows a launch folds from a stash are finite: for each live slot ``slots[i]`` its
    first ``counts[i]`` rows of every ``parts`` tensor (``[S, CAP, ...]``; a part named ``"g"``
    may hold ``-inf``, a row that forgets the history). Rows past them are never read: not
    checked. ``ValueError`` naming ``name``, the slot and the row."""
    if slots.numel() == 0:
        return
    for part, rows in parts.items():
        sub = rows[slots].reshape(slots.numel(), rows.shape[1], -1)
        ok = ~torch.isnan(sub) if part == "g" else torch.isfinite(sub)
        pending = torch.arange(sub.shape[1], device=sub.device)[None, :] < counts.long()[:, None]
        bad = ~ok.all(-1) & pending
        if bool(bad.any()):
            i, r = (int(v) for v in bad.nonzero()[0])
            val = sub[i, r][~ok[i, r]][0].item()
            raise ValueError(f"{name}: slot {int(slots[i])}'s pending row {r} holds a "
                             f"non-finite value ({val})")


def copy_indices(src, dst, slots: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(src, dst)`` as int64 index tensors on ``device`` for a copy of slots: each in
    ``[0, slots)``, as many of one as of the other, ``dst`` distinct and apart from ``src``
    (a slot both read and written in one copy would depend on the order). ``ValueError``
    naming ``src`` or ``dst``."""
    s_idx = index_tensor("src", src, slots, device=device)
    d_idx = index_tensor("dst", dst, slots, distinct=True, device=device)
    if s_idx.shape != d_idx.shape:
        raise ValueError(f"dst: {d_idx.numel()} slots for {s_idx.numel()} in src")
    both = set(s_idx.tolist()) & set(d_idx.tolist())
    if both:
        raise ValueError(f"dst: slot {min(both)} is also in src")
    return s_idx, d_idx


def engaged_flags(batch: int, rows: int, device) -> torch.Tensor:
    """The ``engaged [batch]`` int32 flags of a verify of ``rows`` draft rows (uninitialised:
    its kernel writes them), tagged with ``rows`` (``verify_rows``): an accept given these
    flags bounds the accepted counts by the verify's ``K`` even when not told ``rows=``
    (``accepted_bound``), so a count above ``K`` never reaches the commit unseen."""
    flags = torch.empty(batch, dtype=torch.int32, device=device)
    flags.verify_rows = rows
    return flags


def accepted_bound(rows, engaged):
    """The most rows an accept may take: ``rows`` as given, else the ``K`` of the verify that
    returned ``engaged`` (``engaged_flags``), else None (the caller's capacity bound)."""
    return rows if rows is not None else getattr(engaged, "verify_rows", None)
