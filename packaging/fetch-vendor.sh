#!/bin/sh
# Download the console's pinned wheels (packaging/vendor-requirements.txt)
# into DEST, verifying every hash. Wheels already in DEST are re-verified
# without network access; only missing ones are fetched from PyPI.
#
#   packaging/fetch-vendor.sh DEST
#
# Then `INFERMUX_VENDOR_WHEELS=DEST dpkg-buildpackage ...` builds offline
# (packaging/build-deb.sh does both). --isolated: a developer's pip
# configuration (extra indexes, constraints) must not leak into the build;
# the hashes decide what is acceptable anyway.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
dest=${1:?usage: fetch-vendor.sh DEST}
mkdir -p "$dest"
download() {
    "${PYTHON:-python3}" -m pip download --isolated --disable-pip-version-check \
        --no-deps --only-binary=:all: --require-hashes \
        -r "$here/vendor-requirements.txt" -d "$dest" "$@"
}
download --no-index --find-links "$dest" >/dev/null 2>&1 ||
    download --index-url "${INFERMUX_PYPI_INDEX:-https://pypi.org/simple}"
