#!/usr/bin/env bash
# Fetch the pinned JVM artifacts of jvm/*/pom.xml from Maven Central into .jvm/<name>/ (ignored).
# `make test` runs it (the tests start a real Kafka broker); `make demo` does not need it.
set -euo pipefail
cd "$(dirname "$0")/.."
for pom in jvm/*/pom.xml; do
  name=$(basename "$(dirname "$pom")")
  target=.jvm/$name
  if [ -f "$target/.fetched" ] && [ "$target/.fetched" -nt "$pom" ]; then continue; fi
  if ! command -v mvn >/dev/null 2>&1; then
    echo "error: fetching $pom needs Maven (mvn) on PATH (Debian/Ubuntu: apt-get install maven)" >&2
    exit 1
  fi
  echo "fetching the JVM artifacts of $pom into $target"
  rm -rf "$target"
  mvn -q -B -f "$pom" dependency:copy-dependencies -DoutputDirectory="$PWD/$target" \
    || { echo "error: mvn could not fetch the artifacts of $pom (is Maven Central reachable?)" >&2; exit 1; }
  touch "$target/.fetched"
done
