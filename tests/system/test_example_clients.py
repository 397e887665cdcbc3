"""The example clients in examples/clients/ (Node.js, C++, Go) answer a sample request.

Each is built with its own toolchain the way examples/clients/README.md says,
then run against one real daemon serving the sample engines (engines/), and
its printed top class and score are checked against onnxruntime run here on
the same input. Toolchains come from Debian and npm: in CI (root) the test
installs what is missing (tests/support/system_packages.py); elsewhere it skips and
names the command.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Iterator

import numpy as np
import onnxruntime as ort
import pytest

from support import system_packages
from support.harness import DAEMON_HEAD, REPO, Daemon

CLIENTS = REPO / "examples" / "clients"
SAMPLES = {"classifier": ("images", (1, 3, 64, 64)), "mlp": ("features", (1, 256))}
MODELS = "".join(f'[[models]]\nname = "{name}"\nengine = "{name}/1/model.onnx"\n' for name in SAMPLES)

# What each client needs: a command or a file -> the Debian package that has it.
NEEDS = {
    "node": {"node": "nodejs", "npm": "npm"},
    "cpp": {"g++": "g++", "pkg-config": "pkg-config", "/usr/include/zmq.hpp": "cppzmq-dev",
            "/usr/include/nlohmann/json.hpp": "nlohmann-json3-dev"},
    "go": {"go": "golang-go", "pkg-config": "pkg-config", "/usr/include/zmq.h": "libzmq3-dev"},
}
BUILD_TIMEOUT_S = 300
LINE = re.compile(r"^(\w+): status 200, version 1, \w+ float32\[1,10\], top class (\d+) \(([-+.e0-9]+)\), \d+ us")


@pytest.fixture(scope="module")
def sample_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """One daemon for the module, serving the sample engines as shipped."""
    workdir = tmp_path_factory.mktemp("example-clients")
    daemon = Daemon(workdir, (DAEMON_HEAD + MODELS).format(engines=REPO / "engines")).start()
    yield daemon
    assert daemon.stop() == 0, daemon.log()


@pytest.fixture(scope="module")
def expected() -> dict[str, tuple[int, float]]:
    """Top class and score of each sample model on the clients' input, x[i] = (i % 17) / 16."""
    out = {}
    for model, (name, shape) in SAMPLES.items():
        x = (np.arange(np.prod(shape)) % 17 / 16).astype(np.float32).reshape(shape)
        y = ort.InferenceSession(str(REPO / f"engines/{model}/1/model.onnx")).run(None, {name: x})[0]
        out[model] = (int(y.argmax()), float(y.max()))
    return out


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> None:
    proc = subprocess.run(cmd, cwd=cwd, env={**os.environ, **(env or {})}, capture_output=True, text=True,
                          timeout=BUILD_TIMEOUT_S)
    if proc.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}")


def build_node(src: Path, out: Path) -> list[str]:
    shutil.copytree(src, out, dirs_exist_ok=True, ignore=shutil.ignore_patterns("node_modules"))
    _run(["npm", "install", "--no-audit", "--no-fund", "--loglevel=error"], out)  # zeromq 6 from the npm registry
    return ["node", str(out / "client.js")]


def build_cpp(src: Path, out: Path) -> list[str]:
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "libzmq"], capture_output=True, text=True,
                           check=True).stdout.split()
    _run(["g++", "-std=c++17", "-Wall", str(src / "client.cpp"), "-o", str(out / "infermux-client"), *flags], src)
    return [str(out / "infermux-client")]


def build_go(src: Path, out: Path) -> list[str]:
    # Offline by construction: no module to download, no toolchain to fetch.
    env = {"GOPROXY": "off", "GOTOOLCHAIN": "local"}
    if not (os.environ.get("HOME") or os.environ.get("XDG_CACHE_HOME") or os.environ.get("GOCACHE")):
        env["GOCACHE"] = str(out / "gocache")
    _run(["go", "build", "-o", str(out / "infermux-client"), "."], src, env)
    return [str(out / "infermux-client")]


BUILDERS = {"node": build_node, "cpp": build_cpp, "go": build_go}


@pytest.fixture(scope="module", params=list(BUILDERS))
def client(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The command that runs one example client, built; skipped (before any daemon starts) without its toolchain."""
    language = request.param
    system_packages.require(NEEDS[language])
    return BUILDERS[language](CLIENTS / language, tmp_path_factory.mktemp(language))


@pytest.mark.slow
def test_the_example_client_answers_a_sample_request(client: list[str], sample_daemon: Daemon,
                                                     expected: dict[str, tuple[int, float]]) -> None:
    proc = subprocess.run([*client, sample_daemon.endpoint], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not proc.stderr, proc.stderr
    got = {}
    for line in proc.stdout.splitlines():
        match = LINE.match(line)
        assert match, f"unexpected line from {client[-1]}: {line!r}"
        got[match[1]] = (int(match[2]), float(match[3]))
    assert set(got) == set(expected), proc.stdout
    for model, (top, score) in expected.items():
        assert got[model][0] == top and got[model][1] == pytest.approx(score, rel=1e-5), (model, got[model])


@pytest.mark.slow
def test_the_example_client_reports_a_refused_request_and_exits_1(client: list[str], daemon: Daemon) -> None:
    # The session daemon serves the classifier but no `mlp`: one reply is a 404.
    proc = subprocess.run([*client, daemon.endpoint], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "mlp: status 404: unknown model 'mlp'" in proc.stdout
    assert "classifier: status 200" in proc.stdout and "Traceback" not in proc.stderr


@pytest.mark.parametrize("language", list(BUILDERS))
def test_each_client_is_documented_with_the_command_the_test_runs(language: str) -> None:
    readme = (CLIENTS / "README.md").read_text()
    assert f"({language}/)" in readme, f"examples/clients/README.md does not link {language}/"
    for needed in NEEDS[language].values():
        assert needed in readme, f"examples/clients/README.md does not name the package {needed}"


def test_the_links_in_the_clients_readme_lead_somewhere() -> None:
    readme = CLIENTS / "README.md"
    targets = re.findall(r"\]\(([^)\s#]+)", readme.read_text())
    assert targets and not [t for t in targets if not (readme.parent / t).exists()]
