"""The layers hold: imports go one way, and the pure layers never load Spark.

Data flows API and SQL → one plan builder → plan → runtime → state and sinks. Each rule
below reads the package's import statements (with ``ast``, every statement, also those
inside functions) and fails naming the file, the line and the forbidden import.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from keyflow import _EXPORTS

PACKAGE = Path(__file__).resolve().parent.parent / "keyflow"
BASE = {"errors", "paths", "s3", "keygroups", "hashing", "config", "schemas", "changelog", "__init__"}
SPARK = ("pyspark", "py4j")

# Which of keyflow's layers each layer may import; anything else is a violation.
ALLOWED: dict[str, set[str]] = {
    "base": {"base"},
    "plan": {"base", "plan"},
    "scheduler": {"base", "scheduler"},
    "state": {"base", "plan", "scheduler", "state"},
    "connectors": {"base", "connectors"},
    "runtime": {"base", "plan", "scheduler", "state", "connectors", "runtime"},
    "api": {"base", "plan", "state", "connectors", "api", "runtime", "sql"},
    "sql": {"base", "plan", "connectors", "sql"},  # a front end, like api: SQL onto the plan builder
    "cli": {"base", "plan", "scheduler", "state", "connectors", "runtime", "api", "sql", "cli"},
}
PURE = {"base", "plan", "scheduler", "state"}  # no Spark, not even inside a function
# Allowed only inside functions: importing the API loads no Spark.
LAZY_ONLY = {("api", "runtime"), ("api", "sql")}


@dataclass(frozen=True)
class Import:
    module: str
    line: int
    top_level: bool


def layer(module: str) -> str:
    """``keyflow.runtime.frames`` -> ``runtime``; base modules -> ``base``."""
    parts = module.split(".")
    if len(parts) > 1 and parts[1] == "__main__":
        return "cli"  # python -m keyflow
    if parts[:3] == ["keyflow", "connectors", "base"]:
        return "base"  # the connector contracts, Spark only in annotations: the plan checks capabilities
    return "base" if len(parts) < 2 or parts[1] in BASE else parts[1]


def imports(source: str, module: str) -> list[Import]:
    """Every module ``source`` imports (relative imports resolved against ``module``)."""
    tree = ast.parse(source)
    top_level = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            # `import keyflow` is the public API (its names load keyflow.api lazily)
            names = ["keyflow.api" if alias.name == "keyflow" else alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(module.split(".")[: -node.level] + ([base] if base else []))
            if base == "keyflow":  # `from keyflow import X`: where X really lives
                names = [_EXPORTS.get(alias.name, f"keyflow.{alias.name}") for alias in node.names]
            else:
                names = [base] + [f"{base}.{alias.name}" for alias in node.names if base.startswith("keyflow")]
        else:
            continue
        found += [Import(name, node.lineno, id(node) in top_level) for name in names]
    return found


def type_checking_only(source: str) -> set[int]:
    """Lines of imports under ``if TYPE_CHECKING:`` (annotations, never executed)."""
    tree = ast.parse(source)
    lines = set()
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            lines |= {child.lineno for child in ast.walk(node) if isinstance(child, (ast.Import, ast.ImportFrom))}
    return lines


def violations(source: str, module: str) -> list[str]:
    """What ``source`` (the text of ``module``) imports against the rules."""
    own = layer(module)
    typing_only = type_checking_only(source)
    found = []
    for item in imports(source, module):
        if item.line in typing_only:
            continue
        if item.module.startswith(SPARK) and own in PURE:
            found.append(f"{module}:{item.line} imports {item.module}: {own} must not load Spark")
        if not item.module.startswith("keyflow."):
            continue
        target = layer(item.module)
        if target not in ALLOWED[own]:
            found.append(f"{module}:{item.line} imports {item.module}: {own} must not import {target}")
        elif (own, target) in LAZY_ONLY and item.top_level:
            found.append(f"{module}:{item.line} imports {item.module} at module level: only inside a function")
    return found


def package_modules() -> dict[str, str]:
    return {
        "keyflow." + ".".join(path.relative_to(PACKAGE).with_suffix("").parts): path.read_text()
        for path in sorted(PACKAGE.rglob("*.py"))
    }


def test_every_import_follows_the_layers() -> None:
    found = [line for module, source in package_modules().items() for line in violations(source, module)]
    assert found == []


@pytest.mark.parametrize(
    ("module", "line", "expected"),
    [
        ("keyflow.runtime.frames", "from keyflow.api.pipeline import Pipeline", "runtime must not import api"),
        ("keyflow.runtime.streaming.job", "from ...api import pipeline", "runtime must not import api"),
        ("keyflow.connectors.files", "from keyflow.runtime.exchange import rebalance", "must not import runtime"),
        ("keyflow.plan.compile", "import pyspark.sql", "plan must not load Spark"),
        ("keyflow.state.durable", "def f():\n    from pyspark import TaskContext", "state must not load Spark"),
        ("keyflow.plan.nodes", "from keyflow.api.stream import Stream", "plan must not import api"),
        ("keyflow.state.memory", "from keyflow.api import stream", "state must not import api"),
        ("keyflow.api.pipeline", "from keyflow.runtime.executor import run_batch", "only inside a function"),
        ("keyflow.keygroups", "from keyflow.plan.graph import JobGraph", "base must not import plan"),
        ("keyflow.runtime.workers", "from keyflow import Pipeline", "runtime must not import api"),
        ("keyflow.plan.nodes", "import keyflow", "plan must not import api"),
        ("keyflow.state.keyed", "from keyflow import KeyedBatch, Pipeline", "state must not import api"),
        ("keyflow.connectors.base", "from keyflow.connectors.files import files", "base must not import connectors"),
        ("keyflow.connectors.base", "import pyspark.sql", "base must not load Spark"),
        ("keyflow.sql.planner", "from keyflow.api.stream import Stream", "sql must not import api"),
        ("keyflow.sql.planner", "def f():\n    from keyflow import Pipeline", "sql must not import api"),
        ("keyflow.api.pipeline", "from keyflow.sql.planner import plan_script", "only inside a function"),
    ],
)
def test_the_rules_catch_a_forbidden_import(module: str, line: str, expected: str) -> None:
    """The checker itself: each forbidden direction is reported."""
    assert any(expected in found for found in violations(line + "\n", module))


def test_sql_and_api_import_one_way() -> None:
    """The two front ends build through ``plan.builder``: SQL never imports the API (not even
    lazily), so they cannot import each other in a circle."""
    modules = package_modules()
    sql_to_api = [
        f"{module}:{item.line}"
        for module, source in modules.items()
        if layer(module) == "sql"
        for item in imports(source, module)
        if layer(item.module) == "api"
    ]
    api_to_sql_at_load = [
        f"{module}:{item.line}"
        for module, source in modules.items()
        if layer(module) == "api"
        for item in imports(source, module)
        if layer(item.module) == "sql" and item.top_level
    ]
    assert sql_to_api == []
    assert api_to_sql_at_load == []
    assert any(layer(item.module) == "sql" for item in imports(modules["keyflow.api.pipeline"], "keyflow.api.pipeline"))


def test_allowed_imports_pass_the_rules() -> None:
    lazy = "def run():\n    from keyflow.runtime.executor import run_batch\n"
    assert violations(lazy, "keyflow.api.pipeline") == []
    assert violations("from keyflow.plan.compile import CompiledPlan\n", "keyflow.runtime.frames") == []
    assert violations("from keyflow import KeyedBatch, ValueState\n", "keyflow.runtime.workers") == []


@pytest.mark.parametrize(
    "module",
    [
        "keyflow",
        "keyflow.api.pipeline",
        "keyflow.plan.builder",
        "keyflow.plan.compile",
        "keyflow.state.durable",
        "keyflow.cli.app",
        "keyflow.sql.planner",
    ],
)
def test_importing_loads_no_spark(module: str) -> None:
    """The whole import graph, not just direct imports: nothing these load pulls in PySpark
    (so ``keyflow keygroups --help`` or building a plan starts without a JVM library)."""
    check = f"import {module}, sys; loaded = sorted(m for m in sys.modules if m.startswith(('pyspark', 'py4j'))); "
    check += "print(loaded[:3]); sys.exit(1 if loaded else 0)"
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, check=False)
    assert result.returncode == 0, f"importing {module} loaded {result.stdout.strip()} {result.stderr}"


def test_the_cli_starts_without_pandas() -> None:
    """Commands import what they need when they run: ``keyflow keygroups`` does not pay for
    pandas (about a quarter of a second here), which only the checkpoint commands use."""
    check = "import keyflow.cli.app, sys; sys.exit(1 if 'pandas' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", check], check=False).returncode == 0
