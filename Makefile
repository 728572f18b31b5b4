# honk: the two commands a newcomer types are `make run` and `make test`.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
CONFIG ?= configs/demo.toml

.PHONY: venv build build-deps peers run test test-twins test-debian-libs bench bench-peers lint typecheck clean deb

venv: $(STAMP)

# (Re)create the venv and install honk editable with its test extras whenever the
# packaging or the _fast sources change. The editable install compiles the kernels.
$(STAMP): pyproject.toml setup.py $(wildcard honk/_fast/*.py honk/_fast/*.pxd)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip 'setuptools>=77' wheel
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

# The tc classifier (honk/ebpf/datapath.py loads it): UAPI headers only, libbpf-dev's
# bpf_helpers.h, built for this machine's byte order by Debian's clang.
BPF_OBJECT := honk/ebpf/datapath.bpf.o
$(BPF_OBJECT): honk/ebpf/datapath.bpf.c
	clang -O2 -g -target bpf -I/usr/include/$$(gcc -dumpmachine) -c $< -o $@

# Compile the _fast kernels in place, and the kernel datapath's classifier; a failure here
# is an error, not a fallback.
build: build-deps venv $(BPF_OBJECT)
	HONK_REQUIRE_EXTENSIONS=1 $(BIN)/python setup.py -q build_ext --inplace

# The relay engine links OpenSSL's libcrypto (Shadowsocks AEAD): its headers come from
# libssl-dev; the kernel datapath needs clang and libbpf-dev. Each installed only when missing.
build-deps:
	@test -f /usr/include/openssl/evp.h || { \
	  echo "installing libssl-dev (OpenSSL headers for the relay engine)"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get -o DPkg::Lock::Timeout=300 update -qq \
	  && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq libssl-dev; }
	@{ command -v clang >/dev/null 2>&1 && test -f /usr/include/bpf/bpf_helpers.h; } || { \
	  echo "installing clang and libbpf-dev (compiler and headers for the kernel datapath)"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get -o DPkg::Lock::Timeout=300 update -qq \
	  && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends clang libbpf-dev; }

# Real peer programs the tests talk to (Debian packages), as command:package pairs.
# A package is installed only when its command is missing; a failed install fails
# `make peers`, so CI never runs without a peer. RUNLEVEL=1 keeps the packages'
# init scripts from starting system instances (danted, tinyproxy, ss-server): the
# tests start their own on free ports with their own configs.
PEER_PACKAGES := curl:curl danted:dante-server ss-server:shadowsocks-libev microsocks:microsocks \
                 tinyproxy:tinyproxy haproxy:haproxy v2ray:v2ray chromium:chromium nft:nftables \
                 sysctl:procps tc:iproute2 mmdebstrap:mmdebstrap \
                 systemd-nspawn:systemd-container dnsdist:dnsdist
peers:
	@missing=""; for pair in $(PEER_PACKAGES); do \
	  command -v $${pair%%:*} >/dev/null 2>&1 || missing="$$missing $${pair#*:}"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing test peers:$$missing"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get -o DPkg::Lock::Timeout=300 update -qq \
	  && $$SUDO env DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends $$missing \
	  || { echo "make peers: could not install$$missing" >&2; exit 1; }; \
	  for pair in $(PEER_PACKAGES); do \
	    command -v $${pair%%:*} >/dev/null 2>&1 || { echo "make peers: $${pair%%:*} still missing" >&2; exit 1; }; \
	  done; \
	fi

run: venv
	$(BIN)/honk run -c $(CONFIG)

# The whole suite with the compiled kernels required, then on the pure-Python twins
# the suites that reach the kernels: the sans-I/O tests (the kernels' own, groups,
# health, Score, relay, codecs, configuration, the simulations) and the integration tests
# whose bytes cross the relay engine or the eBPF maps. The rest (the API, CLI, DNS,
# geodata, netlink, router and subscription units, most of the integration suite) would
# run the same kernel code again and cost the twin pass time it does not need.
TWIN_SKIP = --ignore=tests/unit/api --ignore=tests/unit/cli --ignore=tests/unit/dns \
	--ignore=tests/unit/geo --ignore=tests/unit/netlink --ignore=tests/unit/subscription \
	--ignore=tests/unit/daemon --ignore=tests/unit/route
TWIN_TESTS = $(TWIN_SKIP) tests/unit tests/sim \
	tests/integration/test_relay_engine.py tests/integration/test_socks_fastpath.py \
	tests/integration/test_mixed_proxy.py tests/integration/test_transparent_tcp.py \
	tests/integration/test_shadowsocks_relay.py tests/integration/test_shadowsocks_outbound.py \
	tests/integration/test_v2_outbounds.py tests/integration/test_v2_udp.py \
	tests/integration/test_score_escape.py tests/integration/test_score_reporters.py \
	tests/integration/test_ebpf_datapath.py

# PYTEST_WORKERS=2 runs the suites on two processes (pytest-xdist, a module's tests on one of
# them): about 35 % less time on the 2-core CI machine, but three parallel CI runs of four each met
# a different timing or process-history failure, so one process stays the default until those are fixed.
# Every test owns what it touches (free loopback ports, its own network namespaces, temporary
# directories), so modules may run side by side.
PYTEST_WORKERS ?= 0
PYTEST := $(BIN)/python -m pytest -q -p no:cacheprovider -n $(PYTEST_WORKERS) --dist loadfile

test: build peers lint typecheck
	HONK_REQUIRE_EXTENSIONS=1 $(PYTEST)
	$(MAKE) --no-print-directory test-twins
	$(MAKE) --no-print-directory test-debian-libs

test-twins: venv
	HONK_NO_EXTENSIONS=1 $(PYTEST) $(TWIN_TESTS)

# The unit suite and the integration tests of the libraries' surfaces (the API and its streams,
# DNS, HTTP/1 and HTTP/2 probes, the daemon process, metrics) once more on the libraries the
# Debian package runs with: Debian 12's python3 and python3-* packages, and the wheels
# packaging/deb/vendor.txt carries. Older library versions have broken honk where the newest
# did not. The kernels are those `make build` made.
DEBIAN_LIBS_VENV  := build/debian-libs-venv
DEBIAN_LIBS_TESTS := tests/unit \
	tests/integration/test_api_server.py tests/integration/test_clash_api.py \
	tests/integration/test_clash_streams.py tests/integration/test_native_api.py \
	tests/integration/test_metrics.py tests/integration/test_dns_loopback.py \
	tests/integration/test_health_http_probe.py tests/integration/test_health_udp_probe.py \
	tests/integration/test_daemon_process.py tests/integration/test_mixed_proxy.py \
	tests/integration/test_browser_cors.py tests/integration/test_flow_log_streams.py
test-debian-libs: build
	packaging/deb/libs-venv.sh $(DEBIAN_LIBS_VENV)
	HONK_REQUIRE_EXTENSIONS=1 PYTHONPATH=$(CURDIR) $(DEBIAN_LIBS_VENV)/bin/python -m pytest -q -p no:cacheprovider \
	  -n $(PYTEST_WORKERS) --dist loadfile $(DEBIAN_LIBS_TESTS)

# The programs honk is measured against (see benchmarks/relay.py). Each is
# installed only when missing; one that cannot be installed is skipped with the
# reason, and the benchmark then leaves its rows out. pproxy and uvloop go into a
# venv of their own so honk's venv stays clean.
# command:package pairs, as PEER_PACKAGES (shadowsocks-libev: ss-local and ss-server).
BENCH_PACKAGES := haproxy:haproxy socat:socat microsocks:microsocks ss-local:shadowsocks-libev \
                  v2ray:v2ray iperf3:iperf3
PEERS_VENV     := benchmarks/.peers-venv
# pproxy 2.7.9 calls uvloop.install() itself when uvloop is importable, then
# asyncio.get_event_loop(); uvloop 0.22+ no longer creates a loop there, hence the pin.
UVLOOP         := uvloop<0.22
PPROXY_CHECK   := import asyncio, pproxy, uvloop; uvloop.install(); asyncio.get_event_loop()
bench-peers:
	@missing=""; for pair in $(BENCH_PACKAGES); do \
	  command -v $${pair%%:*} >/dev/null 2>&1 || missing="$$missing $${pair#*:}"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing benchmark peers:$$missing"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; elif command -v sudo >/dev/null 2>&1; then SUDO=sudo; else SUDO=none; fi; \
	  if [ "$$SUDO" = none ]; then echo "skipping$$missing: not root and no sudo"; \
	  else $$SUDO apt-get update -qq || echo "apt-get update failed"; \
	    for p in $$missing; do \
	      $$SUDO env DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 apt-get install -y -qq $$p >/dev/null \
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

# Relay benchmarks against real peers, plus the kernels; about 12 minutes
# (BENCH_ARGS=--quick for a one-minute smoke run). Not part of `make test`.
BENCH_ARGS ?=
bench: build peers bench-peers
	$(BIN)/python -m benchmarks $(BENCH_ARGS)

# The Debian package: dist/honk_<version>_<arch>.deb, built with dpkg-buildpackage from the
# tracked tree (packaging/deb/build.sh installs what it needs from Debian). HONK_DEB_VERSION
# overrides the version (a rebuild to upgrade over the first).
deb:
	packaging/deb/build.sh

lint: venv
	$(BIN)/ruff check honk tests benchmarks
	$(BIN)/ruff format --check honk tests benchmarks

# The sans-I/O cores, type-checked strictly (settings in pyproject.toml [tool.mypy]): the shared
# types, the router, the wire codecs, the health state machine and the reload plan.
TYPED_CORES := honk/core honk/route honk/proto honk/alive/health.py honk/alive/outcome.py \
               honk/alive/thresholds.py honk/control/plan.py
typecheck: venv
	$(BIN)/mypy --strict $(TYPED_CORES)

clean:
	rm -rf build dist $(VENV) benchmarks/.build benchmarks/.peers-venv *.egg-info honk/_fast/*.c honk/_fast/*.so var
