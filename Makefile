# honk: the two commands a newcomer types are `make run` and `make test`.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
CONFIG ?= configs/demo.toml

.PHONY: venv build peers run test test-twins bench lint clean

venv: $(STAMP)

# (Re)create the venv and install honk editable with its test extras whenever the
# packaging or the _fast sources change. The editable install compiles the kernels.
$(STAMP): pyproject.toml setup.py $(wildcard honk/_fast/*.py honk/_fast/*.pxd)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip 'setuptools>=77' wheel
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

# Compile the _fast kernels in place; a failure here is an error, not a fallback.
build: venv
	HONK_REQUIRE_EXTENSIONS=1 $(BIN)/python setup.py -q build_ext --inplace

# Real peer programs the tests talk to (Debian packages). Installed only when missing.
PEER_PACKAGES := curl
peers:
	@missing=""; for p in $(PEER_PACKAGES); do command -v $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing test peers:$$missing"; \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	  else sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; fi; \
	fi

run: venv
	$(BIN)/honk run -c $(CONFIG)

# The whole suite with the compiled kernels required, then the unit suite again
# on the pure-Python twins.
test: build peers
	HONK_REQUIRE_EXTENSIONS=1 $(BIN)/python -m pytest -q -p no:cacheprovider
	$(MAKE) --no-print-directory test-twins

test-twins: venv
	HONK_NO_EXTENSIONS=1 $(BIN)/python -m pytest -q -p no:cacheprovider tests/unit

bench: build peers
	$(BIN)/python -m benchmarks

lint: venv
	$(BIN)/ruff check honk tests benchmarks

clean:
	rm -rf build $(VENV) *.egg-info honk/_fast/*.c honk/_fast/*.so var
