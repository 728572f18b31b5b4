#!/usr/bin/env bash
# Install those of the given Debian packages that are not installed (as root, else through sudo).
#
#   packaging/deb/apt-missing.sh WHY PACKAGE...
set -euo pipefail

why=${1:?usage: apt-missing.sh WHY PACKAGE...}
shift
missing=""
for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing="$missing $pkg"
done
[ -n "$missing" ] || exit 0
echo "$why:$missing"
if [ "$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi
$SUDO apt-get -o DPkg::Lock::Timeout=300 update -qq
# shellcheck disable=SC2086 - one argument per package
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq \
    --no-install-recommends $missing
