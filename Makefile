# Two entry points for a fresh machine (see README): `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
EXAMPLE := examples/out/encoder.onnx

.PHONY: demo test bench-conformance bench-simplify fuzz sanitize clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[test]"
	touch $@

$(EXAMPLE): $(VENV)/.installed shapeshift/examples/encoder.py
	$(BIN)/python -m shapeshift.examples.encoder $(EXAMPLE)

demo: $(EXAMPLE)
	$(BIN)/shapeshift info $(EXAMPLE)
	$(BIN)/shapeshift simplify $(EXAMPLE) examples/out/encoder.simplified.onnx --check 3 --dynamic batch=1:4 --dynamic seq=1:128
	$(BIN)/shapeshift run $(EXAMPLE) --random --dynamic batch=1:4 --dynamic seq=1:128 --backend reference
	$(BIN)/shapeshift run $(EXAMPLE) --random --dynamic batch=1:4 --dynamic seq=1:128 --seed 1 --backend reference
	$(BIN)/shapeshift info $(EXAMPLE) --backend native
	$(BIN)/shapeshift run $(EXAMPLE) --random --dynamic batch=1:4 --dynamic seq=1:128 --seed 1 --backend native

test: $(VENV)/.installed
	$(BIN)/python -m pytest -n 2 -q -p no:cacheprovider

bench-conformance: $(VENV)/.installed
	$(BIN)/python bench/conformance.py

bench-simplify: $(VENV)/.installed
	$(BIN)/python -m pip install --quiet -e ".[bench]"
	$(BIN)/python bench/simplify.py

# A long fuzz campaign (shapeshift/fuzz): N mutants on simplify and both backends, in 2
# worker processes; writes bench/results/fuzz.md.
N ?= 10000
fuzz: $(VENV)/.installed
	$(BIN)/python -m shapeshift.fuzz -n $(N) -j 2 --out bench/results/fuzz.md

# The native backend under ASan and UBSan: shared models and counted node cases.
sanitize: $(VENV)/.installed
	$(BIN)/python bench/sanitize.py -j 2

clean:
	rm -rf $(VENV) examples/out .pytest_cache
