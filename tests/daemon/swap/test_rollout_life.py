"""A version's life under shadow rollout against a real daemon (docs/hot-swap.md#a-versions-life): whatever
happens to the files, a model that had a serving version keeps one, each version is listed once with its
state, and a candidate's verdict is the daemon's state, kept across a restart."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

import pytest

from infermux import signing
from infermux.swap.rollout import PACE_SHARE
from support import models
from support.harness import Daemon
from support.procfs import cpu_s, nice_values
from support.polling import eventually
from support.publish import PROBE, publish, wait_served, watching
from support.traffic import Traffic


ROLLOUT = """
timeout_ms = 30000
placement = "{placement}"
{head}[rollout]
shadow_requests = {n}
min_agreement = 0.99
min_idle_cpu = 0
max_latency_ratio = {ratio}
{rollout_extra}"""


@pytest.fixture
def start(tmp_path: Path, root: Path) -> Iterator[Callable[..., Daemon]]:
    """Start a daemon on `root` whose model `m` has a rollout table; `workdir` reuses a daemon's folder
    (and so its state directory): a restart."""
    started: list[Daemon] = []

    def run(n: int = 5, daemon_extra: str = "", rollout_extra: str = "", workdir: Path | None = None,
            ratio: float = 0, placement: str = "hot", head: str = "") -> Daemon:
        # max_latency_ratio 0 but where a test judges speed: a nice-19 candidate's p99 on a busy box
        # says more about the box than about the engine.
        write_settings(root, n, rollout_extra, ratio, placement, head)
        if workdir is None:
            workdir = tmp_path / f"daemon{len(started)}"
            workdir.mkdir()
        daemon = Daemon(workdir, watching(root) + daemon_extra + "\n")
        started.append(daemon)
        return daemon.start()

    yield run
    for daemon in started:
        if daemon.alive():
            assert daemon.stop() == 0, daemon.log()
        moves = [x for x in daemon.log().splitlines() if "is not in the table (models/life.py)" in x]
        assert not moves, moves  # every move of a version is one its life's table has


def write_settings(root: Path, n: int, rollout_extra: str = "", ratio: float = 0, placement: str = "hot",
                   head: str = "") -> None:
    """m/model.toml with its rollout table (`head`: settings above it); the same text again leaves a signature
    over it valid."""
    (root / "m").mkdir(exist_ok=True)
    text = ROLLOUT.format(n=n, rollout_extra=rollout_extra, ratio=ratio, placement=placement, head=head)
    if not (root / "m" / "model.toml").exists() or (root / "m" / "model.toml").read_text() != text:
        (root / "m" / "model.toml").write_text(text)


def cli(daemon: Daemon, *argv: str) -> subprocess.CompletedProcess:
    """`infermux ARGV` against this daemon's admin socket, as an operator runs it."""
    return subprocess.run([sys.executable, "-m", "infermux", *argv, "-e", daemon.admin_endpoint], text=True,
                          capture_output=True, timeout=60)


def listed(daemon: Daemon, model: str = "m") -> list[tuple[str, str, str]]:
    """(version, state, reason) of every row `infermux status --json` lists for `model`."""
    done = cli(daemon, "status", "--json")
    assert done.returncode == 0, done.stderr
    return [(row["version"], row["state"], row["reason"]) for row in json.loads(done.stdout)["models"]
            if row["name"] == model]


def states(daemon: Daemon, model: str = "m") -> dict[str, str]:
    """version -> state, checking that no version is listed twice."""
    rows = listed(daemon, model)
    versions = [version for version, _, _ in rows]
    assert len(versions) == len(set(versions)), rows
    return {version: state for version, state, _ in rows}


def promote_2(root: Path, daemon: Daemon, traffic: Traffic) -> None:
    """Version 1 serves; version 2 (the same answers) is published, shadows, passes and serves."""
    publish(root, "m", 2, offset=1)
    daemon.wait_for("rollout_passed model=m version=2", 60)
    traffic.saw("2")
    eventually(lambda: states(daemon) == {"2": "ready"}, "version 1 retired once 2 serves", 30)
    daemon.wait_for("unloaded model=m version=1 reason=superseded", 30)  # what it was promoted over drained


