#!/bin/bash
# The install test: build the .deb, install it into a fresh Debian 12
# chroot, check what it set up, run the daemon from it, purge it.
#
#   sudo packaging/test-install.sh            (KEEP=1 keeps the work dir)
#
# Needs root, debootstrap and network access to deb.debian.org and PyPI.
# The minbase chroot is cached as a tarball and the downloaded .debs and
# wheels are cached too (INFERMUX_TEST_CACHE, default
# /var/cache/infermux-test), so reruns take a minute or two, not ten.
#
# No systemd runs in a chroot: the daemon is started directly, as user
# infermux (setpriv), the way the unit would start it.
#
# Exit status: 0 every step passed; 1 a step failed; 2 nothing failed but
# steps were skipped (the daemon, `infermux serve`, is not in this build yet).
set -uo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${INFERMUX_TEST_CACHE:-/var/cache/infermux-test}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
ORT=${INFERMUX_ORT_SPEC:-onnxruntime}
WORK=$(mktemp -d /tmp/infermux-install.XXXXXX)
ROOT=$WORK/root
DAEMON_PID=
declare -a SUMMARY=()
FAILED=0 SKIPPED=0
T0=$SECONDS

log() { printf '\n== %s\n' "$*"; }
in_root() { chroot "$ROOT" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LC_ALL=C.UTF-8 "$@"; }

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

