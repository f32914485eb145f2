"""The examples in the docs and docstrings run and print what they claim."""

from __future__ import annotations

import doctest
from pathlib import Path

import keyflow.keygroups

DOCS = Path(__file__).resolve().parent.parent / "docs"


def test_keygroups_api_doc_examples() -> None:
    result = doctest.testfile(str(DOCS / "api" / "keygroups.md"), module_relative=False, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 15
    assert result.failed == 0


def test_keygroups_module_docstring_examples() -> None:
    result = doctest.testmod(keyflow.keygroups)
    assert result.attempted >= 3
    assert result.failed == 0
