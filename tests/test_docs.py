"""The examples in the docs and docstrings run and print what they claim."""

from __future__ import annotations

import dataclasses
import doctest
import re
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


@pytest.mark.jvm
def test_pipeline_api_doc_examples_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each example is a whole program with its own assertions; run them as users would."""
    monkeypatch.chdir(tmp_path)
    blocks = python_blocks(DOCS / "api" / "pipeline.md")
    assert len(blocks) >= 4
    for block in blocks:
        exec(compile(block, "docs/api/pipeline.md", "exec"), {"__name__": "docs_example"})


def test_every_public_member_of_the_process_api_is_documented() -> None:
    """What a ``process`` function receives: every public attribute of KeyedBatch, KeyedState
    and the state views is named in docs/api/pipeline.md."""
    from keyflow import KeyedBatch, KeyedState
    from keyflow.state import keyed as views

    classes = [KeyedBatch, KeyedState, views.ValueStateView, views.ListStateView, views.MapStateView]
    public = {name for cls in classes for name in dir(cls) if not name.startswith("_")}
    public |= {field.name for field in dataclasses.fields(KeyedBatch)}
    reference = (DOCS / "api" / "pipeline.md").read_text()
    missing = sorted(name for name in public if f"`{name}`" not in reference and f"`{name}(" not in reference)
    assert not missing, f"missing from the KeyedBatch and state view tables of docs/api/pipeline.md: {missing}"


def test_every_configuration_key_is_documented() -> None:
    from keyflow.config import ALIASES, OPTIONS

    reference = (DOCS / "configuration.md").read_text()
    missing = [key for key in OPTIONS if f"`{key}`" not in reference]
    assert not missing, f"keys missing from docs/configuration.md: {missing}"
    for alias in ALIASES:
        assert alias.rsplit("adaptive-scheduler.", 1)[1] in reference


def test_the_scheduler_timelines_of_the_docs_are_drawn(tmp_path: Path) -> None:
    import runpy

    drawing = runpy.run_path(str(DOCS / "scheduler_timelines.py"))
    drawing["main"](tmp_path)
    drawn = sorted(path.name for path in tmp_path.glob("*.png"))
    assert drawn == sorted(f"scheduler-{name}.png" for name in drawing["SCENARIOS"])
    for name in drawn:
        assert f"img/{name}" in (DOCS / "operations.md").read_text()

    # What the titles claim, from the state machine itself.
    def changes(name: str) -> list[tuple[float, int, int]]:
        _title, config, slots_at, end = drawing["SCENARIOS"][name]
        records = drawing["simulate"](config, slots_at, end)
        return [(r["time"], r["from"], r["to"]) for r in records if r["kind"] == "decision" and r["from"] != r["to"]]

    # A rescale restarts the job: it runs at the new parallelism 10 s (stabilization) after the decision.
    assert changes("scaling-interval-min") == [(10, 0, 2), (50, 2, 5), (90, 5, 6)]  # checks at 40 and 80
    assert changes("scaling-interval-max") == [(10, 0, 2), (100, 2, 3)]  # forced at 90 by the check at 30
    assert changes("min-parallelism-increase")[1:] == [(70, 2, 5), (190, 5, 6)]
    assert changes("resource-stabilization-timeout") == [(10, 0, 4), (40, 4, 2)]
    assert changes("resource-wait-timeout") == [(5, 0, 2), (50, 2, 0)]


def test_user_docs_link_only_to_files_in_the_repository() -> None:
    """Every relative link in README.md and docs/ resolves to a file of this repository (a
    user's clone has nothing beside it)."""
    root = Path(__file__).resolve().parent.parent
    broken = []
    for page in [root / "README.md", *sorted((root / "docs").rglob("*.md"))]:
        text = page.read_text()
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text) + re.findall(r"`(\.\./[^`\s]+)`", text):
            if "://" in target or target.startswith("mailto:"):
                continue
            resolved = (page.parent / target).resolve()
            if not resolved.is_relative_to(root) or not resolved.exists():
                broken.append(f"{page.relative_to(root)}: {target}")
    assert broken == []
