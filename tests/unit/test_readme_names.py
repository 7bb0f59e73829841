"""Every name README.md's examples and prose import or point at still exists (the examples that
need an engine run in tests/docker/test_readme.py; this catches a rename without one)."""

from __future__ import annotations

import importlib
import re

import pytest
from helpers import REPO

README = (REPO / "README.md").read_text()
IMPORTS = sorted(set(re.findall(r"^from (softprobe[\w.]*) import ([\w, ]+)$", README, re.M)))
DOTTED = sorted(set(re.findall(r"`(softprobe\.[\w.]+\.[A-Z]\w+)", README)))


@pytest.mark.parametrize("module, names", IMPORTS, ids=[m for m, _ in IMPORTS])
def test_readme_imports_resolve(module: str, names: str) -> None:
    loaded = importlib.import_module(module)
    missing = [n.strip() for n in names.split(",") if n.strip() and not hasattr(loaded, n.strip())]
    assert not missing, f"README imports {missing} from {module}"


@pytest.mark.parametrize("dotted", DOTTED)
def test_readme_dotted_names_resolve(dotted: str) -> None:
    if "gymnasium" in dotted:
        pytest.importorskip("gymnasium", reason="the gymnasium extra is not installed")
    module, _, name = dotted.rpartition(".")
    assert hasattr(importlib.import_module(module), name), f"README names {dotted}"


def test_the_readme_has_names_to_check() -> None:
    assert len(IMPORTS) >= 5 and DOTTED
