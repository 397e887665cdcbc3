#!/bin/sh
# Download the console's pinned wheels (packaging/vendor-requirements.txt)
# into DEST, verifying every hash. Run at build time by debian/rules, or
# beforehand to build offline: packaging/fetch-vendor.sh DIR, then
# INFERMUX_VENDOR_WHEELS=DIR dpkg-buildpackage ...
#
#   packaging/fetch-vendor.sh DEST
#
# --isolated: the build must not pick up a developer's pip configuration
# (extra indexes, constraints); the hashes decide what is acceptable anyway.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
dest=${1:?usage: fetch-vendor.sh DEST}
mkdir -p "$dest"
exec "${PYTHON:-python3}" -m pip download --isolated --disable-pip-version-check \
    --no-deps --only-binary=:all: --require-hashes \
    --index-url "${INFERMUX_PYPI_INDEX:-https://pypi.org/simple}" \
    -r "$here/vendor-requirements.txt" -d "$dest"
