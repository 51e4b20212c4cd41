"""Checking and timing one launch: errors against a reference, time, bytes, roofline.

Conventions (SPEC §4; STYLE.md's llm.c and Liger habits):

- ``errors(out, ref)``: max-abs and relative L2 (``||out - ref|| / ||ref||``), both computed in
  float64; NaN anywhere gives ``inf`` so a NaN never passes a tolerance.
- ``time_launch(fn)``: on the GPU, ``triton.testing.do_bench`` (CUDA events, L2 flushed between
  reps) with median, p20 and p80 in microseconds, ``timer="do_bench"``: each call as Python issues
  it, host launch included when the GPU waits for the host. On the CPU, the kernels run in the
  Triton interpreter: the wall time of a few calls, ``timer="interpreter-wall"``. The two are
  never mixed in one plot (``pmll_lab.harness.runner.speed_rows`` keeps one timer).
- ``time_cuda_graph(fn)``: GPU time without the host: ``fn`` captured once in a CUDA graph, then
  ``>= 100`` replays each timed with its own pair of CUDA events (L2 flushed before each, as
  do_bench does); median, p20 and p80 in microseconds, ``timer="cuda_graph"``. None on the CPU.
- ``copy_bandwidth()``: the roofline, measured once per process as a device-to-device copy of
  1 GiB, counting bytes read plus bytes written (METHOD.md). ``None`` on the CPU.
- ``variant_kernel(module, name, path)``: a kernel of the library replaced, for the length of a
  ``with`` block, by the one a probe file defines under the same name (tuning scripts time
  candidate kernels beside the library's in one process).
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import statistics
import time
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

import torch

from pmll_lab.backend import DEVICE, INTERPRET


def errors(out: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    """``{"max_abs": ..., "rel_l2": ...}`` of ``out`` against ``ref`` (same shape), in float64."""
    if out.shape != ref.shape:
        raise ValueError(f"out: shape {tuple(out.shape)} differs from ref {tuple(ref.shape)}")
    # Compared where ``out`` lives (GPU float64 is fine): copying GB-sized snapshot buffers to
    # the host made an H200 sweep overrun its 10 minutes (2026-11-29).
    a = out.detach().to(torch.float64)
    b = ref.detach().to(a.device, torch.float64)
    if not torch.isfinite(a).all():
        return {"max_abs": math.inf, "rel_l2": math.inf}
    diff = a - b
    max_abs = float(diff.abs().max()) if diff.numel() else 0.0
    denom = float(torch.linalg.vector_norm(b))
    num = float(torch.linalg.vector_norm(diff))
    rel = num / denom if denom > 0 else (0.0 if num == 0 else math.inf)
    return {"max_abs": max_abs, "rel_l2": rel}


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape, dtype and bits (NaNs with equal bits count as equal; strides do not matter).

    Tensors on different devices (a kernel's output on the GPU, an expected value built on the
    CPU) are both copied to the CPU and compared there: a copy moves bits exactly, so the answer
    is the one a same-device comparison would give (a sync, as any comparison is)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.device != b.device:
        a, b = a.detach().cpu(), b.detach().cpu()
    ai, bi = a.detach().contiguous(), b.detach().contiguous()
    if ai.element_size() in (2, 4, 8):
        view = {2: torch.int16, 4: torch.int32, 8: torch.int64}[ai.element_size()]
        return bool(torch.equal(ai.view(view), bi.view(view)))
    return bool(torch.equal(ai, bi))


def time_launch(fn: Callable[[], object], *, warmup_ms: float = 25, rep_ms: float = 100,
                cpu_reps: int = 3) -> dict[str, float | str]:
    """Time ``fn()``; returns ``median_us, p20_us, p80_us, timer``.

    GPU: ``triton.testing.do_bench(fn, warmup, rep, quantiles=[0.5, 0.2, 0.8])``. CPU
    (interpreter): ``cpu_reps`` calls after one warm-up, wall clock; quantiles of those.
    """
    if DEVICE.type == "cuda" and not INTERPRET:
        import triton.testing

        med, p20, p80 = triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms,
                                                quantiles=[0.5, 0.2, 0.8])
        return {"median_us": med * 1e3, "p20_us": p20 * 1e3, "p80_us": p80 * 1e3,
                "timer": "do_bench", "l2": "flushed"}
    fn()
    samples = []
    for _ in range(max(1, cpu_reps)):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e6)
    med, p20, p80 = _quantiles(sorted(samples))
    return {"median_us": med, "p20_us": p20, "p80_us": p80, "timer": "interpreter-wall"}


GRAPH_MIN_REPLAYS = 100
"""Fewest replays ``time_cuda_graph`` times (a median of at least 100 replays)."""
L2_FLUSH_BYTES = 256 * 1024 * 1024
"""Bytes zeroed before each timed graph replay, as ``triton.testing.do_bench`` does (256 MB,
4x the H200's L2): each replay starts from HBM, and the memset keeps the GPU busy while the host
queues the replay, so no host gap lands between a replay's events."""


def _capture(fn: Callable[[], object], warmup: int) -> "torch.cuda.CUDAGraph":
    """``fn`` run ``warmup`` times on a side stream (compiles, allocates), then captured."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    return graph


def _quantiles(samples: list[float]) -> tuple[float, float, float]:
    """Median, p20 and p80 (inclusive quantiles) of ``samples``."""
    if len(samples) == 1:
        return samples[0], samples[0], samples[0]
    q = statistics.quantiles(samples, n=5, method="inclusive")
    return statistics.median(samples), q[0], q[3]


def time_cuda_graph(fn: Callable[[], object], *, replays: int = 200, warmup: int = 3,
                    flush_l2: bool = True,
                    guard: Callable[[Callable[[], None]], dict] | None = None
                    ) -> dict[str, float | str] | None:
    """GPU time of ``fn`` without the host: ``median_us, p20_us, p80_us, replays, timer``.

    ``fn`` runs ``warmup`` times on a side stream, is captured in one CUDA graph, and the graph
    is replayed ``replays`` times (at least ``GRAPH_MIN_REPLAYS``), each replay between its own
    two CUDA events; with ``flush_l2`` a 256 MB memset (``L2_FLUSH_BYTES``) precedes each replay
    outside its events. Returns None on the CPU (interpreter). Raises what capture raises (a
    launcher that synchronises with the host cannot be captured); the caller decides whether
    its other figures stand without this one. ``fn`` must be capturable: no host sync, no
    allocation that outlives the capture. ``guard(replay)``, given, runs between the capture and
    the timed replays (``harness.runner.replay_guard``: the graph must rewrite its outputs and
    advance its cursors) and raises if the graph does not do what ``fn`` does; its dict joins
    the result. The result's ``l2`` says whether each replay started from a flushed L2."""
    if DEVICE.type != "cuda" or INTERPRET:
        return None
    replays = max(int(replays), GRAPH_MIN_REPLAYS)
    graph = _capture(fn, warmup)
    proven = guard(graph.replay) if guard is not None else {}
    flush = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device=DEVICE) if flush_l2 else None
    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
             for _ in range(replays)]
    for start, end in pairs:
        if flush is not None:
            flush.zero_()
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    samples = sorted(start.elapsed_time(end) * 1e3 for start, end in pairs)
    del graph, flush
    med, p20, p80 = _quantiles(samples)
    return {"median_us": med, "p20_us": p20, "p80_us": p80, "replays": replays,
            "timer": "cuda_graph", "l2": "flushed" if flush_l2 else "warm", **proven}


