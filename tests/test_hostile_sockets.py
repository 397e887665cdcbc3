"""The daemon's local sockets against a process that should not get in, or that holds them
(docs/security.md): admin.sock during a restart, the metrics port, regions.sock, the runtime directory.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest

from harness import DAEMON_HEAD, Daemon

NOBODY = 65534
CLIENTS_GID = 47101  # the daemon's own (primary) group, as infermux is under the unit: the clients'


@pytest.fixture
def top() -> Iterator[Path]:
    """A folder other users may traverse (pytest's tmp_path is root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="infermux-sockets-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


# -- admin.sock while the daemon starts ---------------------------------------------------------

KNOCKER = """
import errno, socket, sys, time
path, stop = sys.argv[1], sys.argv[2]
held, refused, missing = [], 0, 0
deadline = time.monotonic() + 600
while time.monotonic() < deadline:
    for _ in range(200):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(path)
        except PermissionError:
            refused += 1
            s.close()
        except OSError:
            missing += 1
            s.close()
        else:
            held.append(s)  # in: a connection made now stays open whatever the file's mode becomes
    try:
        open(stop).close()
        break
    except OSError:
        pass
print(len(held), refused, missing, flush=True)
"""


def _admin_group() -> str:
    """An existing group other than root's and the clients' stand-in: admin.sock is given to it."""
    import grp
    for group in grp.getgrall():
        if group.gr_gid not in (0, CLIENTS_GID) and not group.gr_mem:
            return group.gr_name
    pytest.skip("no spare group to stand in for infermux-admin")


@pytest.mark.slow
def test_no_member_of_the_clients_group_connects_to_admin_sock_while_the_daemon_restarts(
        top: Path, engines: Path) -> None:
    if os.geteuid() != 0 or not shutil.which("setpriv") or not os.access("/usr/bin/python3", os.X_OK):
        pytest.skip("playing a member of the clients' group needs root, setpriv and /usr/bin/python3")
    # The unit's shape: the daemon's primary group is the clients' (infermux), UMask=0007, and
    # admin.sock goes to another group. Before the fix it was 0770 in the clients' group from the
    # bind until the chown: a connection made then stayed open (and its `drain` was accepted).
    head = DAEMON_HEAD + f'admin_group = "{_admin_group()}"\n'
    prefix = ["setpriv", f"--regid={CLIENTS_GID}", "--clear-groups", "sh", "-c", 'umask 0007; exec "$@"', "sh"]
    work = top / "d"
    work.mkdir()
    daemon = Daemon(work, head.format(engines=engines), prefix=prefix)
    stop = top / "stop"
    knocker = subprocess.Popen(["setpriv", f"--reuid={NOBODY}", f"--regid={CLIENTS_GID}", "--clear-groups",
                                "/usr/bin/python3", "-c", KNOCKER, str(daemon.run_dir / "admin.sock"), str(stop)],
                               stdout=subprocess.PIPE, text=True)
    try:
        for _ in range(20):
            daemon.log_path.unlink(missing_ok=True)  # wait_for reads this start's lines only
            daemon.start()
            assert daemon.stop() == 0, daemon.log()[-2000:]
    finally:
        stop.touch()
        out, _ = knocker.communicate(timeout=60)
    held, refused, missing = (int(n) for n in out.split())
    assert refused > 0 and missing > 0, out  # it knocked while the file was there and while it was not
    assert held == 0, f"a process in the clients' group only got {held} connection(s) to admin.sock"
