"""What is run, as data: every implementation (ours and the peers') registered once by name.

An ``Implementation`` is one way to compute one ``Family``'s answer (a family is one kernel
contract with a float64 reference: a decode, the whole speculative step, ...). Its ``name`` is
written only in its registration; labels, support, the row columns, plot styles and the roofline
of every report come from here. A researcher's own kernel is one more ``register`` call, in a
notebook cell or in a file named by ``PMLL_LAB_PLUGINS`` (``load_plugins``); see
``docs/adding-a-kernel.md``.

A family's ``make_case(point)`` turns one workload row into a case; an implementation's
``build(case)`` gives a ``Run`` (``harness.runner``): the runner checks it against the family's
reference, then times it, and writes rows of one schema.
"""

from __future__ import annotations

import difflib
import importlib.util
import os
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from pmll_lab.ops import settings

PROVIDERS = ("pmll_lab", "flashinfer", "sglang", "fla", "torch", "yours")
"""Who wrote an implementation (the ``provider`` column); ``yours``: registered by a researcher."""
IMPLS = ("triton", "cuda", "cute-dsl", "torch")
"""What it is written in (the ``impl`` column)."""
STATE_DTYPES = tuple(settings.STATE_DTYPES)
"""The state dtypes an implementation may take: those the launch tables have rows for."""
INPUT_DTYPES = ("float32", "bfloat16", "float16")
"""The input dtypes (``q``, ``k``, ``v``, ...; a case's ``dtype``) the families take: float64 is
the references' precision, not a kernel's."""
LAYOUTS = ("vk", "kv")
PLUGINS_ENV = "PMLL_LAB_PLUGINS"
"""Python files (``os.pathsep``-separated) whose ``register`` calls ``load_plugins`` runs."""


@dataclass(frozen=True)
class Family:
    """One kernel contract: ``make_case(point) -> case`` (inputs drawn from the point's seed);
    ``check(run, case, plain=None) -> dict``: ``errors`` (rel L2 per compared quantity against
    the float64 reference), ``tolerance`` (one, or one per quantity), ``passed``, optionally
    ``bitwise`` (quantity -> equal to ``plain``'s, the plain decoding an exact implementation
    answers to) and ``facts`` (counted figures), all before any timing; ``axes`` the workload
    columns it reads, of which ``optional`` may be left out (``make_case`` has a default);
    ``metric`` the timed quantity (``time_us`` per call, ``step_us`` per speculative step)."""

    name: str
    label: str
    axes: tuple[str, ...]
    make_case: Callable
    check: Callable
    metric: str = "time_us"
    doc: str = ""
    exact_plain: bool = False
    """Its check compares an exact implementation with that implementation's ``plain`` to the
    bit, so ``register`` refuses an exact one without ``plain``."""
    optional: tuple[str, ...] = ("seed", "dtype")

    def missing(self, point) -> list[str]:
        """The axes a workload row must give that ``point`` lacks."""
        return [a for a in self.axes if a not in self.optional and a not in point]


def _reason(name: str, reason):
    """``supports``/``available``'s answer: None (it runs) or the reason it does not, a str; a
    bool (``lambda c: c.head_dim >= 16``) would read as a reason, so it is refused."""
    if reason is not None and (not isinstance(reason, str) or not reason.strip()):
        raise ValueError(f"{name}: must return None (it runs) or the reason it does not (a "
                         f"non-empty str), got {reason!r}")
    return reason


