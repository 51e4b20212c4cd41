"""``python -m pmll_lab.harness [--family NAME]``: every registered implementation (the files of
``$PMLL_LAB_PLUGINS`` loaded first), one line each (name, family, provider, impl, exact, the
module that registers it, label; ``registry.table``); ``--family`` keeps one family's, those
joined to it from another family included (``registry.join``)."""

import argparse
import sys

import pmll_lab  # noqa: F401  (picks the device first; importing it registers the catalog)
from pmll_lab.harness import registry

ap = argparse.ArgumentParser(prog="python -m pmll_lab.harness",
                             description="the registered implementations, one line each")
ap.add_argument("--family", default=None, help="only this family's (e.g. gdn_step)")
args = ap.parse_args()
try:
    rows = registry.table()
except (ValueError, RuntimeError) as exc:        # a plugin file that does not load
    ap.error(str(exc))
if args.family is not None:
    if args.family not in registry.FAMILIES:
        ap.error(f"--family: no family {args.family!r} ({', '.join(sorted(registry.FAMILIES))})")
    members = registry.names(args.family)          # its own and those joined to it
    rows = sorted((dict(r, family=args.family if r["family"] == args.family
                        else f"{args.family} (joined from {r['family']})")
                   for r in rows if r["name"] in members), key=lambda r: members.index(r["name"]))
cols = ("name", "family", "provider", "impl", "exact", "module", "label")
width = {c: max([len(c), *(len(str(r[c])) for r in rows)]) for c in cols}
print("  ".join(c.ljust(width[c]) for c in cols).rstrip())
for r in rows:
    print("  ".join(str(r[c]).ljust(width[c]) for c in cols).rstrip())
sys.exit(0)
