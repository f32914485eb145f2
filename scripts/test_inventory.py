"""List every test function and what it asserts; compare the list with another commit's.

    .venv/bin/python scripts/test_inventory.py                 # every test and its checks
    .venv/bin/python scripts/test_inventory.py --against REV   # checks of REV missing now

A check is an ``assert`` (its condition, message left out), a ``pytest.raises``/``warns``
(with its ``match``), or a call of an ``assert*`` function, written as ``ast.unparse`` writes
it so that formatting does not matter. Helpers that tests call are listed under their own
names, since a check may move from a test into a helper it calls. Comparing with ``--against``
names each check of REV that no longer appears anywhere in the tests, with its old test: when
tests are merged or moved, those lines are what the change must account for.
"""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHECK_CALLS = ("raises", "warns")


def checks(function: ast.FunctionDef) -> Iterator[str]:
    for node in ast.walk(function):
        if isinstance(node, ast.Assert):
            yield f"assert {ast.unparse(node.test)}"
        elif isinstance(node, ast.Call):
            name = ast.unparse(node.func).rsplit(".", 1)[-1]
            if name.startswith("assert") or name in CHECK_CALLS:
                yield ast.unparse(node)


def inventory(files: dict[str, str]) -> dict[str, list[str]]:
    """``file::function`` -> its checks, for every function that has any (tests and helpers)."""
    found: dict[str, list[str]] = {}
    for path, source in sorted(files.items()):
        for node in ast.walk(ast.parse(source, path)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                listed = list(checks(node))  # type: ignore[arg-type]
                if listed or node.name.startswith("test_"):
                    found[f"{path}::{node.name}"] = listed
    return found


def current_files() -> dict[str, str]:
    return {str(path.relative_to(ROOT)): path.read_text() for path in sorted((ROOT / "tests").rglob("*.py"))}


def files_at(revision: str) -> dict[str, str]:
    listed = subprocess.run(
        ["git", "ls-tree", "-r", "--name-only", revision, "tests"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    return {
        path: subprocess.run(
            ["git", "show", f"{revision}:{path}"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout
        for path in listed
        if path.endswith(".py")
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", metavar="REV", help="list the checks of REV that no test has now")
    args = parser.parse_args()
    now = inventory(current_files())
    if not args.against:
        for name, listed in now.items():
            print(name)
            for check in listed:
                print(f"    {check}")
        tests = sum(1 for name in now if name.rsplit("::", 1)[1].startswith("test_"))
        print(f"{tests} test functions, {sum(map(len, now.values()))} checks")
        return 0
    present = {check for listed in now.values() for check in listed}
    missing = [
        (name, check)
        for name, listed in inventory(files_at(args.against)).items()
        for check in listed
        if check not in present
    ]
    for name, check in missing:
        print(f"{name}\n    {check}")
    print(f"{len(missing)} checks of {args.against} not found in the tests now")
    return 0


if __name__ == "__main__":
    sys.exit(main())
