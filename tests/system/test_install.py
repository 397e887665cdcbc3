"""The install test (packaging/test-install.sh), run where the machine allows.

It builds the two .debs (infermux, and infermux-wire: the compiled socket
calls) in a clean chroot from the declared Build-Depends, installs both
into a fresh Debian 12 chroot, checks that the daemon uses the compiled
calls, serves requests from the installed daemon, upgrades, downgrades,
removes and purges them: a few
minutes, so it runs under CI (CI=true) or with INFERMUX_INSTALL_TEST=1, as
root. In CI the host tools it needs (debootstrap) are installed
(tests/support/system_packages.py); elsewhere it skips and says how to run it.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from support import system_packages
from support.harness import REPO

# command -> Debian package, on the host; everything else comes from the chroots.
HOST_TOOLS = system_packages.DEB_TEST_TOOLS


@pytest.mark.slow
def test_the_deb_builds_installs_upgrades_and_purges_cleanly() -> None:
    if not (os.environ.get("CI") or os.environ.get("INFERMUX_INSTALL_TEST")):
        pytest.skip("set INFERMUX_INSTALL_TEST=1 (or run under CI) to build and install the .deb in a chroot")
    if os.geteuid() != 0:
        pytest.skip("needs root (debootstrap, chroot): sudo packaging/test-install.sh")
    system_packages.require(HOST_TOOLS)
    with system_packages.exclusive(system_packages.BUILD_LOCK):  # the container test shares its caches
        proc = subprocess.run(["bash", str(REPO / "packaging/test-install.sh")], capture_output=True, text=True,
                              timeout=1200)
    summary = proc.stdout[proc.stdout.rfind("== summary"):]
    print(summary)  # each step's verdict and seconds: pytest -rP shows it
    assert proc.returncode == 0, summary or proc.stdout[-3000:] + proc.stderr[-3000:]
    passed = [line for line in summary.splitlines() if line.startswith("PASS")]
    for step in ("build 0.1.0 and 0.1.1", "the .so in infermux-wire alone", "daemon as infermux answers 200",
                 "compiled socket calls", "not started", "downgrade", "restarted, serves", "apt remove stops it",
                 "apt purge"):
        assert any(step in line for line in passed), summary