@dataclass(frozen=True)
class Implementation:
    """One implementation of ``family``.

    ``build(case) -> Run``; ``supports(case) -> str | None`` (None: runs; else the reason, one
    ``unsupported`` row); ``available() -> str | None`` (None: importable and usable here; else
    e.g. ``"FlashInfer: not installed"``); ``version() -> str`` (the peer's package version, the
    ``peer_version`` column). ``exact``: bitwise equal to plain decoding (SPEC §3b), checked as
    such. ``layouts``/``state_dtypes``: what it takes (``supports`` adds finer limits).
    ``bytes(case, facts) -> int``: the fewest bytes a timed unit moves (``pmll_lab.sizes``;
    ``facts``: what the check run counted). ``plain(case)``: for an exact implementation, the
    plain decoding it must equal to the bit. ``style``: the plot's ``color``, ``marker``, and
    ``panel`` (the error plot's panel, ``experiments.plots.family``). ``drift``: the state
    dtypes the drift study (``pmll_lab.step_drift``) runs it on (none: not in the study)."""

    name: str
    family: str
    label: str
    build: Callable
    provider: str = "pmll_lab"
    impl: str = "triton"
    exact: bool = False
    layouts: tuple[str, ...] = ("vk",)
    state_dtypes: tuple[str, ...] = STATE_DTYPES
    gpu_only: bool = False
    supports: Callable | None = None
    available: Callable | None = None
    version: Callable | None = None
    bytes: Callable | None = None
    plain: Callable | None = None
    style: dict = field(default_factory=dict)
    doc: str = ""
    drift: tuple[str, ...] = ()

    def __post_init__(self):
        if not isinstance(self.name, str) or not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]{0,63}",
                                                              self.name):
            raise ValueError(f"name: an ASCII letter, then letters, digits and '_' (at most 64), "
                             f"got {self.name!r}")
        if self.name == "all":
            raise ValueError("name: 'all' selects every implementation; choose another name")
        if not isinstance(self.label, str) or not self.label.strip():
            raise ValueError(f"label: the text tables and plots show, got {self.label!r}")
        if self.provider not in PROVIDERS:
            raise ValueError(f"provider: one of {PROVIDERS}, got {self.provider!r}")
        if self.impl not in IMPLS:
            raise ValueError(f"impl: one of {IMPLS}, got {self.impl!r}")
        if not callable(self.build):
            raise ValueError(f"build: must be callable (case -> run), got {self.build!r}")
        for name in ("supports", "available", "version", "bytes", "plain"):
            fn = getattr(self, name)
            if fn is not None and not callable(fn):
                raise ValueError(f"{name}: a function or None, got {fn!r}")
        for name in ("exact", "gpu_only"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}: True or False, got {getattr(self, name)!r}")
        for name, values, known in (("state_dtypes", self.state_dtypes, STATE_DTYPES),
                                    ("layouts", self.layouts, LAYOUTS)):
            bad = [v for v in values if v not in known]
            if isinstance(values, str) or bad or not values:
                raise ValueError(f"{name}: a tuple of {', '.join(known)}, got {values!r}")
        bad = [v for v in self.drift if v not in self.state_dtypes]
        if isinstance(self.drift, str) or bad:
            raise ValueError(f"drift: a tuple of its state_dtypes ({', '.join(self.state_dtypes)})"
                             f", got {self.drift!r}")

    def unavailable(self) -> str | None:
        """Why it cannot run on this machine (not installed, GPU only), or None."""
        from pmll_lab.backend import DEVICE, INTERPRET

        reason = _reason("available", self.available()) if self.available else None
        if reason:
            return reason
        if self.gpu_only and (DEVICE.type != "cuda" or INTERPRET):
            return f"{self.label}: GPU only"
        return None

    def unsupported(self, case) -> str | None:
        """Why it does not take ``case`` (state dtype, layout, shape), or None."""
        sd = str(getattr(case, "state_dtype", "")).removeprefix("torch.")
        if sd and sd not in self.state_dtypes:
            return f"state_dtype {sd} not taken ({', '.join(self.state_dtypes)})"
        lay = getattr(case, "state_layout", None)
        if lay and lay not in self.layouts:
            return f"state_layout {lay!r} not taken ({', '.join(self.layouts)})"
        return _reason("supports", self.supports(case)) if self.supports else None

    def columns(self) -> dict:
        """The columns every row of this implementation carries."""
        return {"kernel": self.name, "impl": self.impl, "provider": self.provider,
                "exact": self.exact,
                "peer_version": (self.version() or None) if self.version else None}


