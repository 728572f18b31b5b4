#!/usr/bin/env bash
# `make deb`: build dist/honk_<version>_<arch>.deb from this source tree.
#
#   packaging/deb/build.sh            version from honk/__init__.py (debian/changelog agrees)
#   HONK_DEB_VERSION=0.1.0+2 ...      another version (a rebuild to upgrade over the first)
#
# 1. Build dependencies come from Debian (installed when missing, as root or through sudo).
# 2. A build venv is made from Debian's /usr/bin/python3 with Cython 3 (Debian 12 has 0.29):
#    the kernels are compiled for the python3.11 the package runs on. It sees the system's
#    packages (Debian's click writes the man pages from the commands' help).
# 3. The wheels of packaging/deb/vendor.txt are downloaded (binary, CPython 3.11, this machine's
#    architecture) for /usr/lib/honk/vendor.
# 4. The tracked files are copied to build/deb/honk-<version> with packaging/deb/debian, and
#    dpkg-buildpackage builds the binary package there; lintian checks it.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
BUILD="$ROOT/build/deb"
DIST="$ROOT/dist"
BUILD_DEPS="debhelper dpkg-dev fakeroot lintian clang libbpf-dev libssl-dev python3-dev python3-venv python3-click"
CYTHON="Cython>=3.0,<3.3"

version=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' honk/__init__.py)
changelog=$(sed -n '1s/^honk (\(.*\)) .*/\1/p' packaging/deb/debian/changelog)
if [ "$version" != "$changelog" ]; then
    echo "make deb: honk/__init__.py says $version, packaging/deb/debian/changelog $changelog" >&2
    exit 1
fi
deb_version=${HONK_DEB_VERSION:-$version}

# shellcheck disable=SC2086 - one argument per package
packaging/deb/apt-missing.sh "make deb: installing build dependencies" $BUILD_DEPS

venv="$BUILD/venv"
if ! "$venv/bin/python" -c 'import Cython, sys; assert Cython.__version__ >= "3"; assert sys.prefix != sys.base_prefix' \
        2>/dev/null || [ "$("$venv/bin/python" -c 'import sys; print(sys.base_prefix)')" != /usr ]; then
    rm -rf "$venv"
    /usr/bin/python3 -m venv --system-site-packages "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip 'setuptools>=77' wheel "$CYTHON"
fi

wheels="$BUILD/wheels"
mkdir -p "$wheels"
grep -v '^\s*#' packaging/deb/vendor.txt | sed 's/#.*//; /^\s*$/d' > "$BUILD/vendor.req"
"$venv/bin/python" -m pip download -q --only-binary=:all: --no-deps -d "$wheels" -r "$BUILD/vendor.req"
# only the pinned wheels go in (an older download of another version stays out)
selected="$BUILD/wheels-selected"
rm -rf "$selected" && mkdir -p "$selected"
while read -r pin; do
    name=$(echo "${pin%%==*}" | tr 'A-Z-' 'a-z_')
    ver=${pin##*==}
    found=$(find "$wheels" -maxdepth 1 -iname "${name}-${ver}-*.whl" | head -n1)
    [ -n "$found" ] || { echo "make deb: no wheel for $pin" >&2; exit 1; }
    cp "$found" "$selected/"
done < "$BUILD/vendor.req"

src="$BUILD/honk-$deb_version"
rm -rf "$src"
mkdir -p "$src"
if git -C "$ROOT" rev-parse --git-dir >/dev/null 2>&1; then
    git -C "$ROOT" ls-files -z --cached --others --exclude-standard | (cd "$ROOT" && xargs -0 cp --parents -t "$src" 2>/dev/null || true)
else
    cp -r honk setup.py pyproject.toml README.md LICENSE configs packaging "$src/"
fi
rm -rf "$src/debian" && cp -r packaging/deb/debian "$src/debian"
if [ "$deb_version" != "$version" ]; then
    sed -i "1s/^honk ($version)/honk ($deb_version)/" "$src/debian/changelog"
fi

(cd "$src" && HONK_BUILD_PYTHON="$venv/bin/python" HONK_VENDOR_WHEELS="$selected" \
    dpkg-buildpackage -b -us -uc -rfakeroot >"$BUILD/dpkg-buildpackage.log" 2>&1) || {
    tail -n 40 "$BUILD/dpkg-buildpackage.log" >&2
    echo "make deb: dpkg-buildpackage failed; the whole log is $BUILD/dpkg-buildpackage.log" >&2
    exit 1
}

arch=$(dpkg --print-architecture)
deb="honk_${deb_version}_${arch}.deb"
mkdir -p "$DIST"
mv "$BUILD/$deb" "$DIST/$deb"
rm -f "$BUILD"/honk_"${deb_version}"_*.buildinfo "$BUILD"/honk_"${deb_version}"_*.changes \
      "$BUILD"/honk-dbgsym_"${deb_version}"_*.ddeb

echo "make deb: lintian"
lintian --fail-on error,warning "$DIST/$deb"
size=$(stat -c %s "$DIST/$deb")
installed=$(dpkg-deb -f "$DIST/$deb" Installed-Size)
echo "make deb: $DIST/$deb ($((size / 1024)) KiB; installed $installed KiB)"
