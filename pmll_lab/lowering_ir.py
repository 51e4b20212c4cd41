"""Reading compiled Triton IR for ``pmll_lab.lowering``: the layouts of a kernel's reductions, key
sums whose first fused multiply-add runs across lanes, and register/spill counts from SASS.

Regular expressions over a compiled kernel's TTGIR, and its cubin read with Triton's
``cuobjdump``; the compiling and the family checks are in ``pmll_lab.lowering``.
"""

from __future__ import annotations

import re

_LAYOUT_DEF = re.compile(r"^(#[\w.]+) = (#ttg\.[^\n]*?)(?:\s+loc\(.*\))?$", re.M)
_ALIAS = re.compile(r"#[A-Za-z_][\w.]*")


def _operand_type(line: str) -> str:
    """The first operand type of a region op's closing line ``}) : (tensor<...>, ...) -> ...``,
    brackets balanced (layouts may be written inline, e.g. ``#ttg.slice<{..., parent = ...}>``)."""
    start = line.index(": (") + 3
    depth = 0
    for i in range(start, len(line)):
        c = line[i]
        if c in "<({[":
            depth += 1
        elif c in ">)}]":
            if depth == 0:
                return line[start:i]
            depth -= 1
        elif c == "," and depth == 0:
            return line[start:i]
    raise ValueError(f"ttgir: no operand type in {line.strip()!r}")


def reduction_layouts(ttgir: str) -> list[str]:
    """The operand layout of every ``tt.reduce`` in a TTGIR module, in program order, each as
    ``"<shape x type>, <layout>"`` with every layout alias (``#blocked1``, also inside a
    ``parent = ...``) replaced by its definition. Raises ``ValueError`` when a reduce's closing
    line cannot be found or parsed (so no reduction is silently left out)."""
    defs = dict(_LAYOUT_DEF.findall(ttgir))

    def resolve(text: str, depth: int = 0) -> str:
        if depth > 8:
            return text
        return _ALIAS.sub(lambda m: resolve(defs[m.group(0)], depth + 1)
                          if m.group(0) in defs else m.group(0), text)

    lines = ttgir.splitlines()
    out = []
    for i, line in enumerate(lines):
        if '"tt.reduce"(' not in line:
            continue
        opened = 0
        for j in range(i, len(lines)):
            opened += lines[j].count("({") - lines[j].count("})")
            if opened <= 0 and "})" in lines[j]:
                break
        else:
            raise ValueError(f"ttgir: unterminated tt.reduce at line {i + 1}")
        operand = _operand_type(lines[j])
        if not operand.startswith("tensor<") or not operand.endswith(">"):
            raise ValueError(f"ttgir: unexpected reduce operand {operand!r} at line {j + 1}")
        shape, _, layout = operand[len("tensor<"):-1].partition(", ")
        out.append(f"{shape}, {resolve(layout.strip())}")
    return out


_BLOCKED = re.compile(r"#ttg\.blocked<\{sizePerThread = \[([\d, ]+)\], threadsPerWarp = "
                      r"\[([\d, ]+)\], warpsPerCTA = \[([\d, ]+)\]")
_REDUCE_HEAD = re.compile(r'"tt\.reduce"\(([^)]*)\) <\{axis = (\d+) : i32\}>')


def lane_split_fma_sums(ttgir: str) -> list[str]:
    """The reductions of two operands (``recurrence.dot_fma``'s products, combined by
    ``fma(c, d, a * b)``) whose operand layout gives each thread a single element along the
    reduced axis (``sizePerThread`` times the layout's repeats over the shape) while several
    lanes or warps share that axis, as ``"<shape>, axis <n>,
    <layout>"``. There the first combine meets two raw products across lanes, and a butterfly
    reduction leaves each lane its own rounding of the sum (the combine is not commutative),
    so a value stashed from one lane does not replay the other lanes' rows
    (``recurrence.kv_state_vector``). A layout that is not ``#ttg.blocked`` is listed too
    (the check cannot read it)."""
    defs = dict(_LAYOUT_DEF.findall(ttgir))
    lines = ttgir.splitlines()
    out = []
    for i, line in enumerate(lines):
        head = _REDUCE_HEAD.search(line)
        if head is None or head.group(1).count(",") != 1:
            continue
        axis = int(head.group(2))
        opened = 0
        for j in range(i, len(lines)):
            opened += lines[j].count("({") - lines[j].count("})")
            if opened <= 0 and "})" in lines[j]:
                break
        operand = _operand_type(lines[j])
        shape, _, layout = operand[len("tensor<"):-1].partition(", ")
        layout = layout.strip()
        text = defs.get(layout, layout)
        m = _BLOCKED.search(text)
        if m is None:
            out.append(f"{shape}, axis {axis}, {text}")
            continue
        per, lanes, warps = ([int(x) for x in g.split(",")] for g in m.groups())
        extent = int(shape.split("x")[axis])
        tile = per[axis] * lanes[axis] * warps[axis]       # the layout's span along the axis
        held = per[axis] * max(1, extent // tile)          # elements a thread holds along it
        if held == 1 and extent > 1 and lanes[axis] * warps[axis] > 1:
            out.append(f"{shape}, axis {axis}, {text}")
    return out


def sass_stats(compiled) -> dict:
    """Registers and SASS instruction mix of a kernel from :func:`lower`, read from its cubin
    with the ``cuobjdump`` that ships with Triton: ``{"registers", "stack_bytes",
    "shared_bytes", "instructions", "mix": {opcode: count}}`` (opcodes without modifiers, e.g.
    ``FFMA``, ``SHFL``). Static counts: every unrolled row counts once, a loop body once.
    Raises ``RuntimeError`` if ``cuobjdump`` is missing or fails."""
    import os
    import subprocess
    import tempfile
    from collections import Counter

    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if not os.path.exists(tool):
        raise RuntimeError(f"cuobjdump not found at {tool} (it ships with Triton's NVIDIA backend)")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(compiled.asm["cubin"])
        outs = []
        for flag in ("-res-usage", "-sass"):
            run = subprocess.run([tool, flag, path], capture_output=True, text=True)
            if run.returncode != 0:
                raise RuntimeError(f"cuobjdump {flag} failed: {run.stderr.strip()[:500]}")
            outs.append(run.stdout)
    usage = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+)", outs[0])
    if usage is None:
        raise RuntimeError("cuobjdump -res-usage: no REG/STACK/SHARED line")
    ops = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", outs[1])
    return {"registers": int(usage.group(1)), "stack_bytes": int(usage.group(2)),
            "shared_bytes": int(usage.group(3)), "instructions": len(ops),
            "mix": dict(Counter(ops).most_common())}