_PLUGINS_LOADED: dict[str, tuple[tuple[int, int], dict, tuple[str, ...]]] = {}
"""Each plugin file loaded: ``(mtime_ns, size)`` when it was, the implementations it registered
(name -> the ``Implementation``) and the families it added (a changed file is loaded again in
their place)."""
FAMILIES: dict[str, Family] = {}
IMPLEMENTATIONS: dict[str, Implementation] = {}
MEMBERS: dict[str, list[str]] = {}
"""Each family's names in the order they were registered or joined (``join``)."""


def add_family(family: Family) -> Family:
    """Register a family (``ValueError`` on a second family of the same name)."""
    if family.name in FAMILIES and FAMILIES[family.name] is not family:
        raise ValueError(f"family: {family.name!r} is already registered")
    FAMILIES[family.name] = family
    MEMBERS.setdefault(family.name, [])
    return family


REGISTERED_IN: dict[str, str] = {}
"""The module whose ``register`` call made each name (a plugin file's: ``pmll_lab_plugin_<stem>``)."""


def register(impl: Implementation, *, replace: bool = False) -> Implementation:
    """Register ``impl`` under its name. ``ValueError`` for an unknown family, an exact
    implementation without ``plain`` in a family that checks it against one (``exact_plain``),
    or a name already taken unless ``replace`` (a notebook cell re-run replaces its own kernel; only an
    implementation of provider ``"yours"`` can be replaced)."""
    if impl.family not in FAMILIES:
        raise ValueError(f"family: {impl.family!r} is not a registered family "
                         f"({', '.join(sorted(FAMILIES))})")
    if impl.exact and impl.plain is None and FAMILIES[impl.family].exact_plain:
        raise ValueError(f"plain: an exact {impl.family} implementation gives plain(case), the "
                         "plain decoding it must equal to the bit (harness.step_forms."
                         "build_plain), or is registered with exact=False")
    old = IMPLEMENTATIONS.get(impl.name)
    if old is not None and not replace:
        raise ValueError(f"name: {impl.name!r} is already registered ({old.label}); pass "
                         f"replace=True to replace it")
    if old is not None and old.provider != "yours":
        raise ValueError(f"name: {impl.name!r} is {old.label} ({old.provider}'s); choose "
                         "another name for yours (replace=True replaces only your own)")
    if old is not None and impl.provider != "yours":
        raise ValueError(f"provider: {impl.name!r} replaces your own implementation, so it is "
                         f"yours too (provider='yours'), got {impl.provider!r}")
    if old is not None and old.family != impl.family:
        MEMBERS[old.family].remove(impl.name)
    if impl.name not in MEMBERS[impl.family]:
        MEMBERS[impl.family].append(impl.name)
    IMPLEMENTATIONS[impl.name] = impl
    REGISTERED_IN[impl.name] = sys._getframe(1).f_globals.get("__name__", "?")
    return impl


def join(family: str, impl: Implementation | str) -> Implementation:
    """List an implementation registered in another family under ``family`` too, by the same
    name: the same kernel, run there by ``family``'s own runner (e.g. FlashInfer's decode, a
    ``gdn_decode`` implementation, is the roofline's one-row verify). Its registration (label,
    provider, impl, layouts, state dtypes, style) holds in both; its ``build`` stays its own
    family's. ``ValueError`` for an unknown family or name; joining twice is a no-op."""
    if family not in FAMILIES:
        raise ValueError(f"family: no family {family!r} ({', '.join(sorted(FAMILIES))})")
    impl = get(impl if isinstance(impl, str) else impl.name)
    if impl.name not in MEMBERS[family]:
        MEMBERS[family].append(impl.name)
    return impl


