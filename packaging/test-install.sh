#!/bin/bash
# The install test: build the .debs as sbuild would (a clean chroot holding
# only build-essential and debian/control's Build-Depends, no network, an
# unprivileged user), install infermux and infermux-wire (its compiled
# socket calls) into another fresh Debian 12 chroot, check
# what they set up, run the daemon from them, upgrade to a second build
# (0.1.1: a changed default in the shipped config, a new sample engine)
# over an operator's edits, downgrade, remove, purge.
#
#   sudo packaging/test-install.sh            (KEEP=1 keeps the work dir)
#   sudo BUILD_ONLY=DIR packaging/test-install.sh
#                                             (build 0.1.0 only, copy its two .debs to DIR)
#
# Needs root, debootstrap and network access to deb.debian.org and PyPI.
# The minbase chroot and the build chroot (keyed by debian/control) are
# cached as tarballs and the downloaded .debs and wheels are cached too
# (INFERMUX_TEST_CACHE, default /var/cache/infermux-test), so reruns skip
# debootstrap and the build dependencies' installation. The 0.1.0 .debs are
# kept too, keyed by the source tree's hash: BUILD_ONLY (the arm64 install
# test, tests/system/test_install_arm64.py) reuses them when the tree is unchanged.
#
# No systemd runs in a chroot: the daemon is started directly, as user
# infermux (setpriv), the way the unit would start it; the service's restart
# on upgrade is checked in the maintainer scripts, not on a running systemd.
#
# Exit status: 0 every step passed; 1 a step failed; 2 nothing failed but
# steps were skipped (the daemon, `infermux serve`, is not in this build yet).
set -uo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${INFERMUX_TEST_CACHE:-/var/cache/infermux-test}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
ORT=${INFERMUX_ORT_SPEC:-onnxruntime}
BUILD_ONLY=${BUILD_ONLY:-}
WORK=$(mktemp -d /tmp/infermux-install.XXXXXX)
ROOT=$WORK/root
BUILDER=$WORK/builder
# infermux-wire is built for the build chroot's architecture, which is the host's (debootstrap's default).
ARCH=$(dpkg --print-architecture)
NOBODY=65534   # nobody:nogroup in Debian's base-passwd: the unprivileged builder
DAEMON_PID=
declare -a SUMMARY=()
FAILED=0 SKIPPED=0
T0=$SECONDS

log() { printf '\n== %s\n' "$*"; }
in_chroot() { local r=$1; shift; chroot "$r" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LC_ALL=C.UTF-8 "$@"; }
in_root() { in_chroot "$ROOT" "$@"; }
apt_in() { local r=$1; shift; in_chroot "$r" env DEBIAN_FRONTEND=noninteractive apt-get -y -q --no-install-recommends "$@"; }

# step NAME COMMAND...: run one check, record PASS/FAIL and its seconds.
step() {
    local name=$1 start=$SECONDS rc
    shift
    log "$name"
    "$@"
    rc=$?
    if [ $rc -eq 0 ]; then
        SUMMARY+=("PASS  $(printf '%4ss' $((SECONDS - start)))  $name")
    elif [ $rc -eq 77 ]; then
        SUMMARY+=("SKIP  $(printf '%4ss' $((SECONDS - start)))  $name")
        SKIPPED=$((SKIPPED + 1))
    else
        SUMMARY+=("FAIL  $(printf '%4ss' $((SECONDS - start)))  $name")
        FAILED=$((FAILED + 1))
    fi
    return $rc
}

unmount_all() {
    local m
    for m in dev/pts dev/shm dev proc sys var/cache/apt/archives root/.cache/pip; do
        mountpoint -q "$1/$m" 2>/dev/null && { umount "$1/$m" 2>/dev/null || umount -l "$1/$m"; }
    done
    return 0
}

