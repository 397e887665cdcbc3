"""Who may publish models: the engine directory is the admin group's, and a model.toml chooses only
among installed backends (docs/security.md, threat model).

Writing into engine_dir publishes, replaces or removes versions and sets a
model's settings; a `backend = "module:Attr"` in a model.toml was imported
and called, so `os:abort` killed the daemon at once and at every restart.
The package's tmpfiles line decides the directory's group and mode; a
member of the clients' group only (setpriv, as root) must not be able to
write there, while a member of the admin group publishes as before.
"""

from __future__ import annotations

import grp
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from support.harness import REPO, Daemon
from support.polling import eventually
from support.users import NOBODY

# A client and an operator, two users apart, and stand-ins for groups infermux and infermux-admin:
# numeric ids, no /etc/passwd or /etc/group entry needed.
CLIENT_UID, ADMIN_UID = NOBODY, 47201
CLIENTS_GID, ADMIN_GID = 47101, 47102
WATCHED = """
[daemon]
listen = ["ipc://infer.sock"]
engine_dir = "{engines}"
watch_settle_s = 0.2
watch_rescan_s = 0.5
"""
X = np.ones((1, 512), np.float32)


def _publish(engines: Path, source: Path, name: str, settings: str = "") -> None:
    (engines / name / "1").mkdir(parents=True)
    shutil.copy(source, engines / name / "1/model.onnx")
    if settings:
        (engines / name / "model.toml").write_text(settings)


def _served(daemon: Daemon, name: str) -> bool:
    """`name` is answered 200 once discovery has found it."""
    with daemon.client(timeout_s=20) as client:
        return eventually(lambda: client.infer(name, {"x": X}).status == 200, f"{name} served", timeout_s=30)


def test_a_model_toml_naming_a_module_path_as_backend_is_refused_and_the_daemon_serves_on(
        tmp_path: Path, engines: Path) -> None:
    root = tmp_path / "engines"
    source = engines / "fast512/1/model.onnx"
    _publish(root, source, "plain")
    _publish(root, source, "aborting", 'backend = "os:abort"\n')  # imported and called, before
    _publish(root, source, "chosen", 'backend = "onnxruntime"\n')  # an installed one, by name: allowed
    (tmp_path / "d").mkdir()
    daemon = Daemon(tmp_path / "d", WATCHED.format(engines=root)).start(timeout=60)
    try:
        assert _served(daemon, "plain") and _served(daemon, "chosen")
        _publish(root, source, "later", 'backend = "os:abort"\n')  # and one published while serving
        installed = "choose one of onnxruntime, tensorrt"
        daemon.wait_for(f"{root / 'later' / 'model.toml'}: backend: 'os:abort' is not an installed backend; "
                        f"{installed}")
        assert f"{root / 'aborting' / 'model.toml'}: backend: 'os:abort' is not an installed backend" in daemon.log()
        assert daemon.alive()
        with daemon.client(timeout_s=20) as client:
            for name in ("aborting", "later"):
                assert client.infer(name, {"x": X}).status == 404
        assert _served(daemon, "plain")
    finally:
        assert daemon.stop() == 0, daemon.log()[-3000:]


# -- the packaged directory's permissions ------------------------------------------------------

def _packaged_engine_dir() -> tuple[int, str, str]:
    """(mode, user, group) of /var/lib/infermux/engines in the package's tmpfiles file."""
    for line in (REPO / "packaging/infermux.tmpfiles").read_text().splitlines():
        fields = line.split()
        if fields[:2] == ["d", "/var/lib/infermux/engines"]:
            return int(fields[2], 8), fields[3], fields[4]
    raise AssertionError("no line for /var/lib/infermux/engines in packaging/infermux.tmpfiles")


def _as(uid: int, groups: int, command: str) -> subprocess.CompletedProcess:
    """`command` (sh) as user `uid` whose only group is `groups`, with an operator's umask."""
    return subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={groups}", f"--groups={groups}",
                           "sh", "-c", f"umask 002; {command}"], capture_output=True, text=True, timeout=30)