@pytest.mark.parametrize("placement", ["hot", "cold"])
def test_removing_the_promoted_versions_folder_falls_back_to_the_older_version_at_once(
        root: Path, start: Callable[..., Daemon], placement: str) -> None:
    publish(root, "m", 1, offset=1)
    daemon = start(placement=placement)
    wait_served(daemon, "m", "1", offset=1, timeout=30)
    with Traffic(daemon, "m") as traffic:
        promote_2(root, daemon, traffic)
        shutil.rmtree(root / "m" / "2")
        daemon.wait_for("rolled_back model=m version=1", 30)
        wait_served(daemon, "m", "1", offset=1, timeout=30)
        served = len(traffic.replies)
        eventually(lambda: len(traffic.replies) > served + 20, "requests after the rollback", 30)
    statuses = {reply.status for reply in traffic.replies}
    assert statuses == {200}, (sorted(statuses), [r.header for r in traffic.replies if r.status != 200][:3])
    assert "rollout_started model=m version=1" not in daemon.log()  # a rollback does not shadow
    (line,) = [x for x in daemon.log().splitlines() if "infermux.events: rolled_back " in x]
    assert "version 2's engine folder was removed" in line, line
    assert states(daemon) == {"1": "ready"}


def test_a_candidate_refused_as_it_loads_retires_no_serving_version_and_none_shadows_itself(
        root: Path, start: Callable[..., Daemon]) -> None:
    """Versions 1 and 2 serve (latest_n = 2); version 3, over max_memory_mb as it loads, is refused within the
    swapper's own pass, before that pass retires what its plan dropped. Version 1, which 3 would have retired,
    stays serving as 3's stand-in: never drained as superseded, never loaded again as a candidate of itself."""
    publish(root, "m", 1, offset=1)
    publish(root, "m", 2, offset=1)
    daemon = start(head="latest_n = 2\n", rollout_extra="max_memory_mb = 0.000001\n")  # a byte: refused at load
    eventually(lambda: states(daemon) == {"1": "ready", "2": "ready"}, "versions 1 and 2 serve", 30)
    with Traffic(daemon, "m") as traffic:
        publish(root, "m", 3, offset=1)
        daemon.wait_for("rollout_failed model=m version=3", 30)
        daemon.wait_for("settled model=m version=1", 30)
        served = len(traffic.replies)
        eventually(lambda: len(traffic.replies) > served + 5, "requests after the refusal", 30)
    failed = [x for x in daemon.log().splitlines() if "infermux.events: rollout_failed " in x]
    assert len(failed) == 1 and "over max_memory_mb" in failed[0] and "compared=0" in failed[0], daemon.log()
    after = daemon.log().split("rollout_started model=m version=3")[1]
    moved = [x for x in after.splitlines() if any(f"{e} model=m version=1 " in x for e in ("draining", "loading",
                                                                                           "rollout_started"))]
    assert not moved, daemon.log()  # version 1 served on as it was
    assert {r.status for r in traffic.replies} == {200}, sorted({(r.status, r.version) for r in traffic.replies})
    assert states(daemon) == {"1": "ready", "2": "ready", "3": "failed"}


@pytest.fixture
def key(tmp_path: Path) -> tuple[Path, Path]:
    """A trusted publisher's private and public key."""
    (tmp_path / "keys").mkdir()
    return signing.keygen(tmp_path / "keys" / "publisher")


def publish_signed(root: Path, private: Path, version: int, offset: float) -> None:
    """A version signed where it is staged, then renamed into place (docs/hot-swap.md, the device workflow)."""
    staged = models.add_one(root / "m" / f".{version}" / "model.onnx", offset=offset)
    signing.sign(signing.load_private(private), staged, "m", str(version))
    (root / "m" / f".{version}").rename(root / "m" / str(version))