finish() {
    local mounted
    [ -n "$DAEMON_PID" ] && kill -KILL "$DAEMON_PID" 2>/dev/null
    [ -s "$ROOT/run/fake-systemd/infermux.pid" ] && kill -KILL "$(cat "$ROOT/run/fake-systemd/infermux.pid")" 2>/dev/null
    mountpoint -q "$ROOT/usr/bin/systemctl" 2>/dev/null && umount "$ROOT/usr/bin/systemctl"
    unmount_all "$ROOT"
    unmount_all "$BUILDER"
    mounted=$(awk -v r="$WORK/" 'index($2, r) == 1' /proc/mounts)
    if [ -n "$mounted" ]; then
        echo "still mounted under $WORK, not deleting it:" >&2
        echo "$mounted" >&2
    elif [ "${KEEP:-0}" = 1 ]; then
        echo "kept $WORK"
    else
        rm -rf "$WORK"
    fi
    printf '\n== summary (%ss in all)\n' $((SECONDS - T0))
    printf '%s\n' "${SUMMARY[@]}"
    if [ $FAILED -gt 0 ]; then
        echo "FAIL: $FAILED step(s) failed"; exit 1
    elif [ $SKIPPED -gt 0 ]; then
        echo "INCOMPLETE: nothing failed, $SKIPPED step(s) skipped"; exit 2
    fi
    echo "PASS"; exit 0
}
trap finish EXIT
trap 'exit 1' INT TERM

[ "$(id -u)" = 0 ] || { echo "run as root (chroot, mounts)" >&2; SUMMARY+=("FAIL  not root"); FAILED=1; exit 1; }

# --- steps -----------------------------------------------------------------

prepare() {
    # The tree as build-deb.sh copies it (your edits, no .venv) and the
    # console's pinned wheels, fetched here: the build itself runs offline.
    WHEELS=$("$REPO/packaging/build-deb.sh" --prepare "$WORK/deb" 2>"$WORK/prepare.log" | tail -1) &&
        [ -d "$WHEELS" ] || { tail -20 "$WORK/prepare.log"; return 1; }
    echo "source $WORK/deb/src, wheels $WHEELS"
}

base() {
    local tarball=$CACHE/bookworm-minbase.tar
    mkdir -p "$CACHE/apt-archives/partial" "$CACHE/pip"
    if [ ! -s "$tarball" ]; then
        command -v debootstrap >/dev/null || { echo "apt-get install debootstrap"; return 1; }
        debootstrap --variant=minbase --cache-dir="$CACHE/apt-archives" bookworm "$WORK/base" "$MIRROR" \
            >"$WORK/debootstrap.log" 2>&1 || { tail -20 "$WORK/debootstrap.log"; return 1; }
        tar -C "$WORK/base" --numeric-owner -cf "$tarball.tmp" . && mv "$tarball.tmp" "$tarball"
        rm -rf "$WORK/base"
    fi
    mkdir -p "$ROOT" && tar -C "$ROOT" --numeric-owner -xf "$tarball"
}

# mounts DIR: /proc, /sys, a private /dev, the shared apt and pip caches.
mounts() {
    local r=$1
    mount -t proc proc "$r/proc" &&
    mount -t sysfs -o ro sysfs "$r/sys" &&
    # A private /dev with the usual nodes: nothing from the host's /dev leaks in.
    mount -t tmpfs -o mode=755,nosuid dev "$r/dev" &&
    for n in "null 1 3" "zero 1 5" "full 1 7" "random 1 8" "urandom 1 9" "tty 5 0"; do
        set -- $n; mknod -m 666 "$r/dev/$1" c "$2" "$3" || return 1
    done &&
    mkdir -p "$r/dev/shm" "$r/dev/pts" && mount -t tmpfs -o mode=1777,nosuid,nodev shm "$r/dev/shm" &&
    ln -s /proc/self/fd "$r/dev/fd" &&
    mount --bind "$CACHE/apt-archives" "$r/var/cache/apt/archives" &&
    mkdir -p "$r/root/.cache/pip" && mount --bind "$CACHE/pip" "$r/root/.cache/pip" &&
    cp /etc/resolv.conf "$r/etc/resolv.conf"
}