def timings(fn: Callable[[], object], *, graph: bool, warmup_ms: float = 25,
            rep_ms: float = 100, cpu_reps: int = 3, replays: int = 200,
            launch_timer: Callable = time_launch,
            graph_timer: Callable = time_cuda_graph) -> list[dict]:
    """The timings every sweep point records: ``launch_timer``'s (``time_launch``: do_bench on
    a GPU, interpreter wall time on the CPU) and, when ``graph`` (a GPU run), ``graph_timer``'s
    (``time_cuda_graph``, ``replays`` replays). A capture that fails loses only the graph
    figure: its error text goes on the first timing as ``graph_error``. The timers are
    arguments so that an experiment module passes its own names (which tests may replace)."""
    t = dict(launch_timer(fn, warmup_ms=warmup_ms, rep_ms=rep_ms, cpu_reps=cpu_reps))
    out = [t]
    if graph:
        try:
            g = graph_timer(fn, replays=replays)
        except Exception as exc:  # noqa: BLE001 - the do_bench figure stands on its own
            torch.cuda.synchronize()
            t["graph_error"] = f"{type(exc).__name__}: {exc}"[:300]
        else:
            if g is not None:
                out.append(g)
    return out


def time_graph(fn: Callable[[], object], *, replays: int = 200) -> float | None:
    """Mean microseconds per replay of ``fn`` captured in a CUDA graph (None on the CPU).

    Captures one call after a warm-up on a side stream, then times ``replays`` back-to-back
    replays between two CUDA events (no L2 flush): the launch cost without Python or driver
    launch overhead. ``time_cuda_graph`` gives quantiles of individually timed replays.
    """
    if DEVICE.type != "cuda" or INTERPRET:
        return None
    graph = _capture(fn, 3)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / replays


