"""``python -m pmll_lab.harness``: every registered implementation, one line each (name,
family, provider, impl, exact, the module that registers it, label; ``registry.table``)."""

import pmll_lab  # noqa: F401  (picks the device first; importing it registers the catalog)
from pmll_lab.harness import registry

rows = registry.table()
cols = ("name", "family", "provider", "impl", "exact", "module", "label")
width = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in cols}
print("  ".join(c.ljust(width[c]) for c in cols).rstrip())
for r in rows:
    print("  ".join(str(r[c]).ljust(width[c]) for c in cols).rstrip())