def test_signing_a_refused_version_in_place_makes_it_a_candidate_and_leaves_the_promoted_one_serving(
        root: Path, start: Callable[..., Daemon], key: tuple[Path, Path]) -> None:
    private, public = key
    write_settings(root, n=100000)  # signed with the engines: each decides only by an operator here
    publish_signed(root, private, 1, offset=1)
    daemon = start(n=100000, daemon_extra=f'engine_signing_keys = ["{public}"]')
    wait_served(daemon, "m", "1", offset=1, timeout=30)
    with Traffic(daemon, "m") as traffic:
        publish_signed(root, private, 2, offset=1)
        daemon.wait_for("rollout_started model=m version=2", 30)
        assert cli(daemon, "ctl", "promote-now", "m", "2").returncode == 0
        traffic.saw("2")
        eventually(lambda: states(daemon) == {"2": "ready"}, "version 1 retired once 2 serves", 30)
        publish(root, "m", 5, offset=1)  # unsigned: refused
        daemon.wait_for("failed model=m version=5", 30)
        assert states(daemon) == {"2": "ready", "5": "failed"}
        signing.sign(signing.load_private(private), root / "m" / "5" / "model.onnx")  # as the refusal advises
        daemon.wait_for("rollout_started model=m version=5", 30)
        served = len(traffic.replies)
        eventually(lambda: len(traffic.replies) > served + 20, "requests while 5 shadows", 30)
        rows = listed(daemon)
        assert sorted((v, s) for v, s, _ in rows) == [("2", "ready"), ("5", "candidate")], rows
        assert "not signed" not in dict((v, r) for v, _, r in rows)["5"], rows
    first_two = [r.version for r in traffic.replies].index("2")
    assert all(r.status == 200 and r.version == "2" for r in traffic.replies[first_two:]), \
        sorted({(r.status, r.version) for r in traffic.replies[first_two:]})
    unloaded = [line for line in daemon.log().splitlines() if "unloaded model=m version=2 " in line]
    # Only the candidate's worker, once version 2 was loaded afresh at its own placement and served.
    assert len(unloaded) == 1 and "promoted: its version serves at its own placement" in unloaded[0], unloaded
    assert daemon.log().count("infermux.events: loading model=m version=1 ") == 1  # never again once 2 served


def restart(daemon: Daemon) -> int:
    """Stop and start `daemon` on the same folders (its state directory included); where its new log begins."""
    assert daemon.stop() == 0, daemon.log()
    mark = len(daemon.log())
    daemon.start()
    return mark


def test_a_refused_version_stays_refused_across_a_restart_until_an_operator_retries_it(
        root: Path, start: Callable[..., Daemon]) -> None:
    publish(root, "m", 1, offset=1)
    daemon = start()
    wait_served(daemon, "m", "1", offset=1, timeout=30)
    with Traffic(daemon, "m"):
        publish(root, "m", 2, offset=1.5)  # answers otherwise: refused
        daemon.wait_for("rollout_failed model=m version=2", 60)
    mark = restart(daemon)
    wait_served(daemon, "m", "1", offset=1, timeout=30)  # at once: no 503, no shadowing again
    (row,) = [r for r in listed(daemon) if r[0] == "2"]
    assert row[1] == "failed" and "rollout failed: it can no longer reach min_agreement: 0 of 1 compared agree" in row[2], row
    assert states(daemon) == {"1": "ready", "2": "failed"}
    assert "rollout_started model=m version=2" not in daemon.log()[mark:]
    assert (daemon.state_dir / "verdicts.json").stat().st_mode & 0o777 == 0o600
    wrong = cli(daemon, "ctl", "retry", "m", "1")
    assert wrong.returncode == 1 and "m:1 has no verdict to take back" in wrong.stderr, wrong.stderr
    retried = cli(daemon, "ctl", "retry", "m", "2")
    assert retried.returncode == 0 and "m:2 will shadow again" in retried.stdout, retried.stderr
    daemon.wait_for("rollout_started model=m version=2", 30, since=mark)
    assert states(daemon) == {"1": "ready", "2": "candidate"}


def test_a_candidate_cancelled_by_a_restart_shadows_again_instead_of_serving_at_start(
        root: Path, start: Callable[..., Daemon]) -> None:
    publish(root, "m", 1, offset=1)
    daemon = start(n=100000)  # never decided by itself
    wait_served(daemon, "m", "1", offset=1, timeout=30)
    publish(root, "m", 2, offset=2)
    daemon.wait_for("rollout_started model=m version=2", 30)
    mark = restart(daemon)
    with daemon.client() as client:  # the first answer after READY already comes from version 1
        reply = client.infer("m", {"x": PROBE})
    assert reply.status == 200 and reply.version == "1", (reply.status, reply.version, reply.header)
    daemon.wait_for("held_back model=m version=2", 5, since=mark)
    daemon.wait_for("rollout_started model=m version=2", 30, since=mark)
    assert states(daemon) == {"1": "ready", "2": "candidate"}
    wait_served(daemon, "m", "1", offset=1)