@lru_cache(maxsize=1)
def copy_bandwidth(nbytes: int = 1 << 30) -> float | None:
    """Measured device copy bandwidth in GB/s (read + write bytes), the roofline; None on CPU."""
    if DEVICE.type != "cuda" or INTERPRET:
        return None
    import triton.testing

    src = torch.empty(nbytes // 4, dtype=torch.float32, device=DEVICE).uniform_()
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=50, rep=300, return_mode="median")
    del src, dst
    return 2 * nbytes / (ms * 1e-3) / 1e9


H200_L2_BYTES = 60e6
"""L2 size of the H200 as PyTorch reported it (132 multiprocessors and 60 MB of L2). Bandwidth figures count only launches moving
several times this, so that they measure HBM, not the cache."""


def throughput_rows(kernel: str, timing: dict, nbytes: int) -> list[dict]:
    """Tidy rows for one timed kernel: time (us) with p20/p80, GB/s over ``nbytes`` (the fewest
    bytes the launch must move), and on the GPU that GB/s as a fraction of ``copy_bandwidth()``."""
    med = float(timing["median_us"])
    rows = [
        {"kernel": kernel, "metric": "time_us", "value": med, "p20": timing["p20_us"],
         "p80": timing["p80_us"], "unit": "us", "timer": timing["timer"]},
        {"kernel": kernel, "metric": "gbps", "value": nbytes / (med * 1e-6) / 1e9,
         "unit": "GB/s", "timer": timing["timer"], "bytes": int(nbytes)},
    ]
    roof = copy_bandwidth()
    if roof:
        rows.append({"kernel": kernel, "metric": "roofline_frac", "value": rows[1]["value"] / roof,
                     "unit": "fraction", "timer": timing["timer"], "copy_gbps": roof})
    return rows


def error_rows(kernel: str, out: torch.Tensor, ref: torch.Tensor, *, tol: float,
               what: str = "") -> list[dict]:
    """Tidy rows ``max_abs`` and ``rel_l2`` for ``out`` vs ``ref``, with ``passed = rel_l2 <= tol``.

    ``what`` names the compared quantity (``"o"``, ``"state"``...)."""
    e = errors(out, ref)
    passed = e["rel_l2"] <= tol
    return [{"kernel": kernel, "metric": m, "value": v, "tolerance": tol if m == "rel_l2" else None,
             "passed": passed, "what": what} for m, v in e.items()]


