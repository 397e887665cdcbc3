"""The install test (packaging/test-install.sh), run where the machine allows.

It builds the .deb, installs it into a fresh Debian 12 chroot, serves a
request from the installed daemon and purges it: a minute or two, so it
runs under CI (CI=true) or with INFERMUX_INSTALL_TEST=1, as root, with
debootstrap and the Debian build tools present; elsewhere it skips and says
how to run it by hand.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from harness import REPO

TOOLS = ("debootstrap", "dpkg-buildpackage", "dh", "lintian")


def _why_not() -> str | None:
    if not (os.environ.get("CI") or os.environ.get("INFERMUX_INSTALL_TEST")):
        return "set INFERMUX_INSTALL_TEST=1 (or run under CI) to build and install the .deb in a chroot"
    if os.geteuid() != 0:
        return "needs root (debootstrap, chroot): sudo packaging/test-install.sh"
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        return (f"missing {', '.join(missing)}: apt-get install debootstrap lintian build-essential debhelper "
                f"dh-python pybuild-plugin-pyproject python3-all python3-setuptools python3-pip python3-packaging")
    return None


@pytest.mark.slow
@pytest.mark.skipif(_why_not() is not None, reason=_why_not() or "")
def test_the_deb_installs_serves_and_purges_cleanly() -> None:
    proc = subprocess.run(["bash", str(REPO / "packaging/test-install.sh")], capture_output=True, text=True,
                          timeout=900)
    summary = proc.stdout[proc.stdout.rfind("== summary"):]
    assert proc.returncode == 0, summary or proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "daemon as infermux answers 200" in summary
