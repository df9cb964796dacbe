# The two commands the README opens with: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck unit bench chaos clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,api,mcp,console,openai-agents,langchain,pydantic-ai,anthropic]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/toolq demo

lint: $(STAMP)
	$(BIN)/ruff check toolq tests bench examples
	$(BIN)/ruff format --check toolq tests bench examples
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

# pytest exits 5 when it collected no test: that is a failure here too.
test: lint typecheck
	$(BIN)/pytest -q

unit: $(STAMP)
	$(BIN)/pytest -q tests/unit

bench: $(STAMP)
	$(BIN)/python -m bench

chaos: $(STAMP)
	$(BIN)/python -m bench.chaos

clean:
	rm -rf $(VENV) .toolq .pytest_cache .mypy_cache .ruff_cache