def test_only_the_admin_group_may_publish_into_the_packaged_engine_dir(open_tmp: Path, engines: Path) -> None:
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("playing a member of the clients' group needs root and setpriv")
    mode, _, group = _packaged_engine_dir()
    gid = {"infermux": CLIENTS_GID, "infermux-admin": ADMIN_GID}[group]
    root = open_tmp / "engines"
    root.mkdir()
    os.chown(root, 0, gid)  # owner: the daemon's user (root here), as tmpfiles makes it
    root.chmod(mode)
    sample = open_tmp / "model.onnx"
    shutil.copy(engines / "fast512/1/model.onnx", sample)
    sample.chmod(0o644)
    admin = _as(ADMIN_UID, ADMIN_GID, f"mkdir -p {root}/shipped/1 && cp {sample} {root}/shipped/1/model.onnx")
    assert admin.returncode == 0, admin.stderr
    (open_tmp / "d").mkdir()
    daemon = Daemon(open_tmp / "d", WATCHED.format(engines=root)).start(timeout=60)
    try:
        assert _served(daemon, "shipped")
        # A client: may reach the sockets, may not publish, replace or set anything here.
        for attempt in (f"mkdir {root}/evil",
                        f"mkdir {root}/shipped/2",
                        f"echo 'contexts = 1024' > {root}/shipped/model.toml",
                        f"rm -r {root}/shipped/1"):
            client = _as(CLIENT_UID, CLIENTS_GID, attempt)
            assert client.returncode != 0 and "Permission denied" in client.stderr, (attempt, client)
        assert (root / "shipped/1/model.onnx").exists() and not (root / "evil").exists()
        # An admin publishes a version as before: the folder's setgid keeps it in the admin group.
        admin = _as(ADMIN_UID, ADMIN_GID, f"mkdir -p {root}/shipped/2 && cp {sample} {root}/shipped/2/model.onnx")
        assert admin.returncode == 0, admin.stderr
        assert (root / "shipped/2").stat().st_gid == ADMIN_GID
        with daemon.admin() as ctl:
            eventually(lambda: "2" in {m["version"] for m in ctl.call("models")["models"] if m["name"] == "shipped"},
                       "the admin's version 2 discovered", timeout_s=30)
    finally:
        assert daemon.stop() == 0, daemon.log()[-3000:]


def _groups_to_play() -> tuple[str, str]:
    """Two existing groups other than root's: one plays the clients', one the admins'."""
    names = [g.gr_name for g in grp.getgrall() if g.gr_gid != 0]
    if len(names) < 2:
        pytest.skip("needs two groups besides root's")
    return names[0], names[1]


def test_doctor_fails_an_engine_dir_that_others_than_the_admin_group_may_write(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("giving folders to other groups needs root")
    clients, admins = _groups_to_play()
    root = tmp_path / "engines"
    (root / "m/1").mkdir(parents=True)
    config = tmp_path / "infermux.toml"
    config.write_text(f'[daemon]\nengine_dir = "{root}"\nadmin_group = "{admins}"\nwatch = false\n')

    def engine_dir_line() -> dict:
        out = subprocess.run([sys.executable, "-m", "infermux", "doctor", "--config", str(config), "--json"],
                             capture_output=True, text=True, timeout=120)
        return next(c for c in json.loads(out.stdout) if c["name"] == "engine_dir")

    for path in (root, root / "m", root / "m/1"):
        shutil.chown(path, group=admins)
        path.chmod(0o2775)
    assert engine_dir_line()["status"] == "OK"
    shutil.chown(root / "m/1", group=clients)  # one version folder a client may write into
    line = engine_dir_line()
    assert line["status"] == "FAIL" and f"{root / 'm/1'} is writable by group {clients}" in line["detail"]
    assert f"chgrp -R {admins} {root}" in line["fix"]
    shutil.chown(root / "m/1", group=admins)
    (root / "m").chmod(0o2777)
    line = engine_dir_line()
    assert line["status"] == "FAIL" and "is writable by every user" in line["detail"]
    assert grp.getgrnam(admins)  # (named groups exist: the check resolves admin_group by name)
    assert stat.S_IMODE((root / "m").stat().st_mode) == 0o2777
