"""Deployment files against the code: packaging/k8s (schemas, and what they say about the daemon) and the
container image (packaging/container: built and run where the machine can).

The manifests are checked offline against Kubernetes' own schemas
(kubernetes-validate bundles them), and against the daemon: the ConfigMap's
TOML is parsed by the daemon's loader, and the DaemonSets must mount every
path it names, probe the paths the metrics server answers on the port it
listens on, and give SIGTERM's drain the time it takes.
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import os
import resource
import shutil
import subprocess
import sys
import time
import types
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterator

import jsonschema
import kubernetes_validate
import numpy as np
import pytest
import yaml

from support import system_packages
from support.harness import REPO, free_port
from infermux import config as cfg
from infermux.admin.metrics import MetricsServer
from infermux.client import Client
from infermux.frontend.server import REFUSE_S
from infermux.workers.pool import SPARE_STOP_S

K8S = REPO / "packaging/k8s"
# The PrometheusRule custom resource (monitoring.coreos.com/v1) as the Prometheus Operator's CRD
# defines it, written out here (kubernetes-validate knows only Kubernetes' own kinds). Unknown
# fields fail, as kubectl's strict field validation fails them.
_DURATION = {"type": "string", "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?"
                                         r"(([0-9]+)s)?(([0-9]+)ms)?)$"}
_STRINGS = {"type": "object", "additionalProperties": {"type": "string"}}
PROMETHEUS_RULE_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"}, "kind": {"const": "PrometheusRule"},
        "metadata": {"type": "object"},
        "spec": {"type": "object", "additionalProperties": False, "properties": {"groups": {
            "type": "array", "items": {
                "type": "object", "required": ["name"], "additionalProperties": False,
                "properties": {
                    "name": {"type": "string", "minLength": 1}, "interval": _DURATION, "limit": {"type": "integer"},
                    "partial_response_strategy": {"type": "string"}, "query_offset": _DURATION, "labels": _STRINGS,
                    "rules": {"type": "array", "items": {
                        "type": "object", "required": ["expr"], "additionalProperties": False,
                        "oneOf": [{"required": ["alert"]}, {"required": ["record"]}],
                        "properties": {
                            "alert": {"type": "string"}, "record": {"type": "string"},
                            "expr": {"type": ["string", "integer"]}, "for": _DURATION,
                            "keep_firing_for": _DURATION, "labels": _STRINGS, "annotations": _STRINGS}}}}}}}}}}
CONTAINER = REPO / "packaging/container"
# The oldest Kubernetes still in k3s' supported releases when this was written, and the newest schema bundled.
KUBERNETES_VERSIONS = ("1.28.0", kubernetes_validate.latest_version())


@functools.lru_cache(maxsize=None)
def _documents() -> tuple[tuple[Path, dict[str, Any]], ...]:
    """Every manifest under packaging/k8s (read once; the tests only read them)."""
    return tuple((path, doc) for path in sorted(K8S.rglob("*.yaml"))
                 for doc in yaml.safe_load_all(path.read_text()) if doc)


def _kind(kind: str) -> list[dict[str, Any]]:
    return [doc for _, doc in _documents() if doc["kind"] == kind]


def _daemon_configmap() -> dict[str, Any]:
    """The daemon's configuration (the other ConfigMap holds Prometheus rules)."""
    (configmap,) = [c for c in _kind("ConfigMap") if "infermux.toml" in c["data"]]
    return configmap


def _configmap_toml() -> str:
    return _daemon_configmap()["data"]["infermux.toml"]


def _rebased_config(tmp_path: Path) -> cfg.Config:
    """The ConfigMap's configuration as the daemon loads it, its absolute paths moved under tmp_path,
    where the key files and folders it names are made (the loader checks that they exist)."""
    text = _configmap_toml().replace('"/', f'"{tmp_path}/')
    raw = cfg.tomllib.loads(text)["daemon"]
    Path(raw["curve_secret_key"]).parent.mkdir(parents=True)
    Path(raw["curve_secret_key"]).write_text("a stand-in: the loader only checks the file exists\n")
    Path(raw["curve_authorized_dir"]).mkdir(parents=True)
    return cfg.parse(text, tmp_path / "etc/infermux/config/infermux.toml")


