"""The test tree itself: pytest imports test files by basename (rootdir-relative, no packages),
so two files of the same name in different tiers make the whole run fail at collection."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).parents[1]


def test_test_file_names_are_unique_across_tiers() -> None:
    names = Counter(path.name for path in TESTS.rglob("test_*.py"))
    assert [name for name, count in names.items() if count > 1] == []