@contextlib.contextmanager
def variant_kernel(module, name: str, path: str | None):
    """Within the block, ``module.<name>`` is the object of that name defined in the file
    ``path`` (``None`` or ``"lib"``: the library's own, unchanged); restored on exit.
    ``FileNotFoundError`` for a missing file, ``ValueError`` for one not ending in ``.py``,
    ``AttributeError`` naming ``name`` when the file does not define it. The launchers read
    the kernel from their module at each call, so the variant must take the library kernel's
    arguments."""
    own = getattr(module, name)
    if path in (None, "lib"):
        yield own
        return
    if not str(path).endswith(".py"):
        raise ValueError(f"{path}: not a Python file (a variant is a .py file defining {name})")
    spec = importlib.util.spec_from_file_location(f"pmll_lab_variant_{abs(hash(path))}", path)
    if spec is None:
        raise FileNotFoundError(path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    if not hasattr(mod, name):
        raise AttributeError(f"{path}: defines no {name}")
    setattr(module, name, getattr(mod, name))
    try:
        yield getattr(mod, name)
    finally:
        setattr(module, name, own)


def variant_problem(module, name: str, path: str) -> str | None:
    """Why ``path`` cannot stand in for ``module.<name>`` (``variant_kernel``), or ``None``:
    ``"lib"``, or a ``.py`` file that imports and defines ``name``. For scripts to refuse a
    bad variant before any point runs."""
    if path == "lib":
        return None
    if not os.path.isfile(path):
        return f"{path!r} is neither 'lib' nor a file"
    try:
        with variant_kernel(module, name, path):
            return None
    except Exception as exc:            # noqa: BLE001  (any failure of the file's import)
        return f"{path!r}: {exc}"


def cli_ints(ap, flag: str, text: str, *, least: int = 1, group: int | None = None) -> list:
    """A script flag's comma-separated ints, each at least ``least`` (with ``group``:
    ``;``-separated groups of that many, as tuples); ``ap.error`` naming ``flag`` otherwise,
    before any kernel runs."""
    items = [t for t in str(text).split(";" if group else ",") if t.strip()]
    try:
        vals = [tuple(int(v) for v in t.split(",")) if group else int(t) for t in items]
    except ValueError:
        vals = None
    flat = [v for t in vals for v in (t if group else (t,))] if vals else []
    if (not vals or any(v < least for v in flat)
            or (group and any(len(t) != group for t in vals))):
        shape = f"';'-separated groups of {group} comma-separated ints" if group else \
            "comma-separated ints"
        ap.error(f"{flag}: expected {shape}, each >= {least}, got {text!r}")
    return vals


def cli_out(ap, flag: str, path) -> None:
    """``ap.error`` naming ``flag`` when ``path`` (a file a script writes its rows to) is a
    folder or its folder does not exist: found before the GPU work, not after it."""
    if path is None:
        return
    p = Path(path)
    if p.is_dir() or not p.parent.is_dir():
        ap.error(f"{flag}: cannot write {path} ({'a folder' if p.is_dir() else 'no folder ' + str(p.parent)})")


def cli_gpu(ap, what: str) -> None:
    """``ap.error`` when no GPU is visible: ``what`` needs one (a timing script outside its
    ``--smoke`` mode), said before anything is measured."""
    from pmll_lab.backend import DEVICE

    if DEVICE.type != "cuda":
        ap.error(f"needs a GPU ({what}); on the CPU run its --smoke mode, where it has one")


def run_subcommand(prog: str, commands: dict, argv=None):
    """A script's subcommand: ``argv[0]`` names one of ``commands`` (name -> ``main(argv)``),
    which runs on the rest; ``-h``/``--help`` prints the usage line and exits 0; anything else
    ``SystemExit`` with the usage line (status 1)."""
    import sys

    argv = sys.argv[1:] if argv is None else list(argv)
    usage = (f"usage: {prog} {{{','.join(commands)}}} [options] "
             f"('{prog} {next(iter(commands))} --help' for a subcommand's options)")
    if argv[:1] in (["-h"], ["--help"]):
        print(usage)
        raise SystemExit(0)
    if not argv or argv[0] not in commands:
        raise SystemExit(usage)
    return commands[argv[0]](argv[1:])