def test_a_rejected_version_stays_listed_with_its_reason_after_the_next_candidate_and_a_restart(
        root: Path, start: Callable[..., Daemon]) -> None:
    publish(root, "m", 1, offset=1)
    daemon = start(n=100000)
    wait_served(daemon, "m", "1", offset=1, timeout=30)
    publish(root, "m", 2, offset=2)
    daemon.wait_for("rollout_started model=m version=2", 30)
    assert cli(daemon, "ctl", "reject", "m", "2").returncode == 0
    publish(root, "m", 3, offset=1)
    daemon.wait_for("rollout_started model=m version=3", 30)
    rows = {version: (state, reason) for version, state, reason in listed(daemon)}
    assert rows["2"] == ("failed", "rejected by an operator") and rows["3"][0] == "candidate", rows
    assert states(daemon) == {"1": "ready", "2": "failed", "3": "candidate"}
    restart(daemon)
    wait_served(daemon, "m", "1", offset=1)
    eventually(lambda: states(daemon) == {"1": "ready", "2": "failed", "3": "candidate"}, "3 shadows again", 30)
    assert dict((v, r) for v, _, r in listed(daemon))["2"] == "rejected by an operator"


def publish_heavy(root: Path, version: int, repeat: int) -> None:
    """y = x + 1, as version 1 answers, through an [N, 4, repeat] intermediate each call allocates."""
    models.heavy(root / "m" / f".{version}" / "model.onnx", offset=1, repeat=repeat)
    (root / "m" / f".{version}").rename(root / "m" / str(version))


@pytest.mark.parametrize(("repeat", "settings", "why"), [
    (500_000, {"ratio": 1.5}, "rollout failed: too slow: its "),  # fastest (grossly slow) or median
    (4_000_000, {"rollout_extra": "max_memory_mb = 64\n"}, "MiB, over max_memory_mb = 64 (measured while it computed)"),
], ids=["slow", "memory-hungry"])
def test_a_candidate_that_agrees_but_is_slow_or_memory_hungry_is_refused_before_it_serves(
        root: Path, start: Callable[..., Daemon], repeat: int, settings: dict, why: str) -> None:
    publish_heavy(root, 1, repeat=1)
    daemon = start(n=200, **settings)
    wait_served(daemon, "m", "1", offset=1, timeout=30)
    with Traffic(daemon, "m") as traffic:
        publish_heavy(root, 2, repeat=repeat)  # the same answers, at 30 ms or 128 MiB a call
        daemon.wait_for("rollout_failed model=m version=2", 90)
    (failed,) = [x for x in daemon.log().splitlines() if "infermux.events: rollout_failed " in x]
    assert why in failed and "agreement=1.0 " in failed, failed
    compared = int(failed.split(" compared=")[1].split()[0])
    assert compared < 200, failed  # the moment it could no longer pass, not after its 200 comparisons
    assert traffic.replies and all(r.status == 200 and r.version == "1" for r in traffic.replies)
    assert states(daemon) == {"1": "ready", "2": "failed"}


def test_a_small_candidate_fits_a_small_max_memory_mb_though_its_worker_holds_an_interpreter(
        root: Path, start: Callable[..., Daemon]) -> None:
    """A candidate's memory is what its worker holds beyond a fresh worker's (the interpreter and its imports,
    about 50 MiB, which the model's own hot version never holds): an add-one model fits in 32 MiB and passes."""
    publish_heavy(root, 1, repeat=1)
    daemon = start(n=5, rollout_extra="max_memory_mb = 32\n")
    wait_served(daemon, "m", "1", offset=1, timeout=30)
    publish_heavy(root, 2, repeat=1)
    daemon.wait_for("rollout_started model=m version=2", 30)
    row = version_row(daemon, "2", "candidate")  # no traffic yet: it waits, shadowing nothing
    assert row and row["worker"]["rss_bytes"] > 32 << 20, row  # the whole process would be over the limit
    with Traffic(daemon, "m") as traffic:
        daemon.wait_for("rollout_passed model=m version=2", 60)
        traffic.saw("2")
    assert "rollout_failed" not in daemon.log(), daemon.log()