def _unrebased(path: Path | str, tmp_path: Path) -> str:
    return "/" + str(Path(path).relative_to(tmp_path))


def _container(daemonset: dict[str, Any]) -> dict[str, Any]:
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    return container


def _mount_of(daemonset: dict[str, Any], path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The volume mount holding `path` (the deepest one) and its volume."""
    mounts = [m for m in _container(daemonset)["volumeMounts"]
              if path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/")]
    assert mounts, f"{daemonset['metadata']['name']}: nothing is mounted at {path}"
    mount = max(mounts, key=lambda m: len(m["mountPath"]))
    volumes = {v["name"]: v for v in daemonset["spec"]["template"]["spec"]["volumes"]}
    return mount, volumes[mount["name"]]


@pytest.fixture(params=[d["metadata"]["name"] for d in _kind("DaemonSet")])
def daemonset(request: pytest.FixtureRequest) -> dict[str, Any]:
    return next(d for d in _kind("DaemonSet") if d["metadata"]["name"] == request.param)


def test_every_manifest_passes_the_kubernetes_schemas() -> None:
    docs = _documents()
    assert {doc["kind"] for _, doc in docs} >= {"Namespace", "ConfigMap", "DaemonSet", "Secret", "PrometheusRule"}
    for path, doc in docs:
        for version in KUBERNETES_VERSIONS:
            try:
                if doc["kind"] == "PrometheusRule":  # a custom resource: its CRD's schema, its metadata Kubernetes'
                    jsonschema.validate(doc, PROMETHEUS_RULE_SCHEMA)
                    kubernetes_validate.validate({"apiVersion": "v1", "kind": "ConfigMap", "metadata": doc["metadata"]},
                                                 version, strict=True)
                else:
                    kubernetes_validate.validate(doc, version, strict=True)
            except (kubernetes_validate.ValidationError, jsonschema.ValidationError) as exc:
                pytest.fail(f"{path.relative_to(REPO)}: {doc['kind']} {doc['metadata']['name']} "
                            f"fails Kubernetes {version}: {exc.message} at {'.'.join(map(str, exc.path))}")


def test_the_prometheus_rule_manifests_carry_the_shipped_rules() -> None:
    # packaging/k8s/prometheus is written from packaging/prometheus/infermux-rules.yml; they must not drift.
    rules_file = REPO / "packaging/prometheus/infermux-rules.yml"
    rendered = _render_k8s().manifests()
    for name, text in rendered.items():
        assert (K8S / "prometheus" / name).read_text() == text, \
            f"packaging/k8s/prometheus/{name} differs from the rules: run python3 packaging/prometheus/render-k8s.py"
    (configmap,) = [c for c in _kind("ConfigMap") if "infermux-rules.yml" in c["data"]]
    assert configmap["data"]["infermux-rules.yml"] == rules_file.read_text()
    (rule,) = _kind("PrometheusRule")
    assert rule["spec"] == yaml.safe_load(rules_file.read_text())
    assert rule["metadata"]["namespace"] == configmap["metadata"]["namespace"]  # beside the Prometheus


def test_a_manifest_that_breaks_the_prometheus_rule_schema_is_caught() -> None:
    (rule,) = _kind("PrometheusRule")
    broken = copy.deepcopy(rule)
    broken["spec"]["groups"][1]["rules"][0]["fro"] = "5m"  # a misspelt field the operator would drop
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, PROMETHEUS_RULE_SCHEMA)
    broken = copy.deepcopy(rule)
    broken["spec"]["groups"][1]["rules"][0]["for"] = "5 minutes"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, PROMETHEUS_RULE_SCHEMA)


def _render_k8s() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("render_k8s", REPO / "packaging/prometheus/render-k8s.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_configmap_is_a_configuration_the_daemon_loads(tmp_path: Path) -> None:
    config = _rebased_config(tmp_path)
    assert config.daemon.metrics_port and config.daemon.metrics_host == "0.0.0.0"  # probes reach the pod address
    assert any(ep.startswith("tcp://") for ep in config.daemon.listen) and config.daemon.curve_secret_key


def test_the_daemonsets_mount_what_the_configuration_names(daemonset: dict[str, Any], tmp_path: Path) -> None:
    config = _rebased_config(tmp_path)
    container = _container(daemonset)
    args = container["args"]
    config_file = args[args.index("--config") + 1]
    mount, volume = _mount_of(daemonset, config_file)
    configmap = _daemon_configmap()
    assert volume["configMap"]["name"] == configmap["metadata"]["name"]
    assert Path(config_file).name in configmap["data"]
    assert mount["mountPath"] == str(Path(config_file).parent)  # a folder, not a subPath: it follows updates
    env = {e["name"]: e["value"] for e in container.get("env", [])}
    assert env.get("INFERMUX_CONFIG") == config_file
    secrets = {s["metadata"]["name"]: s for s in _kind("Secret")}
    for path, kind in ((config.daemon.curve_secret_key, "file"), (config.daemon.curve_authorized_dir, "folder")):
        assert path is not None
        where = _unrebased(path, tmp_path)
        _, volume = _mount_of(daemonset, where)
        name = volume["secret"]["secretName"]
        assert name in secrets, f"{where} comes from secret {name}, which examples/ does not show"
        if kind == "file":
            assert Path(where).name in secrets[name]["data"]
    engines = _unrebased(config.daemon.engine_dir, tmp_path)
    mount, volume = _mount_of(daemonset, engines)
    assert mount["mountPath"] == engines and ("hostPath" in volume or "persistentVolumeClaim" in volume)
    read_only_root = container["securityContext"]["readOnlyRootFilesystem"]
    writable = [ep[len("ipc://"):] for ep in (*config.daemon.listen, config.daemon.admin, config.daemon.stats)
                if ep.startswith("ipc://")]
    writable.append(str(config.daemon.mps_pipe_dir))
    prepared = {m["name"] for c in daemonset["spec"]["template"]["spec"].get("initContainers", [])
                for m in c["volumeMounts"]}
    for path in writable:
        mount, volume = _mount_of(daemonset, path)
        assert read_only_root and not mount.get("readOnly"), f"{path}: the daemon writes there"
        # The kubelet makes a missing hostPath root's: an init container hands it to the daemon's user.
        assert "hostPath" not in volume or volume["name"] in prepared, f"{path}: not writable by the daemon"


def test_probes_and_scrape_point_at_the_metrics_server(daemonset: dict[str, Any], tmp_path: Path) -> None:
    config = _rebased_config(tmp_path)
    container = _container(daemonset)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    # The paths the daemon's metrics server answers (its own route table; nothing is started).
    served = set(MetricsServer.routes(types.SimpleNamespace()))  # type: ignore[arg-type]
    probes = {kind: container[kind]["httpGet"] for kind in ("livenessProbe", "readinessProbe", "startupProbe")}
    assert probes["livenessProbe"]["path"] == "/healthz"
    assert probes["readinessProbe"]["path"] == probes["startupProbe"]["path"] == "/readyz"
    for probe in probes.values():
        assert probe["path"] in served and ports.get(probe["port"], probe["port"]) == config.daemon.metrics_port
        assert "host" not in probe  # the kubelet probes the pod address: metrics_host 0.0.0.0 answers there
    notes = daemonset["spec"]["template"]["metadata"]["annotations"]
    assert notes["prometheus.io/scrape"] == "true" and notes["prometheus.io/path"] in served
    assert int(notes["prometheus.io/port"]) == config.daemon.metrics_port
    tcp = [int(ep.rsplit(":", 1)[1]) for ep in config.daemon.listen if ep.startswith("tcp://")]
    assert set(tcp) <= set(ports.values()), "declare each tcp:// listener as a containerPort"


def test_the_grace_period_covers_the_sigterm_drain(daemonset: dict[str, Any], tmp_path: Path) -> None:
    drain = _rebased_config(tmp_path).daemon.drain_timeout_s
    grace = daemonset["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    # Server._drain: answer what was accepted (drain_timeout_s), refuse what is still queued (REFUSE_S);
    # then Workers.close stops the spare (SPARE_STOP_S). Past the grace period the kubelet SIGKILLs.
    needed = drain + REFUSE_S + SPARE_STOP_S
    assert needed < grace <= needed + 30, f"terminationGracePeriodSeconds {grace} for a drain of {needed} s"


def test_resources_gpu_and_user(daemonset: dict[str, Any]) -> None:
    container, pod = _container(daemonset), daemonset["spec"]["template"]["spec"]
    resources = container["resources"]
    assert {"cpu", "memory"} <= set(resources["requests"]) and "memory" in resources["limits"]
    if daemonset["spec"]["template"]["metadata"]["labels"]["infermux.io/variant"] == "dgpu":
        assert resources["limits"]["nvidia.com/gpu"] == resources["requests"]["nvidia.com/gpu"] == 1
    assert pod["runtimeClassName"] == "nvidia"
    uid = next(line.split("=", 1)[1] for line in (CONTAINER / "Containerfile").read_text().splitlines()
               if line.startswith("ARG UID="))
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] == int(uid)


def test_the_image_default_configuration_loads() -> None:
    config = cfg.load(CONTAINER / "infermux.toml")
    assert str(config.daemon.engine_dir) == "/var/lib/infermux/engines" and config.daemon.watch
    health_port = next(line for line in (CONTAINER / "Containerfile").read_text().splitlines()
                       if "INFERMUX_HEALTH_PORT=" in line)
    assert f"INFERMUX_HEALTH_PORT={config.daemon.metrics_port}" in health_port


# -- the container image ------------------------------------------------------------------------------

CACHE = Path(os.environ.get("INFERMUX_TEST_CACHE", "/var/cache/infermux-test"))
BASE_TAR = CACHE / "bookworm-minbase.tar"  # made (and shared) by packaging/test-install.sh
BASE_IMAGE = "localhost/infermux-base:bookworm"
# Rootful podman as the sandboxes and CI runners here allow it: runc with cgroupfs (no systemd), the host's
# network for the build's apt and pip, and limits at or below the caller's (no CAP_SYS_RESOURCE to raise).
CONTAINERS_CONF = """[containers]
default_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]
netns = "host"
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
"""
STORAGE_CONF = """[storage]
driver = "overlay"
runroot = "{root}/run"
graphroot = "{root}/graph"
"""


@pytest.fixture(scope="module")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The environment for rootful podman with its own configuration and image store (kept in CACHE)."""
    if not (os.environ.get("CI") or os.environ.get("INFERMUX_CONTAINER_TEST")):
        pytest.skip("set INFERMUX_CONTAINER_TEST=1 (or run under CI) to build the CPU image with podman and "
                    "serve from it (about 100 s, more the first time)")
    if os.geteuid() != 0:
        pytest.skip("needs root: rootful podman (sudo INFERMUX_CONTAINER_TEST=1 pytest tests/system/test_deployment.py)")
    system_packages.require({"podman": "podman", "runc": "runc", "debootstrap": "debootstrap"})
    _cache_folders()
    conf = tmp_path_factory.mktemp("podman")
    store = CACHE / "containers"
    soft = {name: resource.getrlimit(kind)[0] for name, kind in
            (("nofile", resource.RLIMIT_NOFILE), ("nproc", resource.RLIMIT_NPROC))}
    limit = {name: 8192 if v == resource.RLIM_INFINITY else min(8192, v) for name, v in soft.items()}
    (conf / "containers.conf").write_text(CONTAINERS_CONF.format(**limit))
    (conf / "storage.conf").write_text(STORAGE_CONF.format(root=store))
    env = {**os.environ, "CONTAINERS_CONF": str(conf / "containers.conf"),
           "CONTAINERS_STORAGE_CONF": str(conf / "storage.conf")}
    info = subprocess.run(["podman", "info"], env=env, capture_output=True, text=True, timeout=120)
    if info.returncode != 0:
        pytest.skip(f"podman cannot run containers here: {(info.stderr.strip().splitlines() or ['?'])[-1]}")
    yield env


