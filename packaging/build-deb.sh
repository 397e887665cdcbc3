#!/bin/sh
# Build the infermux .debs from this working tree, without touching it:
# infermux_VERSION_all.deb and infermux-wire_VERSION_ARCH.deb (the compiled
# socket calls, for this machine's architecture).
#
#   packaging/build-deb.sh [OUTDIR]        (default: /tmp/infermux-deb)
#   packaging/build-deb.sh --prepare OUTDIR
#
# Copies the tracked and untracked-but-not-ignored files (your edits
# included, no .venv or build leftovers) to OUTDIR/src and runs
# `dpkg-buildpackage -us -uc -b` there, so the .debs land in OUTDIR and the
# worktree stays clean. Debian's /usr/bin/python3 goes first on PATH: a
# pyenv/conda python3 would otherwise be picked up by pybuild.
# The console's wheels are cached in $INFERMUX_WHEEL_CACHE (default
# /var/cache/infermux-build/wheels) and checked against their pinned hashes.
# Prints the path of infermux-wire's .deb, then that of infermux's on the last line.
# --prepare only copies the tree and fetches the wheels, then prints the
# wheels' folder: packaging/test-install.sh builds in a clean chroot from there.
set -eu

repo=$(cd "$(dirname "$0")/.." && pwd)
prepare=0
if [ "${1:-}" = --prepare ]; then prepare=1; shift; fi
out=${1:-/tmp/infermux-deb}
wheels=${INFERMUX_WHEEL_CACHE:-/var/cache/infermux-build/wheels}
export PATH="/usr/sbin:/usr/bin:/sbin:/bin"

[ $prepare = 1 ] || for tool in dpkg-buildpackage dh pybuild; do
    command -v "$tool" >/dev/null || {
        echo "build-deb: $tool missing; apt-get install build-essential debhelper dh-python pybuild-plugin-pyproject python3-all python3-all-dev python3-setuptools python3-pip python3-packaging python3-pytest" >&2
        exit 1
    }
done

rm -rf "$out/src"
mkdir -p "$out/src"
rm -f "$out"/infermux_* "$out"/infermux-wire_* "$out"/infermux-wire-dbgsym_*
(cd "$repo" && git ls-files -z --cached --others --exclude-standard) |
    (cd "$repo" && xargs -0 cp --parents -P -t "$out/src")

# Fetch (or re-verify) the pinned wheels; the build itself then runs offline.
sh "$repo/packaging/fetch-vendor.sh" "$wheels" >/dev/null
if [ $prepare = 1 ]; then echo "$wheels"; exit 0; fi

cd "$out/src"
INFERMUX_VENDOR_WHEELS="$wheels" dpkg-buildpackage -us -uc -b
ls "$out"/infermux-wire_*_"$(dpkg --print-architecture)".deb
ls "$out"/infermux_*_all.deb