builder() {
    # The image sbuild would use: minbase + build-essential + exactly the
    # Build-Depends of debian/control (apt-get build-dep on the source tree).
    # Cached per debian/control, so an edit to the list rebuilds it.
    local key tarball
    key=$(sha256sum "$WORK/deb/src/debian/control" | cut -c1-16)
    tarball=$CACHE/bookworm-builder-$key.tar
    mkdir -p "$BUILDER"
    if [ -s "$tarball" ]; then
        tar -C "$BUILDER" --numeric-owner -xf "$tarball" && mounts "$BUILDER" && echo "cached $tarball" && return
    fi
    tar -C "$BUILDER" --numeric-owner -xf "$CACHE/bookworm-minbase.tar" && mounts "$BUILDER" || return 1
    mkdir -p "$BUILDER/tmp/control/debian" && cp "$WORK/deb/src/debian/control" "$BUILDER/tmp/control/debian/"
    { apt_in "$BUILDER" update && apt_in "$BUILDER" install build-essential &&
      apt_in "$BUILDER" build-dep /tmp/control; } >"$WORK/builder.log" 2>&1 || { tail -30 "$WORK/builder.log"; return 1; }
    rm -rf "$BUILDER/tmp/control"
    unmount_all "$BUILDER"
    find "$CACHE" -maxdepth 1 -name 'bookworm-builder-*.tar' -delete  # made for an older debian/control
    tar -C "$BUILDER" --numeric-owner -cf "$tarball.tmp" . && mv "$tarball.tmp" "$tarball" && mounts "$BUILDER" &&
        echo "made $tarball: $(in_chroot "$BUILDER" dpkg-query -W -f='.\n' | wc -l) packages"
}

# next_version SRC: the second build an upgrade goes to. A changed default
# in the shipped config (which the operator will also have edited) and a new
# sample engine under /usr/share/infermux/engines.
next_version() {
    local src=$1
    { printf 'infermux (0.1.1) bookworm; urgency=medium\n\n  * Upgrade test build.\n\n'
      printf ' -- infermux developers <infermux@example.org>  %s\n\n' "$(date -R)"
      cat "$src/debian/changelog"; } >"$src/debian/changelog.new" && mv "$src/debian/changelog.new" "$src/debian/changelog"
    sed -i 's/^contexts = 2$/contexts = 3/' "$src/packaging/infermux.toml" &&
        grep -q '^contexts = 3$' "$src/packaging/infermux.toml" &&
    echo "engines/mlp usr/share/infermux/engines/" >>"$src/debian/infermux.install"
}

# build_in DIR: dpkg-buildpackage in the build chroot, as nobody, with no network.
build_in() {
    unshare --net chroot "$BUILDER" /usr/bin/env -i PATH=/usr/bin:/bin HOME=/build LC_ALL=C.UTF-8 \
        INFERMUX_VENDOR_WHEELS=/build/wheels \
        setpriv --reuid=$NOBODY --regid=$NOBODY --clear-groups \
        sh -c "cd /build/$1 && dpkg-buildpackage -us -uc -b" >"$WORK/build-$1.log" 2>&1 ||
        { tail -40 "$WORK/build-$1.log"; return 1; }
    grep -E '^(dpkg-deb: building|[0-9]+ passed)|passed' "$WORK/build-$1.log" | tail -3
}

