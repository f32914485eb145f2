#!/usr/bin/env bash
# Lint, format check, type check of the pure modules, then the test suite.
set -uo pipefail
cd "$(dirname "$0")/.."
bin=.venv/bin

"$bin/ruff" check . || { echo "FAILED: ruff check (fix with: .venv/bin/ruff check --fix .)" >&2; exit 1; }
"$bin/ruff" format --check . || { echo "FAILED: ruff format --check (fix with: .venv/bin/ruff format .)" >&2; exit 1; }
"$bin/mypy" || { echo "FAILED: mypy on the pure modules" >&2; exit 1; }

"$bin/python" -m pytest "$@"
status=$?
case $status in
  0) ;;
  5) echo "FAILED: pytest collected no tests (exit 5); the suite must not be empty" >&2 ;;
  *) echo "FAILED: pytest exited with $status" >&2 ;;
esac
exit $status