def shadowing(daemon: Daemon) -> dict:
    """The `rollout` view of m's candidate ({} while none shadows)."""
    with daemon.admin() as admin:
        rows = [r for r in admin.call("models")["models"] if r["name"] == "m" and r["state"] == "candidate"]
    return rows[0].get("rollout", {}) if rows else {}


@pytest.mark.timing
def test_a_slower_candidate_is_paced_to_a_small_share_of_the_time_while_it_shadows(
        root: Path, start: Callable[..., Daemon]) -> None:
    """Mirroring whatever the load (min_idle_cpu = 0), a candidate slower than the serving version computes
    at most PACE_SHARE of the time (twice that, for a busy box's slack), not back to back."""
    publish_heavy(root, 1, repeat=1)
    daemon = start(n=100000)  # judged neither by its speed nor by a count it would reach here
    wait_served(daemon, "m", "1", offset=1, timeout=30)
    with Traffic(daemon, "m") as traffic:
        publish_heavy(root, 2, repeat=500_000)  # the same answers, at milliseconds a call
        daemon.wait_for("rollout_started model=m version=2", 30)
        view = eventually(lambda: shadowing(daemon).get("shadowing_s", 0) >= 4 and shadowing(daemon),
                          "four seconds of shadowing", 30)
    assert view["compared"] >= 2, view
    assert view["computing_s"] / view["shadowing_s"] <= 2 * PACE_SHARE, view
    assert traffic.replies and all(r.status == 200 and r.version == "1" for r in traffic.replies)


def version_row(daemon: Daemon, version: str, state: str) -> dict:
    """Admin `models`' row of m's `version` in `state` ({} while there is none)."""
    with daemon.admin() as admin:
        rows = [r for r in admin.call("models")["models"]
                if r["name"] == "m" and r["version"] == version and r["state"] == state]
    return rows[0] if rows else {}


@pytest.mark.parametrize("placement", ["hot", "cold"])
def test_a_candidate_computes_in_a_worker_process_all_at_nice_19_and_serves_at_its_own_placement_once_promoted(
        root: Path, start: Callable[..., Daemon], placement: str) -> None:
    """Whatever the model's placement, its candidate is loaded in a worker process of its own, every thread of
    which runs at nice 19 (the daemon's threads do not): the CPU it took is that process's. Once it passes, the
    version is loaded afresh at the model's own placement, at the daemon's priority, and that worker stops."""
    publish_heavy(root, 1, repeat=1)
    daemon = start(n=8, placement=placement)
    wait_served(daemon, "m", "1", offset=1, timeout=30)
    assert daemon.proc is not None
    publish_heavy(root, 2, repeat=2_000_000)  # the same answers, at tens of milliseconds a call
    daemon.wait_for("rollout_started model=m version=2", 30)
    pid = version_row(daemon, "2", "candidate")["worker"]["pid"]
    before = cpu_s(pid)
    with daemon.client() as client:
        def compared() -> dict:
            assert client.infer("m", {"x": PROBE}).status == 200
            view = shadowing(daemon)
            return view if view.get("compared", 0) >= 4 else {}

        view = eventually(compared, "four comparisons", 60)
        niced = nice_values(pid)  # its session's threads too, made after the process was lowered
        used = cpu_s(pid) - before
    assert niced and set(niced) == {19}, niced
    assert 19 not in nice_values(daemon.proc.pid), nice_values(daemon.proc.pid)
    assert used >= 0.5 * view["computing_s"], (used, view)  # clock ticks: half, for their rounding
    daemon.wait_for("rollout_passed model=m version=2", 60)
    eventually(lambda: states(daemon) == {"2": "ready"}, "version 2 serves alone", 30)
    assert placements(daemon) == {"2": placement}
    eventually(lambda: not Path(f"/proc/{pid}").exists(), "the candidate's worker gone", 30)
    assert 19 not in nice_values(daemon.proc.pid), nice_values(daemon.proc.pid)
    if placement == "cold":  # served by a worker of its own, at the model's nice
        with daemon.client() as client:
            assert client.infer("m", {"x": PROBE}).status == 200
        served = eventually(lambda: version_row(daemon, "2", "ready").get("worker"), "version 2's worker", 30)
        assert served["pid"] != pid and set(nice_values(served["pid"])) == {0}, nice_values(served["pid"])


