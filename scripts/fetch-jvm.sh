#!/usr/bin/env bash
# Fetch the pinned JVM artifacts of jvm/<name>/pom.xml from Maven Central into .jvm/<name>/ (ignored):
#   scripts/fetch-jvm.sh kafka    the Kafka broker the tests start (make test)
#   scripts/fetch-jvm.sh          every one, also Spark's Kafka connector for bench/kafka.py (make bench)
# `make demo` needs none of them.
set -euo pipefail
cd "$(dirname "$0")/.."
poms=(jvm/*/pom.xml)
if [ $# -gt 0 ]; then poms=("${@/#/jvm/}"); poms=("${poms[@]/%//pom.xml}"); fi
for pom in "${poms[@]}"; do
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