build() {
    mkdir -p "$BUILDER/build/wheels" && cp "$WHEELS"/*.whl "$BUILDER/build/wheels/" &&
    cp -a "$WORK/deb/src" "$BUILDER/build/v1" && cp -a "$WORK/deb/src" "$BUILDER/build/v2" &&
    next_version "$BUILDER/build/v2" && chown -R $NOBODY:$NOBODY "$BUILDER/build" || return 1
    build_in v1 && build_in v2 || return 1
    DEB=$(ls "$BUILDER"/build/infermux_0.1.0_all.deb) && DEB2=$(ls "$BUILDER"/build/infermux_0.1.1_all.deb) &&
    WIRE=$(ls "$BUILDER/build/infermux-wire_0.1.0_$ARCH.deb") && WIRE2=$(ls "$BUILDER/build/infermux-wire_0.1.1_$ARCH.deb") &&
        echo "built $(basename "$DEB"), $(basename "$WIRE") and 0.1.1's" && packages_split && keep_deb
}

# packages_split: the compiled extension is infermux-wire's only file, and in no other package.
packages_split() {
    local files
    files=$(dpkg-deb -c "$WIRE" | awk '$6 !~ /\/$/ {print $6}' | grep -v '^\./usr/share/doc/infermux-wire/')
    echo "infermux-wire: $files"
    [ -n "$files" ] && ! grep -qv '^\./usr/lib/python3/dist-packages/infermux/transport/_wire\..*\.so$' <<<"$files" ||
        { echo "infermux-wire must hold the compiled extension and nothing else"; return 1; }
    if dpkg-deb -c "$DEB" | grep -E '\.so(\.|$)'; then echo "infermux (Architecture: all) holds the compiled files above"; return 1; fi
    dpkg-deb -f "$DEB" Recommends | grep -qx 'infermux-wire' &&
    dpkg-deb -f "$WIRE" Depends | grep -q 'infermux (= 0\.1\.0)' &&
        echo "infermux Recommends infermux-wire; infermux-wire Depends on infermux (= 0.1.0)"
}

# The 0.1.0 .debs of this source tree, kept for BUILD_ONLY (one tree at a time):
# kept_deb PACKAGE ARCH says where.
kept_deb() {
    local key
    key=$(cd "$WORK/deb/src" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16)
    echo "$CACHE/debs/${1}_0.1.0_$2-$key.deb"
}
keep_deb() {
    local kept wire; kept=$(kept_deb infermux all) wire=$(kept_deb infermux-wire "$ARCH")
    mkdir -p "$CACHE/debs" && find "$CACHE/debs" \( -name 'infermux_*.deb' -o -name 'infermux-wire_*.deb' \) -delete &&
        cp "$WIRE" "$wire.tmp" && mv "$wire.tmp" "$wire" &&
        cp "$DEB" "$kept.tmp" && mv "$kept.tmp" "$kept"
}

# BUILD_ONLY: 0.1.0 alone, or the .debs kept from an earlier build of the same tree.
build_only() {
    local kept wire; kept=$(kept_deb infermux all) wire=$(kept_deb infermux-wire "$ARCH")
    if [ ! -s "$kept" ] || [ ! -s "$wire" ]; then
        step "Debian 12 minbase chroot (cached: $CACHE)" base &&
        step "build chroot: build-essential + Build-Depends only (cached per debian/control)" builder || return 1
        mkdir -p "$BUILDER/build/wheels" && cp "$WHEELS"/*.whl "$BUILDER/build/wheels/" &&
        cp -a "$WORK/deb/src" "$BUILDER/build/v1" && chown -R $NOBODY:$NOBODY "$BUILDER/build" || return 1
        step "build 0.1.0 there, as nobody, offline (tests included)" build_in v1 || return 1
        DEB=$BUILDER/build/infermux_0.1.0_all.deb WIRE=$BUILDER/build/infermux-wire_0.1.0_$ARCH.deb &&
            packages_split && keep_deb || return 1
    fi
    mkdir -p "$BUILD_ONLY" && cp "$kept" "$BUILD_ONLY/infermux_0.1.0_all.deb" &&
        cp "$wire" "$BUILD_ONLY/infermux-wire_0.1.0_$ARCH.deb" &&
        echo "$BUILD_ONLY/infermux_0.1.0_all.deb from $kept, $BUILD_ONLY/infermux-wire_0.1.0_$ARCH.deb from $wire"
}

install_deb() {
    cp "$DEB" "$DEB2" "$WIRE" "$WIRE2" "$ROOT/tmp/" &&
    in_root apt-get update -q >/dev/null &&
    in_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        "/tmp/$(basename "$DEB")" "/tmp/$(basename "$WIRE")" >"$WORK/apt.log" 2>&1 || { tail -30 "$WORK/apt.log"; return 1; }
    grep -E '^(Setting up|Unpacking) infermux' "$WORK/apt.log"
    in_root dpkg-query -W -f='${Package} ${Status} ${Version} ${Architecture}\n' infermux infermux-wire
}

check_user() {
    local entry
    entry=$(in_root getent passwd infermux) || { echo "no user infermux"; return 1; }
    echo "$entry"
    IFS=: read -r _ _ uid _ _ home shell <<<"$entry"
    [ "$uid" -lt 1000 ] && [ "$home" = /var/lib/infermux ] && [ "$shell" = /usr/sbin/nologin ] &&
    in_root getent group infermux || return 1
    # admin.sock's own group: who may drain and unload is not every client.
    in_root getent group infermux-admin | grep -E ':(.*,)?infermux(,.*)?$' || { echo "no group infermux-admin with member infermux"; return 1; }
    # The unit's SupplementaryGroups= fail the start if a group is missing.
    local g
    for g in video render; do
        in_root getent group "$g" | grep -E ':(.*,)?infermux(,.*)?$' || { echo "infermux not in group $g"; return 1; }
    done
}

check_dirs() {
    local got
    got=$(in_root stat -c '%U:%G %a %n' /var/lib/infermux /var/lib/infermux/engines) || return 1
    echo "$got"
    [ "$got" = "infermux:infermux 755 /var/lib/infermux
infermux:infermux-admin 2775 /var/lib/infermux/engines" ] &&
    in_root test -f /usr/share/infermux/engines/classifier/1/model.onnx
}

check_unit() {
    local unit=$ROOT/lib/systemd/system/infermux.service out
    cmp "$unit" "$REPO/packaging/infermux.service" || return 1
    # Installed, not enabled (debian/rules: no backend in Debian).
    if ls "$ROOT"/etc/systemd/system/*.wants/infermux.service >/dev/null 2>&1; then
        echo "unit is enabled"; return 1
    fi
    # The real test of the unit: verify against the installed files, binaries
    # included. --man=no: man-db is not installed here (the repo's
    # tests/system/test_packaging.py checks the man: reference against our page).
    out=$(in_root systemd-analyze --man=no verify /lib/systemd/system/infermux.service 2>&1)
    echo "systemd-analyze verify: ${out:-(no output)}"
    [ -z "$out" ]
}

check_conffile() {
    local conffiles
    conffiles=$(in_root dpkg-query -W -f='${Conffiles}\n' infermux)
    echo "conffiles:$conffiles"
    grep -q '^ /etc/infermux/infermux.toml ' <<<"$conffiles" &&
    cmp "$ROOT/etc/infermux/infermux.toml" "$REPO/packaging/infermux.toml"
}

check_extras() {
    in_root test -f /usr/share/man/man1/infermux.1.gz &&
    in_root test -f /usr/share/bash-completion/completions/infermux &&
    in_root test -f /usr/lib/sysusers.d/infermux.conf &&
    in_root test -f /usr/lib/tmpfiles.d/infermux.conf &&
    cmp "$ROOT/usr/share/infermux/grafana/infermux.json" "$REPO/packaging/grafana/infermux.json" &&
    cmp "$ROOT/usr/share/infermux/prometheus/infermux-rules.yml" "$REPO/packaging/prometheus/infermux-rules.yml" &&
    echo "man page, completion, sysusers, tmpfiles, Grafana dashboard, Prometheus rules present"
}

check_vendor() {
    # With Debian's older rich and pygments installed, the console must still
    # get the vendored ones.
    in_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        python3-rich python3-pygments >/dev/null 2>&1 || return 1
    in_root python3 -I -c '
from infermux import vendor
assert vendor.activate()
import textual, textual.app, rich, pygments
from textual.widgets import Markdown
for m in (textual, rich, pygments):
    assert m.__file__.startswith("/usr/lib/infermux/vendor/"), m.__file__
import importlib.metadata as md
print("textual", md.version("textual"), "rich", md.version("rich"), "from /usr/lib/infermux/vendor")'
}

run_backend() {
    # The packaged backend plugin on the packaged sample engine, as the
    # daemon's user: independent of the daemon, so it runs today.
    chroot "$ROOT" /usr/bin/env -i PATH=/usr/bin:/bin HOME=/var/lib/infermux LC_ALL=C.UTF-8 \
        setpriv --reuid=infermux --regid=infermux --init-groups python3 -c '
from pathlib import Path
import numpy as np
from infermux.plugins.backends import for_path
path = Path("/usr/share/infermux/engines/classifier/1/model.onnx")
engine = for_path(path).load(path, {})
out = engine.create_context().infer({"images": np.zeros((2, 3, 64, 64), np.float32)})
assert out["probs"].shape == (2, 10), out["probs"].shape
assert np.allclose(out["probs"].sum(axis=1), 1, atol=1e-5)
print("classifier via", type(engine).__name__, "->", out["probs"].shape)'
}

daemon_in_build() {
    [ -f "$ROOT/usr/lib/python3/dist-packages/infermux/cli/serve.py" ] && return 0
    echo "SKIP: infermux.cli.serve is not in this build (the daemon is not merged yet)"
    return 77
}

check_cli() {
    daemon_in_build || return $?
    in_root infermux --version && in_root infermux --help >/dev/null
}

install_backend() {
    # onnxruntime is not in Debian: pip, into /usr/local, as README.Debian says.
    in_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        python3-pip >/dev/null 2>&1 || return 1
    # A TLS-intercepting proxy's CA lives in the host's trust store, not the
    # chroot's: hand pip the host's bundle when the host's pip uses one.
    local cert=()
    if [ -n "${PIP_CERT:-}" ] && [ -f "$PIP_CERT" ]; then
        cp "$PIP_CERT" "$ROOT/tmp/host-ca.crt" && cert=(--cert /tmp/host-ca.crt)
    fi
    in_root python3 -m pip install -q --break-system-packages --root-user-action=ignore "${cert[@]}" "$ORT" \
        >"$WORK/pip.log" 2>&1 || { tail -20 "$WORK/pip.log"; return 1; }
    in_root python3 -c 'import onnxruntime, numpy; print("onnxruntime", onnxruntime.__version__, "numpy", numpy.__version__)'
}

# answers MODEL...: a 200 from each model on /run/infermux/infer.sock within 60 s
# (the client as root, on the socket the unit's clients use).
answers() {
    in_root timeout 90 python3 - "$@" <<'EOF'
import sys, time
import numpy as np
from infermux.client import Client
x = np.random.default_rng(0).random((1, 3, 64, 64), dtype=np.float32)
deadline = time.monotonic() + 60
with Client("ipc:///run/infermux/infer.sock", timeout_s=2) as c:
    for model in sys.argv[1:]:
        last = None
        while time.monotonic() < deadline:
            try:
                r = c.infer(model, {"images": x})
            except TimeoutError as e:   # not listening yet
                last = e
                continue
            last = (r.status, r.error)
            if r.status == 200:
                print("200 from", r.model, r.version, "probs", r.outputs["probs"].shape, r.header.get("timing_us"))
                break
            time.sleep(0.2)             # 503 while loading (404 until discovery found it)
        else:
            print(f"no 200 from {model} within 60 s; last:", last)
            sys.exit(1)
EOF
}

# serve MODEL...: start the installed daemon as infermux, get a 200 from each
# model, SIGTERM it and expect exit 0.
serve() {
    daemon_in_build || return $?
    # What RuntimeDirectory= would make.
    mkdir -p "$ROOT/run/infermux" && in_root chown infermux:infermux /run/infermux && chmod 0750 "$ROOT/run/infermux"
    chroot "$ROOT" /usr/bin/env -i PATH=/usr/bin:/bin HOME=/var/lib/infermux LC_ALL=C.UTF-8 \
        setpriv --reuid=infermux --regid=infermux --init-groups \
        infermux serve --config /etc/infermux/infermux.toml --runtime-dir /run/infermux \
        >"$WORK/daemon.log" 2>&1 &
    DAEMON_PID=$!
    echo "daemon pid $DAEMON_PID"
    answers "$@" || { tail -30 "$WORK/daemon.log"; return 1; }
    # SIGTERM: drain and exit 0.
    kill -TERM "$DAEMON_PID"
    local rc
    for _ in $(seq 300); do kill -0 "$DAEMON_PID" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$DAEMON_PID" 2>/dev/null; then echo "still running 30 s after SIGTERM"; tail -30 "$WORK/daemon.log"; return 1; fi
    wait "$DAEMON_PID"; rc=$?
    DAEMON_PID=
    echo "exit status after SIGTERM: $rc"
    [ $rc -eq 0 ] || { tail -30 "$WORK/daemon.log"; return 1; }
}

run_daemon() { serve classifier; }

doctor() {
    # What an operator runs after apt install: no GPU here, so warnings, no failure.
    in_root infermux doctor --config /etc/infermux/infermux.toml
}

compiled_calls() {
    # infermux-wire's extension imports with the installed Python and libzmq, and the daemon uses it.
    local out
    in_root dpkg -S '/usr/lib/python3/dist-packages/infermux/transport/_wire.*.so' || return 1
    out=$(in_root infermux doctor --config /etc/infermux/infermux.toml 2>&1)
    grep -i 'socket calls' <<<"$out"
    grep -q 'compiled socket calls' <<<"$out" || { echo "doctor does not report the compiled socket calls"; return 1; }
}

operator_edits() {
    # As an operator would: a setting changed in the conffile, an engine deployed.
    sed -i 's/^contexts = 2$/contexts = 1  # edited by the operator/' "$ROOT/etc/infermux/infermux.toml" &&
    grep -q 'edited by the operator' "$ROOT/etc/infermux/infermux.toml" &&
    cp "$ROOT/etc/infermux/infermux.toml" "$WORK/operator.toml" &&
    in_root install -d -o infermux -g infermux-admin /var/lib/infermux/engines/mine/1 &&
    in_root install -o infermux -g infermux-admin -m 0644 /usr/share/infermux/engines/classifier/1/model.onnx \
        /var/lib/infermux/engines/mine/1/model.onnx &&
    sha256sum "$ROOT/var/lib/infermux/engines/mine/1/model.onnx" | cut -d' ' -f1 >"$WORK/mine.sha256" &&
    echo "config edited, engine mine/1 deployed"
}

# kept_by_operator: the operator's config and engine are what they left.
kept_by_operator() {
    cmp "$ROOT/etc/infermux/infermux.toml" "$WORK/operator.toml" &&
    [ "$(sha256sum "$ROOT/var/lib/infermux/engines/mine/1/model.onnx" | cut -d' ' -f1)" = "$(cat "$WORK/mine.sha256")" ] &&
    echo "operator's config and engine kept"
}

# apt_deb VERSION [apt options]: install that build's two .debs together (infermux-wire
# depends on the very version of infermux) keeping the operator's conffile (what
# answering "N" to dpkg's prompt does; the package's is left as .dpkg-dist).
apt_deb() {
    local version=$1; shift
    apt_in "$ROOT" -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "$@" \
        install "/tmp/infermux_${version}_all.deb" "/tmp/infermux-wire_${version}_$ARCH.deb" \
        >"$WORK/apt-$version.log" 2>&1 || { tail -30 "$WORK/apt-$version.log"; return 1; }
    in_root dpkg-query -W -f='${Package} ${Status} ${Version}\n' infermux infermux-wire
}

fake_systemd() {
    # The maintainer scripts act on the unit only where systemd runs: make
    # them see one (packaging/fake-systemctl does what they ask, for real).
    mkdir -p "$ROOT/run/systemd/system" && touch "$ROOT/usr/bin/systemctl" &&
    mount --bind "$REPO/packaging/fake-systemctl" "$ROOT/usr/bin/systemctl" && in_root systemctl --version
}

unit_pid() { cat "$ROOT/run/fake-systemd/infermux.pid" 2>/dev/null; }
unit_stopped() {
    local pid; pid=$(unit_pid)
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then echo "the unit runs (pid $pid)"; return 1; fi
    echo "the unit is stopped"
}

installed_is() {
    [ "$(in_root dpkg-query -W -f='${Version} ' infermux infermux-wire)" = "$1 $1 " ] || { echo "not both at version $1"; return 1; }
}

upgrade_disabled() {
    apt_deb 0.1.1 && installed_is 0.1.1 && kept_by_operator &&
    grep -q '^contexts = 3$' "$ROOT/etc/infermux/infermux.toml.dpkg-dist" && echo "new default offered as .dpkg-dist" &&
    in_root test -f /usr/share/infermux/engines/mlp/1/model.onnx && echo "new sample engine installed" &&
    grep -q "is-enabled" "$ROOT/run/fake-systemd/calls" && unit_stopped
}

downgrade_disabled() {
    apt_deb 0.1.0 --allow-downgrades && installed_is 0.1.0 && kept_by_operator &&
    ! in_root test -e /usr/share/infermux/engines/mlp && echo "0.1.1's sample engine removed" && unit_stopped
}

enable_and_start() {
    # systemctl enable --now infermux, as README.Debian says.
    mkdir -p "$ROOT/etc/systemd/system/multi-user.target.wants" &&
    ln -s /lib/systemd/system/infermux.service "$ROOT/etc/systemd/system/multi-user.target.wants/" &&
    in_root systemctl start infermux.service && answers classifier mine || { tail -30 "$ROOT/run/fake-systemd/infermux.log"; return 1; }
    echo "running, pid $(unit_pid)"
}

upgrade_running() {
    local before; before=$(unit_pid)
    apt_deb 0.1.1 && installed_is 0.1.1 && kept_by_operator || return 1
    [ -n "$(unit_pid)" ] && [ "$(unit_pid)" != "$before" ] || { echo "not restarted (pid $before -> $(unit_pid))"; return 1; }
    echo "restarted: pid $before -> $(unit_pid)"
    answers classifier mine ||
        { tail -30 "$ROOT/run/fake-systemd/infermux.log"; return 1; }
}

remove() {
    apt_in "$ROOT" remove infermux >"$WORK/remove.log" 2>&1 || { tail -20 "$WORK/remove.log"; return 1; }
    # Debian policy: remove stops the service and keeps the configuration, the
    # state and the user. infermux-wire goes with infermux, which it depends on.
    grep -q '^Removing infermux-wire ' "$WORK/remove.log" || { echo "infermux-wire not removed"; return 1; }
    unit_stopped && ! in_root test -e /usr/bin/infermux && kept_by_operator && in_root getent passwd infermux >/dev/null &&
    in_root dpkg-query -W -f='${Status}\n' infermux | grep -q config-files && echo "binaries gone; config, engines, user kept"
}

purge() {
    in_root env DEBIAN_FRONTEND=noninteractive apt-get purge -y -q infermux infermux-wire >"$WORK/purge.log" 2>&1 ||
        { tail -20 "$WORK/purge.log"; return 1; }
    local left=0 p
    for p in /etc/infermux /var/lib/infermux /usr/lib/infermux /usr/share/infermux /usr/bin/infermux \
             /usr/lib/python3/dist-packages/infermux /lib/systemd/system/infermux.service \
             /usr/lib/sysusers.d/infermux.conf /usr/lib/tmpfiles.d/infermux.conf \
             /usr/share/bash-completion/completions/infermux /usr/share/doc/infermux /usr/share/doc/infermux-wire; do
        if [ -e "$ROOT$p" ]; then echo "left behind: $p"; left=1; fi
    done
    if in_root dpkg-query -W -f='${Status}\n' infermux infermux-wire 2>/dev/null | grep -q ' installed'; then
        echo "still known to dpkg as installed"; left=1
    fi
    in_root getent passwd infermux >/dev/null && echo "user infermux kept (Debian practice: uids are not recycled)"
    [ $left -eq 0 ] && echo "all files, the conffile and /var/lib/infermux removed"
}

# --- run -------------------------------------------------------------------

step "copy the tree, fetch the pinned wheels" prepare || exit
if [ -n "$BUILD_ONLY" ]; then
    step "infermux_0.1.0_all.deb and infermux-wire_0.1.0_$ARCH.deb into $BUILD_ONLY (kept per source tree: $CACHE/debs)" build_only
    exit
fi
step "Debian 12 minbase chroot (cached: $CACHE)" base || exit
step "build chroot: build-essential + Build-Depends only (cached per debian/control)" builder || exit
step "build 0.1.0 and 0.1.1 there, as nobody, offline (tests included); the .so in infermux-wire alone" build || exit
step "mount /proc /sys /dev in the install chroot" mounts "$ROOT" || exit
step "apt install ./infermux_0.1.0_all.deb ./infermux-wire_0.1.0_$ARCH.deb" install_deb || exit
step "system user and group infermux" check_user
step "/var/lib/infermux{,/engines} owned by infermux, engines/ by group infermux-admin" check_dirs
step "unit installed, not enabled, systemd-analyze verify clean" check_unit
step "conffile /etc/infermux/infermux.toml" check_conffile
step "man page, completion, sysusers, tmpfiles, dashboard, rules" check_extras
step "vendored Textual wins over Debian's rich/pygments" check_vendor
step "infermux --version / --help" check_cli
step "onnxruntime from PyPI ($ORT)" install_backend
step "packaged backend runs the sample engine as infermux" run_backend
step "daemon as infermux answers 200, exits 0 on SIGTERM" run_daemon
step "infermux doctor: no failure on a CPU-only box" doctor
step "infermux doctor: compiled socket calls (infermux-wire)" compiled_calls
step "operator edits the config and deploys an engine" operator_edits || exit
step "systemctl stand-in for the maintainer scripts" fake_systemd || exit
step "upgrade to 0.1.1 (disabled): config kept, .dpkg-dist offered, engine untouched, not started" upgrade_disabled
step "after the upgrade the daemon serves the sample and the operator's engine" serve classifier mine
step "downgrade to 0.1.0 (disabled): stays stopped" downgrade_disabled
step "systemctl enable --now: serves" enable_and_start
step "upgrade to 0.1.1 (enabled, running): restarted, serves" upgrade_running
step "apt remove stops it, keeps config, engines and user" remove
step "apt purge leaves nothing behind" purge
exit