def unregister(name: str) -> None:
    """Remove a registered implementation (a researcher's, after a try), from every family it
    was registered in or joined."""
    get(name)
    del IMPLEMENTATIONS[name]
    for members in MEMBERS.values():
        if name in members:
            members.remove(name)


def _env_plugins() -> None:
    """The files of ``$PMLL_LAB_PLUGINS``, loaded at the first lookup (and again when the
    variable names a file not yet loaded)."""
    if os.environ.get(PLUGINS_ENV):
        load_plugins()


def get(name: str) -> Implementation:
    """The implementation registered as ``name``; ``ValueError`` naming it (with the closest
    registered names) when there is none."""
    if name not in IMPLEMENTATIONS:
        _env_plugins()
    if name not in IMPLEMENTATIONS:
        close = difflib.get_close_matches(str(name), list(IMPLEMENTATIONS), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"name: no implementation registered as {name!r}{hint}")
    return IMPLEMENTATIONS[name]


def family(name: str) -> Family:
    """The family registered as ``name`` (``ValueError`` naming it otherwise)."""
    if name not in FAMILIES:
        raise ValueError(f"family: no family {name!r} ({', '.join(sorted(FAMILIES))})")
    return FAMILIES[name]


def names(family: str | None = None, *, provider: str | None = None,
          exact: bool | None = None) -> list[str]:
    """Registered names, in registration order, filtered by family (its own and those it
    ``join``ed, in the order they were registered or joined), provider and exactness
    (``$PMLL_LAB_PLUGINS``'s files loaded first)."""
    _env_plugins()
    if family is not None and family not in FAMILIES:
        raise ValueError(f"family: no family {family!r} ({', '.join(sorted(FAMILIES))})")
    pool = IMPLEMENTATIONS if family is None else MEMBERS.get(family, [])
    return [n for n in pool
            if (provider is None or IMPLEMENTATIONS[n].provider == provider)
            and (exact is None or IMPLEMENTATIONS[n].exact == exact)]


