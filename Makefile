# The two commands: `make demo` runs the main job, `make test` runs every check
# (`make check` is the fast lane: no JVM but one smoke pipeline; see docs/testing.md).
# Both set up .venv (Python 3.11+, pinned dependencies, Java 17+ check) on first use; `make test`
# also fetches the pinned JVM artifacts (a Kafka broker for the tests, jvm/*/pom.xml) into .jvm/.

VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: demo test check bench lock clean

demo: $(STAMP)
	$(VENV)/bin/keyflow run examples/clickstream.py

test: $(STAMP)
	scripts/fetch-jvm.sh kafka
	scripts/test.sh

check: $(STAMP)
	scripts/test.sh check

bench: $(STAMP)
	$(VENV)/bin/python -m bench.keygroups
	$(VENV)/bin/python -m bench.batch_keyed
	$(VENV)/bin/python -m bench.streaming_state
	$(VENV)/bin/python -m bench.changelog_routing
	$(VENV)/bin/python -m bench.pre_keyed
	$(VENV)/bin/python -m bench.adaptive_batch
	$(VENV)/bin/python -m bench.checkpoint_integrity
	scripts/fetch-jvm.sh
	$(VENV)/bin/python -m bench.kafka

$(STAMP): requirements.lock pyproject.toml scripts/bootstrap.sh
	scripts/bootstrap.sh

# Re-pin after changing dependencies in pyproject.toml.
lock: $(STAMP)
	$(VENV)/bin/python -m pip install --quiet -e '.[dev]'
	{ echo "# Exact versions of every package keyflow installs (runtime and dev). Regenerate with: make lock"; \
	  $(VENV)/bin/python -m pip freeze --all --exclude-editable | grep -v -E '^(pip|keyflow)=='; } > requirements.lock

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