@pytest.mark.timing
def test_a_paced_candidate_costs_the_daemon_no_cpu_while_it_waits(root: Path, start: Callable[..., Daemon]) -> None:
    """A slow candidate under light traffic (a request every 0.1 s): between its paced computations the
    shadow thread sleeps, so the daemon uses a small share of a core, not one spinning thread's whole core."""
    publish_heavy(root, 1, repeat=1)
    daemon = start(n=100000)
    wait_served(daemon, "m", "1", offset=1, timeout=30)
    publish_heavy(root, 2, repeat=500_000)
    daemon.wait_for("rollout_started model=m version=2", 30)
    assert daemon.proc is not None
    pause = threading.Event()
    with daemon.client() as client:
        used, began = cpu_s(daemon.proc.pid), time.monotonic()
        for _ in range(30):
            assert client.infer("m", {"x": PROBE}).status == 200
            pause.wait(0.1)  # the load's own rhythm (light traffic), not a wait for the daemon
        used, spent = cpu_s(daemon.proc.pid) - used, time.monotonic() - began
    assert shadowing(daemon).get("compared", 0) >= 2, shadowing(daemon)
    assert used / spent < 0.5, f"{used:.2f} s of CPU in {spent:.2f} s"


def test_removing_the_serving_versions_folder_when_no_older_version_loads_keeps_it_serving(
        root: Path, start: Callable[..., Daemon]) -> None:
    publish(root, "m", 1, offset=1)
    daemon = start()
    wait_served(daemon, "m", "1", offset=1, timeout=30)
    with Traffic(daemon, "m") as traffic:
        promote_2(root, daemon, traffic)
        (root / "m" / "1" / ".model.onnx.tmp").write_bytes(b"not an onnx file")  # version 1 breaks on disk
        (root / "m" / "1" / ".model.onnx.tmp").replace(root / "m" / "1" / "model.onnx")
        shutil.rmtree(root / "m" / "2")
        daemon.wait_for("failed model=m version=1", 30)
        daemon.wait_for("kept model=m version=2", 30)
        served = len(traffic.replies)
        eventually(lambda: len(traffic.replies) > served + 20, "requests after the removal", 30)
    after_two = [r for r in traffic.replies[[r.version for r in traffic.replies].index("2"):]]
    assert all(r.status == 200 and r.version == "2" for r in after_two), \
        sorted({(r.status, r.version) for r in after_two})
    assert states(daemon) == {"1": "failed", "2": "ready"}
    assert "its engine folder was removed; it serves until another version" in dict(
        (v, r) for v, _, r in listed(daemon))["2"]


def rows_of(daemon: Daemon) -> list[tuple[str, str, str, str]]:
    """(version, state, phase, reason) of m's rows in the admin `models` reply (what `status` lists), each version
    once: the admin socket itself, where a loop would wait on an interpreter's start per look."""
    with daemon.admin() as admin:
        rows = sorted((m["version"], m["state"], m["phase"], m["reason"]) for m in admin.call("models")["models"]
                      if m["name"] == "m")
    assert len(rows) == len({row[0] for row in rows}), rows
    return rows


def verdicts(daemon: Daemon) -> set[tuple[str, str, str, str, str]]:
    """(model, version, digest, outcome, reason) of every verdict in the daemon's state file."""
    data = json.loads((daemon.state_dir / "verdicts.json").read_text())
    return {(v["model"], v["version"], v["digest"], v["outcome"], v["reason"]) for v in data["verdicts"]}


def storm_step(root: Path, daemon: Daemon, private: Path, step: int, good: list[int], refused: list[int]) -> None:
    """One of the storm's five moves, by `step`: a version promoted, one refused, one published unsigned
    and signed late (then promoted), a refused one's folder removed, the serving one's folder removed."""
    version, move = step + 1, step % 5
    if move == 0:  # the same answers, signed: promoted
        publish_signed(root, private, version, offset=1)
        daemon.wait_for(f"rollout_passed model=m version={version}", 60)
        good.append(version)
    elif move == 1:  # answers otherwise: refused
        publish_signed(root, private, version, offset=1.5)
        daemon.wait_for(f"rollout_failed model=m version={version}", 60)
        refused.append(version)
    elif move == 2:  # unsigned: failed; signed in place, as the refusal advises: a candidate, then promoted
        publish(root, "m", version, offset=1)
        daemon.wait_for(f"failed model=m version={version}", 30)
        signing.sign(signing.load_private(private), root / "m" / str(version) / "model.onnx", "m", str(version))
        daemon.wait_for(f"rollout_passed model=m version={version}", 60)
        good.append(version)
    elif move == 3:  # a refused version's folder removed: it is no longer listed, its verdict stays
        shutil.rmtree(root / "m" / str(refused.pop()))
    else:  # the serving version's folder removed: the newest good one before it serves, at once
        removed = good.pop()
        shutil.rmtree(root / "m" / str(removed))
        daemon.wait_for(f"rolled_back model=m version={good[-1]} from={removed} ", 30)


