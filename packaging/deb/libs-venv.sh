#!/usr/bin/env bash
# A venv whose libraries are the ones the Debian package runs with, for `make test-debian-libs`:
# Debian 12's /usr/bin/python3 and the python3-* packages the package depends on (installed
# from Debian when missing), the wheels packaging/deb/vendor.txt carries (ahead of them, as
# /usr/lib/honk/vendor is on the package's path), and the test tools from PyPI.
#
#   packaging/deb/libs-venv.sh VENV
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
VENV=${1:?usage: libs-venv.sh VENV}
TEST_TOOLS="pytest>=7.4 pytest-asyncio>=0.23 pytest-timeout>=2.2 pytest-xdist>=3.5 hypothesis>=6.90 scipy>=1.10 trustme>=1.1 \
pyroute2>=0.9 Cython>=3.0,<3.3"

# the package's python3-* dependencies, read from its control file (one source of truth)
wanted=$(sed -n '/^Package: honk/,$p' "$ROOT/packaging/deb/debian/control" | grep -o 'python3-[a-z0-9-]*' | sort -u)
# shellcheck disable=SC2086 - one argument per package
"$ROOT/packaging/deb/apt-missing.sh" "test-debian-libs: installing the package's Debian libraries" \
    python3-venv $wanted

stamp="$VENV/.honk-libs"
want_stamp=$( (cat "$ROOT/packaging/deb/vendor.txt" "$ROOT/packaging/deb/debian/control"; echo "$TEST_TOOLS") \
    | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want_stamp" ]; then
    rm -rf "$VENV"
    /usr/bin/python3 -m venv --system-site-packages "$VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip
    grep -v '^\s*#' "$ROOT/packaging/deb/vendor.txt" | sed 's/#.*//; /^\s*$/d' > "$VENV/vendor.req"
    "$VENV/bin/python" -m pip install -q --only-binary=:all: --no-deps -r "$VENV/vendor.req"
    # shellcheck disable=SC2086 - one argument per tool
    "$VENV/bin/python" -m pip install -q $TEST_TOOLS
    echo "$want_stamp" > "$stamp"
fi
# the test tools must not have replaced a library the package takes from Debian or vendors
"$VENV/bin/python" - "$ROOT/packaging/deb/vendor.txt" <<'EOF'
import sys
from importlib import metadata

pins = {}
for line in open(sys.argv[1]):
    line = line.split("#", 1)[0].strip()
    if line:
        name, version = line.split("==")
        pins[name.lower().replace("_", "-")] = version
for name, version in pins.items():  # the distribution found first on sys.path: the one imported
    if metadata.version(name) != version:
        sys.exit(f"test-debian-libs: {name} is {metadata.version(name)}, the package carries {version}")
EOF
