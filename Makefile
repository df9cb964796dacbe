# The two commands the README opens with: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: bench-peers demo test lint typecheck unit bench chaos docs clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,otel,bench,api,mcp,console,openai-agents,langchain,pydantic-ai,anthropic,docs]'
	touch $(STAMP)

# The peers bench's systems (`python -m bench peers`): dramatiq, huey, saq in .venv (the bench extra);
# arq 0.28 pins redis < 6 (toolq needs 8), so it gets a venv of its own (with httpx, for
# the asyncio-pool bench's http scenario).
bench-peers: $(STAMP) .venv-arq/.installed

.venv-arq/.installed:
	$(PYTHON) -m venv .venv-arq
	.venv-arq/bin/pip install --quiet 'arq==0.28.0' 'httpx>=0.28'
	touch .venv-arq/.installed

demo: $(STAMP)
	$(BIN)/toolq demo

lint: $(STAMP)
	$(BIN)/ruff check toolq tests bench examples tools
	$(BIN)/ruff format --check toolq tests bench examples tools
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

# pytest exits 5 when it collected no test: that is a failure here too.
# arq's venv: the asyncio-pool bench's arq scenario is tested too (not skipped).
# Two pytest-xdist processes, a test file each at a time (--dist loadfile: a module's
# fixtures, its workers, cluster or RabbitMQ node, stay in one process); each process
# starts its own Valkey, and every cluster, RabbitMQ node and child picks free ports and
# a temporary directory of its own. Most of the suite waits on child processes, so two
# processes on 2 cores roughly halve it. The longest files go first, in the collection's
# order otherwise (tests/conftest.py: SLOWEST, and xdist's reorder by test count off).
# TEST_PROCS=0 runs it in one process.
TEST_PROCS ?= 2
test: lint typecheck .venv-arq/.installed
	$(BIN)/pytest -q -n $(TEST_PROCS) --dist loadfile

unit: $(STAMP)
	$(BIN)/pytest -q tests/unit

# The docs site into .site/, strictly: a broken link or reference fails.
SITE ?= .site
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir $(SITE)

bench: $(STAMP)
	$(BIN)/python -m bench

chaos: $(STAMP)
	$(BIN)/python -m bench.chaos

clean:
	rm -rf $(VENV) .site .toolq .pytest_cache .mypy_cache .ruff_cache
