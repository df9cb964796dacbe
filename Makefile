# The two commands the README opens with: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck unit bench chaos docs clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,otel,api,mcp,console,openai-agents,langchain,pydantic-ai,anthropic,docs]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/toolq demo

lint: $(STAMP)
	$(BIN)/ruff check toolq tests bench examples tools
	$(BIN)/ruff format --check toolq tests bench examples tools
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

# pytest exits 5 when it collected no test: that is a failure here too.
test: lint typecheck
	$(BIN)/pytest -q

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