@pytest.mark.slow
def test_a_restart_storm_keeps_the_served_version_and_every_verdict(
        root: Path, start: Callable[..., Daemon], key: tuple[Path, Path]) -> None:
    """Twenty restarts, each after versions were published (agreeing or not), signed late, refused, or
    removed, under load: the daemon comes back serving the same version with the same verdicts and the
    same rows (state and reason), and never shadows a refused one again."""
    private, public = key
    write_settings(root, n=5)
    publish_signed(root, private, 1, offset=1)
    daemon = start(daemon_extra=f'engine_signing_keys = ["{public}"]')
    wait_served(daemon, "m", "1", offset=1, timeout=30)
    good, refused = [1], []  # versions on disk that served, and that their rollout refused
    for step in range(1, 21):
        with Traffic(daemon, "m") as traffic:
            storm_step(root, daemon, private, step, good, refused)
            traffic.saw(str(good[-1]))
        assert all(r.status == 200 for r in traffic.replies), sorted({r.status for r in traffic.replies})
        expected = {str(good[-1]): "ready", **{str(v): "failed" for v in refused}}
        phases = {str(good[-1]): "serving", **{str(v): "refused" for v in refused}}
        eventually(lambda: {row[0]: row[2] for row in rows_of(daemon)} == phases, f"{phases} before {step}", 30)
        eventually(lambda: {row[0]: row[1] for row in rows_of(daemon)} == expected, f"{expected} before {step}", 30)
        rows, kept = rows_of(daemon), verdicts(daemon)
        mark = restart(daemon)
        with daemon.client() as client:  # the first answer after READY: the same version, no 503
            reply = client.infer("m", {"x": PROBE})
        assert reply.status == 200 and reply.version == str(good[-1]), (step, reply.status, reply.header)
        eventually(lambda: rows_of(daemon) == rows, f"{rows} after restart {step}", 30)
        assert verdicts(daemon) == kept, (step, verdicts(daemon) ^ kept)
        assert "rollout_started" not in daemon.log()[mark:], daemon.log()[mark:]


@pytest.mark.parametrize("placement", ["hot", "cold"])
def test_new_settings_for_the_serving_file_swap_it_in_without_it_shadowing_itself(
        root: Path, start: Callable[..., Daemon], placement: str) -> None:
    """An edited rollout table and placement for the serving version's own file: nothing new to judge, so
    it loads beside itself and swaps in; it is never its own candidate, nor listed twice."""
    publish(root, "m", 1, offset=1)
    daemon = start(placement=placement)
    wait_served(daemon, "m", "1", offset=1, timeout=30)
    mark = len(daemon.log())
    with Traffic(daemon, "m") as traffic:
        write_settings(root, 6, placement="cold" if placement == "hot" else "hot")
        daemon.wait_for('swapped model=m version=1 previous="1 (previous file)"', 30, since=mark)
        assert states(daemon) == {"1": "ready"}
        sent = len(traffic.replies)
        eventually(lambda: len(traffic.replies) > sent + 5, "requests after the swap", 30)
    assert "rollout_started model=m version=1" not in daemon.log()[mark:], daemon.log()[mark:]
    assert {(r.status, r.version) for r in traffic.replies} == {(200, "1")}


def placements(daemon: Daemon, model: str = "m") -> dict[str, str]:
    """version -> placement of every row `infermux status --json` lists for `model`."""
    done = cli(daemon, "status", "--json")
    assert done.returncode == 0, done.stderr
    return {row["version"]: row["placement"] for row in json.loads(done.stdout)["models"] if row["name"] == model}