def _cache_folders() -> None:
    """The cache's folders, made here: on a machine that never ran this test or the install test (which
    shares them) there are none, and debootstrap refuses a --cache-dir that does not exist."""
    (CACHE / "apt-archives" / "partial").mkdir(parents=True, exist_ok=True)
    (CACHE / "containers").mkdir(parents=True, exist_ok=True)


def _base_image(env: dict[str, str]) -> None:
    """A Debian 12 base image from debootstrap (no registry is reachable): the tarball test-install.sh caches."""
    if subprocess.run(["podman", "image", "exists", BASE_IMAGE], env=env).returncode == 0:
        return
    if not BASE_TAR.is_file():
        work = CACHE / "minbase.tmp"
        shutil.rmtree(work, ignore_errors=True)
        subprocess.run(["debootstrap", "--variant=minbase", f"--cache-dir={CACHE / 'apt-archives'}", "bookworm",
                        str(work)], check=True, capture_output=True, timeout=900)
        subprocess.run(["tar", "-C", str(work), "--numeric-owner", "-cf", f"{BASE_TAR}.tmp", "."], check=True)
        os.replace(f"{BASE_TAR}.tmp", BASE_TAR)
        shutil.rmtree(work)
    subprocess.run(["podman", "import", str(BASE_TAR), BASE_IMAGE], env=env, check=True, capture_output=True,
                   timeout=300)


