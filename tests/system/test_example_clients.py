"""The example clients in examples/clients/ (Node.js, C++, Go) answer a sample request, and stream frames.

Each is built with its own toolchain the way examples/clients/README.md says,
then run against one real daemon serving the sample engines (engines/), and
its printed top class and score are checked against onnxruntime run here on
the same input. Each language's frames example sends two cameras' raw
frames to a pipeline over the classifier, one frame in flight per camera, a
newer frame replacing one not sent yet; each class it prints is checked
against the same frame sent from Python (`infermux.client.Frame`). Toolchains come from Debian and npm: in CI (root) the test
installs what is missing (tests/support/system_packages.py); elsewhere it skips and
names the command.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import onnxruntime as ort
import pytest

from infermux.client import Client, Frame
from support import system_packages
from support.harness import DAEMON_HEAD, REPO, Daemon
from support.pipelines import camera_pipeline

CLIENTS = REPO / "examples" / "clients"
SAMPLES = {"classifier": ("images", (1, 3, 64, 64)), "mlp": ("features", (1, 256))}
MODELS = "".join(f'[[models]]\nname = "{name}"\nengine = "{name}/1/model.onnx"\n' for name in SAMPLES)
# What the frames examples send to: a camera's frame, classified (queue_policy newest_per_key, as shipped).
CAMERA = camera_pipeline("camera", classify=True)
FRAME = re.compile(r"^(cam-[12]) frame (\d+): status 200, class (\d+) \(([-+.e0-9]+)\)$")
SUMMARY = re.compile(r"^(cam-[12]): 8 frames, (\d+) sent, (\d+) replaced, (\d+) served$")

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
    daemon = Daemon(workdir, (DAEMON_HEAD + MODELS + CAMERA).format(engines=REPO / "engines")).start()
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


@dataclass
class Built:
    """The commands that run one language's example client and its frames example."""

    client: list[str]
    frames: list[str]


def build_node(src: Path, out: Path) -> Built:
    shutil.copytree(src, out, dirs_exist_ok=True, ignore=shutil.ignore_patterns("node_modules"))
    _run(["npm", "install", "--no-audit", "--no-fund", "--loglevel=error"], out)  # zeromq 6 from the npm registry
    return Built(["node", str(out / "client.js")], ["node", str(out / "frames.js")])


def build_cpp(src: Path, out: Path) -> Built:
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "libzmq"], capture_output=True, text=True,
                           check=True).stdout.split()
    for source, binary in (("client.cpp", "infermux-client"), ("frames.cpp", "infermux-frames")):
        _run(["g++", "-std=c++17", "-Wall", str(src / source), "-o", str(out / binary), *flags], src)
    return Built([str(out / "infermux-client")], [str(out / "infermux-frames")])


def build_go(src: Path, out: Path) -> Built:
    # Offline by construction: no module to download, no toolchain to fetch.
    env = {"GOPROXY": "off", "GOTOOLCHAIN": "local"}
    if not (os.environ.get("HOME") or os.environ.get("XDG_CACHE_HOME") or os.environ.get("GOCACHE")):
        env["GOCACHE"] = str(out / "gocache")
    _run(["go", "build", "-o", str(out / "infermux-client"), "."], src, env)
    return Built([str(out / "infermux-client")], [str(out / "infermux-client"), "frames"])


BUILDERS = {"node": build_node, "cpp": build_cpp, "go": build_go}


@pytest.fixture(scope="module", params=list(BUILDERS))
def built(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Built:
    """One language's example client and frames example, built; skipped (before any daemon starts) without
    its toolchain."""
    language = request.param
    system_packages.require(NEEDS[language])
    return BUILDERS[language](CLIENTS / language, tmp_path_factory.mktemp(language))


@pytest.fixture
def client(built: Built) -> list[str]:
    return built.client


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


def frame(cam: int, n: int) -> bytes:
    """What the frames examples send as camera `cam`'s frame `n`: byte i is (7 i + 13 n + 101 cam) mod 256."""
    return ((7 * np.arange(64 * 48 * 3) + 13 * n + 101 * cam) % 256).astype(np.uint8).tobytes()


@pytest.mark.slow
def test_the_frames_example_streams_two_cameras_and_each_class_is_the_frame_s(built: Built,
                                                                              sample_daemon: Daemon) -> None:
    proc = subprocess.run([*built.frames, sample_daemon.endpoint, "camera"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not proc.stderr, proc.stderr
    served: dict[tuple[int, int], tuple[int, float]] = {}
    summaries = {}
    for line in proc.stdout.splitlines():
        if (match := FRAME.match(line)) is not None:
            served[(int(match[1][-1]) - 1, int(match[2]))] = (int(match[3]), float(match[4]))
        elif (match := SUMMARY.match(line)) is not None:
            summaries[match[1]] = (int(match[2]), int(match[3]), int(match[4]))
        else:
            pytest.fail(f"unexpected line from {built.frames}: {line!r}")
    with Client(sample_daemon.endpoint) as client:
        for (cam, n), (index, score) in served.items():
            reply = client.infer("camera", Frame(frame(cam, n), "bgr", width=64, height=48, stride=192))
            best = reply.header["classes"][0][0]
            assert (best["index"], best["score"]) == (index, pytest.approx(score, rel=1e-5)), (cam, n)
    for cam in (0, 1):
        sent, replaced, count = summaries[f"cam-{cam + 1}"]
        assert sent + replaced == 8 and count == sent == sum(1 for c, _ in served if c == cam)
        assert (cam, 7) in served  # the newest frame is always sent and answered


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
