"""Per test file: seconds, JVMs and SparkContexts started, before and after, as a Markdown table.

    KEYFLOW_TEST_COSTS=before.json make test    # tests/costs.py writes the JSON
    .venv/bin/python scripts/test_costs.py before.json after.json

Seconds are the sum of each file's tests (setup, call and teardown); with ``-n 2`` two files
run at once, so the wall time of the run is less than the sum.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(before_path: str, after_path: str) -> None:
    before, after = (json.loads(Path(path).read_text()) for path in (before_path, after_path))
    files = sorted(
        set(before["files"]) | set(after["files"]), key=lambda f: -before["files"].get(f, {}).get("seconds", 0)
    )
    print("| file | tests | s before | s after | JVMs before | JVMs after | contexts before | contexts after |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|")
    empty = {"tests": 0, "seconds": 0.0, "jvms": 0, "spark_contexts": 0}
    for name in files:
        old, new = before["files"].get(name, empty), after["files"].get(name, empty)
        print(
            f"| {name.removeprefix('tests/')} | {new['tests']} | {old['seconds']:.0f} | {new['seconds']:.0f} "
            f"| {old['jvms']} | {new['jvms']} | {old['spark_contexts']} | {new['spark_contexts']} |"
        )
    total = {key: sum(row[key] for row in after["files"].values()) for key in empty}
    was = {key: sum(row[key] for row in before["files"].values()) for key in empty}
    print(
        f"| **all** | {total['tests']} | {was['seconds']:.0f} | {total['seconds']:.0f} | {was['jvms']} "
        f"| {total['jvms']} | {was['spark_contexts']} | {total['spark_contexts']} |"
    )
    print(f"\nwall time of the pytest run: {before['wall_seconds']:.0f} s before, {after['wall_seconds']:.0f} s after")


if __name__ == "__main__":
    main(*sys.argv[1:3])