def _build_cpu_image(podman: dict[str, str]) -> None:
    """infermux:test-cpu from the debootstrap base, the .debs cached between runs (skips where podman
    cannot run a container)."""
    _base_image(podman)
    probe = subprocess.run(["podman", "run", "--rm", BASE_IMAGE, "true"], env=podman, capture_output=True,
                           text=True, timeout=120)
    if probe.returncode != 0:
        pytest.skip(f"podman cannot run containers here: {(probe.stderr.strip().splitlines() or ['?'])[-1]}")
    build = subprocess.run(
        ["bash", str(CONTAINER / "build.sh"), "cpu", "--network=host",
         "-v", f"{CACHE / 'apt-archives'}:/var/cache/apt/archives"],
        env={**podman, "BASE": BASE_IMAGE, "OFFLINE": "1", "PYTHON": sys.executable, "TAG": "infermux:test-cpu"},
        capture_output=True, text=True, timeout=900)
    assert build.returncode == 0, build.stdout[-2000:] + build.stderr[-4000:]


@pytest.mark.slow
def test_the_cpu_image_builds_and_answers_a_request(podman: dict[str, str], tmp_path: Path) -> None:
    started = time.monotonic()
    with system_packages.exclusive(system_packages.BUILD_LOCK):  # the install test shares the caches
        _build_cpu_image(podman)
    built = time.monotonic()
    run_dir, config_dir = tmp_path / "run", tmp_path / "config"
    run_dir.mkdir()
    config_dir.mkdir()
    os.chown(run_dir, 10001, 10001)  # the image's user makes its sockets there
    port = free_port()
    config = (CONTAINER / "infermux.toml").read_text()
    config = config.replace('metrics_host = "0.0.0.0"', 'metrics_host = "127.0.0.1"')  # the host's network
    (config_dir / "infermux.toml").write_text(config.replace("metrics_port = 9464", f"metrics_port = {port}"))
    name = f"infermux-test-{os.getpid()}"
    subprocess.run(["podman", "run", "-d", "--name", name, "-e", f"INFERMUX_HEALTH_PORT={port}",
                    "-v", f"{REPO / 'engines'}:/var/lib/infermux/engines:ro", "-v", f"{run_dir}:/run/infermux",
                    "-v", f"{config_dir}:/etc/infermux/config:ro", "infermux:test-cpu"],
                   env=podman, check=True, capture_output=True, timeout=120)
    try:
        reply = _first_200(run_dir / "infer.sock", lambda: _logs(podman, name))
        assert reply.outputs["probs"].shape == (1, 10)
        # Ready once every model is: the classifier's first 200 can come while another still loads.
        assert _ready(f"http://127.0.0.1:{port}/readyz") == 200
        health = subprocess.run(["podman", "healthcheck", "run", name], env=podman, capture_output=True,
                                text=True, timeout=60)
        assert health.returncode == 0, health.stdout + health.stderr
        user = subprocess.run(["podman", "exec", name, "id", "-u"], env=podman, capture_output=True, text=True,
                              timeout=60).stdout.strip()
        assert user == "10001"
        status = subprocess.run(["podman", "exec", name, "infermux", "status"], env=podman, capture_output=True,
                                text=True, timeout=60)  # $INFERMUX_CONFIG in the image names the sockets
        assert status.returncode == 0 and "classifier" in status.stdout, status.stdout + status.stderr
        # The image built infermux's sdist, its C extension included, with a compiler it then removed.
        doctor = subprocess.run(["podman", "exec", name, "infermux", "doctor"], env=podman, capture_output=True,
                                text=True, timeout=120)
        assert "compiled socket calls" in doctor.stdout, doctor.stdout + doctor.stderr
        compilers = subprocess.run(["podman", "exec", name, "sh", "-c", "command -v gcc cc || true"], env=podman,
                                   capture_output=True, text=True, timeout=60)
        assert compilers.stdout.strip() == "", compilers.stdout
        subprocess.run(["podman", "stop", "-t", "20", name], env=podman, check=True, capture_output=True,
                       timeout=60)
        code = subprocess.run(["podman", "inspect", name, "--format", "{{.State.ExitCode}}"], env=podman,
                              capture_output=True, text=True, timeout=60).stdout.strip()
        logs = subprocess.run(["podman", "logs", name], env=podman, capture_output=True, text=True, timeout=60)
        assert code == "0", logs.stdout[-3000:] + logs.stderr[-3000:]
    finally:
        subprocess.run(["podman", "rm", "-f", name], env=podman, capture_output=True, timeout=60)
        # Every build makes new layers (the wheels differ): keep only the base image in the cache.
        subprocess.run(["podman", "rmi", "-f", "infermux:test-cpu"], env=podman, capture_output=True, timeout=120)
        subprocess.run(["podman", "image", "prune", "-f"], env=podman, capture_output=True, timeout=120)
    print(f"container: image built in {built - started:.0f} s, served and stopped in {time.monotonic() - built:.0f} s")


