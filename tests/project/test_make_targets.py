"""Every target the Makefile declares is documented in ``docs/setup.md`` (README points there
for "the other targets"), so a newcomer can find, e.g., the set-up on its own."""

from __future__ import annotations

import re
from _paths import ROOT


def test_setup_doc_names_every_make_target():
    makefile = (ROOT / "Makefile").read_text()
    phony = re.search(r"^\.PHONY:(.*)$", makefile, re.M)
    assert phony, "Makefile declares no .PHONY targets"
    targets = phony.group(1).split()
    assert {"report", "test", "lab", "install"} <= set(targets), targets
    doc = (ROOT / "docs" / "setup.md").read_text()
    missing = [t for t in targets if f"`make {t}" not in doc]
    assert not missing, f"docs/setup.md does not name make targets {missing}"