@pytest.mark.parametrize(("placement", "move", "moved"), [("hot", "demote", "cold"), ("cold", "promote", "hot")])
def test_an_operators_move_survives_new_settings_and_standing_in_for_a_refused_version(
        root: Path, start: Callable[..., Daemon], placement: str, move: str, moved: str) -> None:
    """v2 promoted by its rollout, then moved live (`ctl demote` / `ctl promote`): a reload of the model's rollout
    table and v3's refusal re-make v2 from its own file under new settings, standing in for v3; the operator's
    placement holds through both (the file never said otherwise), and v2 is listed once, ready."""
    publish(root, "m", 1, offset=1)
    daemon = start(placement=placement)
    wait_served(daemon, "m", "1", offset=1, timeout=30)
    with Traffic(daemon, "m") as traffic:
        promote_2(root, daemon, traffic)
        done = cli(daemon, "ctl", move, "m", "2")
        assert done.returncode == 0, done.stderr
        assert placements(daemon) == {"2": moved}
        mark = len(daemon.log())
        write_settings(root, 6, placement=placement)  # the rollout table changes; the placement does not
        daemon.wait_for('swapped model=m version=2 previous="2 (previous file)"', 30, since=mark)
        assert placements(daemon) == {"2": moved}, daemon.log()[mark:]
        publish(root, "m", 3, offset=5)  # other answers: refused, v2 stands in for it
        daemon.wait_for("rollout_failed model=m version=3", 60)
        eventually(lambda: states(daemon) == {"2": "ready", "3": "failed"}, "v3 listed refused, v2 serving", 30)
        assert placements(daemon) == {"2": moved, "3": placement}, daemon.log()[mark:]
        sent = len(traffic.replies)
        eventually(lambda: len(traffic.replies) > sent + 5, "requests after the refusal", 30)
    assert "rollout_started model=m version=2" not in daemon.log()[mark:], daemon.log()[mark:]
    assert {(r.status, r.version) for r in traffic.replies} <= {(200, "1"), (200, "2")}


def admin_rows(daemon: Daemon, model: str = "m") -> list[tuple[str, str]]:
    """(version, state) of every row admin `models` lists for `model`."""
    with daemon.admin() as admin:
        return [(r["version"], r["state"]) for r in admin.call("models")["models"] if r["name"] == model]


def test_a_new_file_of_the_shadowing_version_replaces_its_candidate_and_is_listed_once(
        root: Path, start: Callable[..., Daemon]) -> None:
    """v2 shadows; a new file of v2 (other answers) is published over it: the candidate of the old file is
    cancelled and the new one shadows (it disagrees), then an operator rejects it; v2 is listed once throughout
    by `status` and admin `models`, and v1 answers every request."""
    publish(root, "m", 1, offset=1)
    daemon = start(n=100000)
    wait_served(daemon, "m", "1", offset=1, timeout=30)
    seen: list[list[tuple[str, str]]] = []

    def rows() -> dict[str, str]:
        seen.extend([admin_rows(daemon), [(v, s) for v, s, _ in listed(daemon)]])
        return dict(seen[-1])

    with Traffic(daemon, "m") as traffic:
        publish(root, "m", 2, offset=1)  # the same answers: it shadows and agrees
        daemon.wait_for("shadowing model=m version=2", 60)
        mark = len(daemon.log())
        publish(root, "m", 2, offset=3)  # the same version, a new file that answers otherwise
        daemon.wait_for("rollout_cancelled model=m version=2", 60, since=mark)
        eventually(lambda: rows() == {"1": "ready", "2": "candidate"} and
                   shadowing(daemon).get("agreed", 0) < shadowing(daemon).get("compared", 0),
                   "the new file of v2 shadowing (and disagreeing)", 60)
        done = cli(daemon, "ctl", "reject", "m", "2")
        assert done.returncode == 0, done.stderr
        eventually(lambda: rows() == {"1": "ready", "2": "failed"}, "the new file of v2 listed refused", 30)
    assert daemon.log()[mark:].count("rollout_started model=m version=2") == 1, daemon.log()[mark:]
    doubled = [listing for listing in seen if len({v for v, _ in listing}) != len(listing)]
    assert not doubled, doubled
    assert all(dict(listing).get("1") == "ready" and set(dict(listing)) <= {"1", "2"} for listing in seen), seen
    assert {(r.status, r.version) for r in traffic.replies} == {(200, "1")}