def _logs(podman: dict[str, str], name: str) -> str:
    """The container's output, for a failure message."""
    logs = subprocess.run(["podman", "logs", name], env=podman, capture_output=True, text=True, timeout=60)
    return (logs.stdout + logs.stderr)[-3000:]


def _ready(url: str, within_s: float = 60.0) -> int:
    """The readiness probe's status once it is 200, or its last one after `within_s` (503 while loading)."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as ready:
                return ready.status
        except urllib.error.HTTPError as exc:
            if exc.code != 503 or time.monotonic() > deadline:
                return exc.code
        time.sleep(0.2)  # polling a state, not a race


def _first_200(sock: Path, logs: Callable[[], str], within_s: float = 60.0) -> Any:
    """The first 200 from the classifier: the container starts, discovers the engines and loads them first."""
    x = np.zeros((1, 3, 64, 64), np.float32)
    deadline = time.monotonic() + within_s
    last: object = None
    with Client(f"ipc://{sock}", timeout_s=2) as client:
        while time.monotonic() < deadline:
            try:
                reply = client.infer("classifier", {"images": x})
            except TimeoutError as exc:  # not listening yet
                last = exc
                continue
            if reply.status == 200:
                return reply
            last = (reply.status, reply.error)
            time.sleep(0.2)  # 503 while loading, 404 until discovery found it: polling a state, not a race
    pytest.fail(f"no 200 from the container within {within_s} s; last: {last}\ncontainer log:\n{logs()}")
