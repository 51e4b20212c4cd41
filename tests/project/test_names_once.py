"""Each registry name is written once: at its registration.

Why: one place to rename a kernel. Every other use of an implementation's name (targets'
columns, a report's list of kernels, a script's pairs, the drift study's forms) goes through the
registering module's constant (``step_forms.EXACT_LAZY.name``, ``verify.CHAIN.name``,
``step_sglang.EXACT_FOLD``...) or a registry query (``registry.names("gdn_step")``,
``Implementation.drift``), so renaming one is one edit and a name no one registers cannot hide in a
list that silently selects nothing.

Read with ``ast`` (nothing imported but the registry): every string constant, docstrings aside,
of the ``.py`` files under ``pmll_lab/`` and ``scripts/`` and of the notebooks' code cells. Left
out on purpose: the data files that select by name (``pmll_lab/harness/workloads.toml``, the
target table ``pmll_lab/experiments/target_table.py``, ``scripts/*.sh`` command lines), each
notebook's ``parameters`` cell (papermill's, how a run selects implementations by name), tests
and docs; and the strings listed in ``UNRELATED``: the same word in another meaning (a
``ServingCache`` form, a step's phase, a settings section, a subcommand).
"""

from __future__ import annotations

import ast
import json
from collections import Counter, defaultdict

from _paths import ROOT

from pmll_lab.harness import registry

ALLOWED_FILES = {"pmll_lab/experiments/target_table.py"}
"""Python data files that select implementations by name (targets keyed by registry names)."""

UNRELATED: dict[tuple[str, str], tuple[int, str]] = {
    ("pmll_lab/models/cache.py", "ring"): (3, "a ServingCache form (FORMS)"),
    ("pmll_lab/models/cache.py", "decode"): (4, "the cache's phase (decode or verify)"),
    ("pmll_lab/models/generate.py", "decode"): (1, "a step's kind in the generation stats"),
    ("pmll_lab/experiments/spec_decode.py", "decode"): (2, "a step's kind in the stats"),
    ("pmll_lab/experiments/tokens.py", "ring"): (2, "the ServingCache form a tokens form uses"),
    ("pmll_lab/ops/gdn/decode_cuda.py", "decode"): (1, "the launcher named in an error"),
    ("pmll_lab/ops/carry/ring.py", "ring"): (2, "an argument named in an error"),
    ("pmll_lab/ops/settings.py", "ring"): (2, "a settings section"),
    ("pmll_lab/serving/ring_step.py", "ring"): (1, "an argument named in an error"),
    ("scripts/tune_pmll.py", "ring"): (1, "a subcommand"),
    ("scripts/bench_twins.py", "decode"): (2, "a speed row's label (decode or chain)"),
    ("scripts/tune_gdn.py", "decode"): (1, "a tuning label of the bare gdn_decode launcher"),
}
"""``(file, word) -> (count, meaning)``: the registry's words in another meaning, counted, so a
registry name added to one of these files still fails."""


def _strings(tree: ast.AST):
    """String constants that are not docstrings (a bare string statement is one)."""
    doc = {id(n.value) for n in ast.walk(tree)
           if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    return [n for n in ast.walk(tree) if isinstance(n, ast.Constant)
            and isinstance(n.value, str) and id(n) not in doc]


def _sources():
    """``(place, source)`` for every Python file and notebook code cell scanned."""
    for path in sorted([*ROOT.glob("pmll_lab/**/*.py"), *ROOT.glob("scripts/*.py")]):
        rel = path.relative_to(ROOT).as_posix()
        if rel not in ALLOWED_FILES:
            yield rel, path.read_text()
    for nb in sorted(ROOT.glob("notebooks/*.ipynb")):
        rel = nb.relative_to(ROOT).as_posix()
        for i, cell in enumerate(json.loads(nb.read_text())["cells"]):
            if cell["cell_type"] != "code" or "parameters" in cell.get("metadata", {}).get(
                    "tags", []):
                continue
            src = "".join(cell["source"])
            lines = [ln for ln in src.splitlines() if not ln.lstrip().startswith(("%", "!"))]
            yield f"{rel}[cell {i}]", "\n".join(lines)


def occurrences() -> dict[str, list[str]]:
    """Registry name -> the places (``file:line``) it is written as a string, the unrelated
    uses of ``UNRELATED`` taken out."""
    names = set(registry.names())
    found: dict[str, list[str]] = defaultdict(list)
    per_file: Counter = Counter()
    for place, src in _sources():
        for node in _strings(ast.parse(src, filename=place)):
            if node.value in names:
                file = place.split("[")[0]
                per_file[file, node.value] += 1
                found[node.value].append(f"{place}:{node.lineno}")
    for (file, word), (count, meaning) in UNRELATED.items():
        assert per_file[file, word] == count, (
            f"{file}: {per_file[file, word]} string(s) {word!r}, UNRELATED expects {count} "
            f"({meaning}); a registry name there: the registering module's constant instead")
        found[word] = [p for p in found[word] if not p.startswith(f"{file}:")]
    return found


def test_each_registry_name_is_written_once_at_its_registration():
    found = occurrences()
    names = registry.names()
    assert names, "no registered implementation"
    bad = {n: found.get(n, []) for n in names if len(found.get(n, [])) != 1}
    assert not bad, "\n".join(
        f"{n!r} written {len(p)} times (once, at its registration, expected; elsewhere use the "
        f"registering module's constant or a registry query): {', '.join(p) or 'nowhere'}"
        for n, p in sorted(bad.items()))
    elsewhere = {n: p[0] for n, p in found.items() if n in names
                 and not p[0].startswith("pmll_lab/harness/")}
    assert not elsewhere, f"registered outside pmll_lab/harness/: {elsewhere}"