def resolve(family: str, selection: str | Iterable[str] | None, *, arg: str = "forms"
            ) -> list[str]:
    """The names a sweep runs: ``None`` or ``"all"``: every implementation of ``family``; a
    ``"+"``-joined string or a list: those, each checked (``ValueError`` naming ``arg``, the
    caller's argument, for an empty selection, a name given twice, a name not registered or
    one of another family)."""
    if selection is None or selection == "all":
        return names(family)
    if not isinstance(selection, str) and (not isinstance(selection, Iterable)
                                           or not all(isinstance(n, str) for n in selection)):
        raise ValueError(f"{arg}: registry names, a '+'-joined string or a list, got "
                         f"{selection!r}")
    chosen = selection.split("+") if isinstance(selection, str) else list(selection)
    if not chosen or chosen == [""]:
        raise ValueError(f"{arg}: no implementation named (\"all\" runs every one of {family})")
    twice = sorted({n for n in chosen if chosen.count(n) > 1})
    if twice:
        raise ValueError(f"{arg}: {', '.join(twice)} named twice")
    for n in chosen:
        if n not in IMPLEMENTATIONS:
            _env_plugins()
        if n not in IMPLEMENTATIONS:
            close = difflib.get_close_matches(str(n), names(family), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise ValueError(f"{arg}: no implementation registered as {n!r}{hint} "
                             f"({family}: {', '.join(names(family))})")
        impl = IMPLEMENTATIONS[n]
        if n not in MEMBERS.get(family, ()):
            raise ValueError(f"{arg}: {n!r} is a {impl.family} implementation, not {family}")
    return chosen


def table() -> list[dict]:
    """One row per registered implementation: ``name, family, label, provider, impl, exact,
    gpu_only, module`` (the module whose ``register`` call made it: ``REGISTERED_IN``), in
    registration order, ``$PMLL_LAB_PLUGINS``'s files loaded first; ``python -m
    pmll_lab.harness`` prints it."""
    _env_plugins()
    return [dict(name=i.name, family=i.family, label=i.label, provider=i.provider,
                 impl=i.impl, exact=i.exact, gpu_only=i.gpu_only,
                 module=REGISTERED_IN.get(i.name, getattr(i.build, "__module__", "?")))
            for i in IMPLEMENTATIONS.values()]


def labels() -> dict[str, str]:
    """Every registered name's label (plots and tables)."""
    return {n: i.label for n, i in IMPLEMENTATIONS.items()}


def label(name: str) -> str:
    """The label of ``name``; an unregistered name (an older run's kernel) is shown as is."""
    impl = IMPLEMENTATIONS.get(name)
    return impl.label if impl else str(name)


def load_plugins(paths: str | Iterable[str] | None = None) -> list[str]:
    """Import each Python file of ``paths`` (default: ``$PMLL_LAB_PLUGINS``, separated by
    ``os.pathsep``): their ``register`` calls add implementations. A file already loaded and
    unchanged since is not imported again; one edited since (a notebook cell re-run after a fix)
    is, its earlier registrations removed first; one that raised or registered nothing left the
    registry as it was and loads again when asked. Returns the files imported by this call;
    ``ValueError`` naming ``PMLL_LAB_PLUGINS`` (or ``plugins``) for a file that does not exist,
    ``RuntimeError`` for one that raised."""
    what = PLUGINS_ENV if paths is None else "plugins"
    if paths is None:
        paths = [p for p in os.environ.get(PLUGINS_ENV, "").split(os.pathsep) if p]
    elif isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    elif not isinstance(paths, Iterable) or not all(isinstance(p, (str, os.PathLike))
                                                    for p in paths):
        raise ValueError(f"{what}: a file's path or a list of them, got {paths!r}")
    loaded = []
    for p in paths:
        path = Path(p).expanduser().resolve()
        if not path.is_file():
            raise ValueError(f"{what}: no such file {str(p)!r} (from {os.getcwd()})")
        st = path.stat()
        stamp = (st.st_mtime_ns, st.st_size)
        prev = _PLUGINS_LOADED.get(str(path))
        if prev is not None and prev[0] == stamp:
            continue
        saved = (dict(IMPLEMENTATIONS), dict(FAMILIES),
                 {f: list(m) for f, m in MEMBERS.items()}, dict(REGISTERED_IN))
        if prev is not None:                           # edited since: its old entries go first
            for name, impl in prev[1].items():
                if IMPLEMENTATIONS.get(name) is impl:   # still its own (not another file's since)
                    unregister(name)
            for fam in prev[2]:
                FAMILIES.pop(fam, None)
                MEMBERS.pop(fam, None)
        before = (dict(IMPLEMENTATIONS), dict(FAMILIES))
        spec = importlib.util.spec_from_file_location(f"pmll_lab_plugin_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            _restore(saved)
            raise RuntimeError(f"{what}: {path} raised {type(exc).__name__}: {exc}") from exc
        if before == (IMPLEMENTATIONS, FAMILIES):   # nothing added or replaced
            _restore(saved)
            raise ValueError(f"{what}: {path} registered nothing (a plugin calls "
                             "pmll_lab.harness.registry.register; docs/adding-a-kernel.md)")
        added = {n: i for n, i in IMPLEMENTATIONS.items() if before[0].get(n) is not i}
        families = tuple(f for f in FAMILIES if f not in before[1])
        _PLUGINS_LOADED[str(path)] = (stamp, added, families)
        loaded.append(str(path))
    return loaded


def _restore(saved) -> None:
    """The registry as ``saved`` (``load_plugins``' copy) held it: a plugin that failed leaves
    nothing half-registered."""
    for table, old in zip((IMPLEMENTATIONS, FAMILIES, MEMBERS, REGISTERED_IN), saved):
        table.clear()
        table.update(old)
