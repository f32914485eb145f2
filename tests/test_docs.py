"""The examples in the docs and docstrings run and print what they claim."""

from __future__ import annotations

import doctest
from pathlib import Path

import pytest

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


def python_blocks(markdown: Path) -> list[str]:
    """The ```python fenced blocks of a markdown file that are programs (not doctests)."""
    blocks = markdown.read_text().split("```python\n")[1:]
    return [block.split("```", 1)[0] for block in blocks if not block.lstrip().startswith(">>>")]


def test_pipeline_api_doc_examples_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each example is a whole program with its own assertions; run them as users would."""
    monkeypatch.chdir(tmp_path)
    blocks = python_blocks(DOCS / "api" / "pipeline.md")
    assert len(blocks) >= 4
    for block in blocks:
        exec(compile(block, "docs/api/pipeline.md", "exec"), {"__name__": "docs_example"})
