#!/usr/bin/env bash
# Lint, format check, type check of the pure modules, then one lane of the test suite:
#   scripts/test.sh          every test (make test), on KEYFLOW_TEST_WORKERS processes (default 2)
#   scripts/test.sh check    the fast lane (make check): tests that start no JVM, and one smoke pipeline
# Extra arguments go to pytest (e.g. scripts/test.sh -- tests/test_plan.py -k rescale).
set -uo pipefail
cd "$(dirname "$0")/.."
bin=.venv/bin

lane=all
if [ "${1:-}" = check ]; then lane=check; shift; fi
if [ "${1:-}" = -- ]; then shift; fi

"$bin/ruff" check . || { echo "FAILED: ruff check (fix with: .venv/bin/ruff check --fix .)" >&2; exit 1; }
"$bin/ruff" format --check . || { echo "FAILED: ruff format --check (fix with: .venv/bin/ruff format .)" >&2; exit 1; }
"$bin/mypy" || { echo "FAILED: mypy on the pure modules" >&2; exit 1; }

if [ "$lane" = check ]; then
  args=(-m "not jvm or smoke")
else
  args=(-n "${KEYFLOW_TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder)
fi
"$bin/python" -m pytest "${args[@]}" "$@"
status=$?
case $status in
  0) ;;
  5) echo "FAILED: pytest collected no tests (exit 5); the suite must not be empty" >&2 ;;
  *) echo "FAILED: pytest exited with $status" >&2 ;;
esac
exit $status