finish() {
    local mounted
    [ -n "$DAEMON_PID" ] && kill -KILL "$DAEMON_PID" 2>/dev/null
    for m in dev/pts dev/shm dev proc sys var/cache/apt/archives root/.cache/pip; do
        mountpoint -q "$ROOT/$m" 2>/dev/null && { umount "$ROOT/$m" 2>/dev/null || umount -l "$ROOT/$m"; }
    done
    mounted=$(awk -v r="$ROOT" 'index($2, r) == 1' /proc/mounts)
    if [ -n "$mounted" ]; then
        echo "still mounted under $ROOT, not deleting $WORK:" >&2
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

build() {
    "$REPO/packaging/build-deb.sh" "$WORK/deb" >"$WORK/build.log" 2>&1 || { tail -40 "$WORK/build.log"; return 1; }
    DEB=$(ls "$WORK"/deb/infermux_*_all.deb) && echo "built $DEB"
}

base() {
    local tarball=$CACHE/bookworm-minbase.tar
    mkdir -p "$CACHE/apt-archives/partial" "$CACHE/pip" "$ROOT"
    if [ ! -s "$tarball" ]; then
        command -v debootstrap >/dev/null || { echo "apt-get install debootstrap"; return 1; }
        debootstrap --variant=minbase --cache-dir="$CACHE/apt-archives" bookworm "$WORK/base" "$MIRROR" \
            >"$WORK/debootstrap.log" 2>&1 || { tail -20 "$WORK/debootstrap.log"; return 1; }
        tar -C "$WORK/base" --numeric-owner -cf "$tarball.tmp" . && mv "$tarball.tmp" "$tarball"
        rm -rf "$WORK/base"
    fi
    tar -C "$ROOT" --numeric-owner -xf "$tarball"
}

mounts() {
    mount -t proc proc "$ROOT/proc" &&
    mount -t sysfs -o ro sysfs "$ROOT/sys" &&
    # A private /dev with the usual nodes: nothing from the host's /dev leaks in.
    mount -t tmpfs -o mode=755,nosuid dev "$ROOT/dev" &&
    for n in "null 1 3" "zero 1 5" "full 1 7" "random 1 8" "urandom 1 9" "tty 5 0"; do
        set -- $n; mknod -m 666 "$ROOT/dev/$1" c "$2" "$3" || return 1
    done &&
    mkdir -p "$ROOT/dev/shm" "$ROOT/dev/pts" && mount -t tmpfs -o mode=1777,nosuid,nodev shm "$ROOT/dev/shm" &&
    ln -s /proc/self/fd "$ROOT/dev/fd" &&
    mount --bind "$CACHE/apt-archives" "$ROOT/var/cache/apt/archives" &&
    mkdir -p "$ROOT/root/.cache/pip" && mount --bind "$CACHE/pip" "$ROOT/root/.cache/pip" &&
    cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
}

install_deb() {
    cp "$DEB" "$ROOT/tmp/" &&
    in_root apt-get update -q >/dev/null &&
    in_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        "/tmp/$(basename "$DEB")" >"$WORK/apt.log" 2>&1 || { tail -30 "$WORK/apt.log"; return 1; }
    grep -E '^(Setting up|Unpacking) infermux' "$WORK/apt.log"
    in_root dpkg-query -W -f='${Status} ${Version}\n' infermux
}

check_user() {
    local entry
    entry=$(in_root getent passwd infermux) || { echo "no user infermux"; return 1; }
    echo "$entry"
    IFS=: read -r _ _ uid _ _ home shell <<<"$entry"
    [ "$uid" -lt 1000 ] && [ "$home" = /var/lib/infermux ] && [ "$shell" = /usr/sbin/nologin ] &&
    in_root getent group infermux || return 1
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
infermux:infermux 2775 /var/lib/infermux/engines" ] &&
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
    # tests/test_packaging.py checks the man: reference against our page).
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
    in_root test -f /usr/lib/tmpfiles.d/infermux.conf && echo "man page, completion, sysusers, tmpfiles present"
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
    [ -f "$ROOT/usr/lib/python3/dist-packages/infermux/serve.py" ] && return 0
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

run_daemon() {
    daemon_in_build || return $?
    # What RuntimeDirectory= would make.
    mkdir -p "$ROOT/run/infermux" && in_root chown infermux:infermux /run/infermux && chmod 0750 "$ROOT/run/infermux"
    chroot "$ROOT" /usr/bin/env -i PATH=/usr/bin:/bin HOME=/var/lib/infermux LC_ALL=C.UTF-8 \
        setpriv --reuid=infermux --regid=infermux --init-groups \
        infermux serve --config /etc/infermux/infermux.toml --runtime-dir /run/infermux \
        >"$WORK/daemon.log" 2>&1 &
    DAEMON_PID=$!
    echo "daemon pid $DAEMON_PID"
    # The client: root in the chroot, on the socket the unit's clients use.
    if ! in_root timeout 90 python3 - <<'EOF'
import sys, time
import numpy as np
from infermux.client import Client
x = np.random.default_rng(0).random((1, 3, 64, 64), dtype=np.float32)
deadline = time.monotonic() + 60
last = None
with Client("ipc:///run/infermux/infer.sock", timeout_s=2) as c:
    while time.monotonic() < deadline:
        try:
            r = c.infer("classifier", {"images": x})
        except TimeoutError as e:   # not listening yet
            last = e
            continue
        last = (r.status, r.error)
        if r.status == 200:
            print("200 from", r.model, r.version, "probs", r.outputs["probs"].shape, r.header.get("timing_us"))
            sys.exit(0)
        time.sleep(0.2)             # 503 while loading
print("no 200 within 60 s; last:", last)
sys.exit(1)
EOF
    then
        tail -30 "$WORK/daemon.log"; return 1
    fi
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

purge() {
    in_root env DEBIAN_FRONTEND=noninteractive apt-get purge -y -q infermux >"$WORK/purge.log" 2>&1 ||
        { tail -20 "$WORK/purge.log"; return 1; }
    local left=0 p
    for p in /etc/infermux /var/lib/infermux /usr/lib/infermux /usr/share/infermux /usr/bin/infermux \
             /usr/lib/python3/dist-packages/infermux /lib/systemd/system/infermux.service \
             /usr/lib/sysusers.d/infermux.conf /usr/lib/tmpfiles.d/infermux.conf \
             /usr/share/bash-completion/completions/infermux /usr/share/doc/infermux; do
        if [ -e "$ROOT$p" ]; then echo "left behind: $p"; left=1; fi
    done
    if in_root dpkg-query -W -f='${Status}\n' infermux 2>/dev/null | grep -q installed; then
        echo "still known to dpkg as installed"; left=1
    fi
    in_root getent passwd infermux >/dev/null && echo "user infermux kept (Debian practice: uids are not recycled)"
    [ $left -eq 0 ] && echo "all files, the conffile and /var/lib/infermux removed"
}

# --- run -------------------------------------------------------------------

step "build the .deb (packaging/build-deb.sh)" build || exit
step "Debian 12 minbase chroot (cached: $CACHE)" base || exit
step "mount /proc /sys /dev in the chroot" mounts || exit
step "apt install ./infermux_*.deb" install_deb || exit
step "system user and group infermux" check_user
step "/var/lib/infermux{,/engines} owned by infermux" check_dirs
step "unit installed, not enabled, systemd-analyze verify clean" check_unit
step "conffile /etc/infermux/infermux.toml" check_conffile
step "man page, completion, sysusers, tmpfiles" check_extras
step "vendored Textual wins over Debian's rich/pygments" check_vendor
step "infermux --version / --help" check_cli
step "onnxruntime from PyPI ($ORT)" install_backend
step "packaged backend runs the sample engine as infermux" run_backend
step "daemon as infermux answers 200, exits 0 on SIGTERM" run_daemon
step "apt purge leaves nothing behind" purge
exit
