# honk: the two commands a newcomer types are `make run` and `make test`.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
CONFIG ?= configs/demo.toml

.PHONY: venv build peers run test test-twins bench bench-peers lint clean

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

# The whole suite with the compiled kernels required, then the whole suite again
# on the pure-Python twins (the relay engine's twin included).
test: build peers
	HONK_REQUIRE_EXTENSIONS=1 $(BIN)/python -m pytest -q -p no:cacheprovider
	$(MAKE) --no-print-directory test-twins

test-twins: venv
	HONK_NO_EXTENSIONS=1 $(BIN)/python -m pytest -q -p no:cacheprovider

# The programs honk is measured against (see benchmarks/relay.py). Each is
# installed only when missing; one that cannot be installed is skipped with the
# reason, and the benchmark then leaves its rows out. pproxy and uvloop go into a
# venv of their own so honk's venv stays clean.
BENCH_PACKAGES := haproxy socat microsocks
PEERS_VENV     := benchmarks/.peers-venv
# pproxy 2.7.9 calls uvloop.install() itself when uvloop is importable, then
# asyncio.get_event_loop(); uvloop 0.22+ no longer creates a loop there, hence the pin.
UVLOOP         := uvloop<0.22
PPROXY_CHECK   := import asyncio, pproxy, uvloop; uvloop.install(); asyncio.get_event_loop()
bench-peers:
	@missing=""; for p in $(BENCH_PACKAGES); do command -v $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing benchmark peers:$$missing"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; elif command -v sudo >/dev/null 2>&1; then SUDO=sudo; else SUDO=none; fi; \
	  if [ "$$SUDO" = none ]; then echo "skipping$$missing: not root and no sudo"; \
	  else $$SUDO apt-get update -qq || echo "apt-get update failed"; \
	    for p in $$missing; do \
	      $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$p >/dev/null \
	        || echo "skipping $$p: apt-get install $$p failed"; \
	    done; \
	  fi; \
	fi
	@if ! $(PEERS_VENV)/bin/python -c '$(PPROXY_CHECK)' 2>/dev/null; then \
	  echo "installing pproxy and $(UVLOOP) into $(PEERS_VENV)"; \
	  { test -x $(PEERS_VENV)/bin/python || $(PYTHON) -m venv $(PEERS_VENV); } \
	  && $(PEERS_VENV)/bin/python -m pip install -q pproxy '$(UVLOOP)' \
	  && $(PEERS_VENV)/bin/python -c '$(PPROXY_CHECK)' \
	  || echo "skipping pproxy: pproxy with $(UVLOOP) does not install or start its loop in $(PEERS_VENV)"; \
	fi

# Relay benchmarks against real peers, plus the kernels; about 8 minutes
# (BENCH_ARGS=--quick for a one-minute smoke run). Not part of `make test`.
BENCH_ARGS ?=
bench: build peers bench-peers
	$(BIN)/python -m benchmarks $(BENCH_ARGS)

lint: venv
	$(BIN)/ruff check honk tests benchmarks

clean:
	rm -rf build $(VENV) benchmarks/.build benchmarks/.peers-venv *.egg-info honk/_fast/*.c honk/_fast/*.so var
