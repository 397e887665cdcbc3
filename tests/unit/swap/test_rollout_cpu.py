"""A candidate mirrors on spare CPU only: the idle share the shadow thread reads from /proc/stat, and the
share of its time the frontend thread worked."""

from __future__ import annotations

from pathlib import Path

from infermux.swap import probes, rollout
from infermux.swap.probes import CpuIdle, LoopBusy


def stat(path: Path, idle: int, iowait: int, busy: int) -> None:
    """The first line of /proc/stat: user nice system idle iowait irq softirq steal (guest times follow)."""
    path.write_text(f"cpu  {busy} 0 0 {idle} {iowait} 0 0 0 7 7\ncpu0 1 2 3 4 5 6 7 8 0 0\n")


def test_the_idle_share_is_idle_and_iowait_ticks_of_all_ticks_since_the_last_reading(tmp_path: Path) -> None:
    path, now = tmp_path / "stat", [100.0]
    stat(path, idle=1000, iowait=0, busy=1000)
    cpu = CpuIdle(str(path), clock=lambda: now[0])
    assert cpu.idle() == 1.0  # nothing measured yet
    now[0] += 2 * probes.CPU_WINDOW_S
    stat(path, idle=1030, iowait=10, busy=1160)  # 40 idle of 200 ticks (guest ticks are in user already)
    assert cpu.idle() == 0.2
    now[0] += probes.CPU_WINDOW_S / 2
    stat(path, idle=1230, iowait=10, busy=1160)
    assert cpu.idle() == 0.2  # within the window: the last reading stands
    now[0] += 2 * probes.CPU_WINDOW_S
    assert cpu.idle() == 1.0


def test_without_proc_stat_mirroring_is_never_held_for_the_cpus(tmp_path: Path) -> None:
    assert CpuIdle(str(tmp_path / "absent")).idle() == 1.0


def test_the_frontends_busy_share_is_its_working_time_over_the_wall_time_of_the_window() -> None:
    now = [10.0]
    loop = LoopBusy(clock=lambda: now[0])
    assert loop.share() == 0.0  # nothing measured yet
    now[0] += 0.1
    loop.add(0.03)
    loop.add(0.05)
    assert abs(loop.share() - 0.8) < 1e-9
    now[0] += probes.CPU_WINDOW_S / 2
    loop.add(0.001)
    assert abs(loop.share() - 0.8) < 1e-9  # within the window: the last reading stands
    now[0] += 1.0
    assert abs(loop.share() - 0.001 / (1.0 + probes.CPU_WINDOW_S / 2)) < 1e-9  # a quiet second


def test_a_frontend_that_worked_throughout_reads_as_fully_busy_not_more() -> None:
    now = [0.0]
    loop = LoopBusy(clock=lambda: now[0])
    now[0] += 0.1
    loop.add(0.2)  # a long turn that began before the window did
    assert loop.share() == 1.0


def test_a_pause_that_comes_and_goes_is_said_once_a_minute_with_the_pauses_no_event_said(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from infermux.config import ModelConfig, RolloutConfig
    from infermux.events import EventLog
    from infermux.models.version import ModelVersion

    now = [1000.0]
    monkeypatch.setattr(rollout.time, "monotonic", lambda: now[0])
    shadow = rollout.Rollouts.__new__(rollout.Rollouts)  # the pause bookkeeping alone: no registry, no thread
    shadow.events = EventLog()
    candidate = ModelVersion(ModelConfig(name="m", engine=Path("m/2/model.onnx"), version="2"))
    watched = rollout.Rollout(candidate, candidate.config, RolloutConfig(), None)

    def looks(busy: str, count: int) -> None:
        for _ in range(count):
            now[0] += rollout.LOOK_S * 1.01
            shadow._say_paused(watched, busy)

    said = lambda: [(e.kind, e.detail.get("pauses")) for e in shadow.events.recent(100)]  # noqa: E731
    for _ in range(5):  # a box at its capacity: busy half a second, free half a second, five times
        looks("the CPUs are busy", rollout.LOOKS)
        looks("", rollout.LOOKS)
    assert said() == [("rollout_paused", None), ("rollout_resumed", None)]
    assert watched.paused == "" and watched.unsaid == 4
    now[0] += rollout.PAUSE_EVENTS_S
    looks("the CPUs are busy", rollout.LOOKS)
    assert said()[-1] == ("rollout_paused", 5) and "mirroring paused: the CPUs are busy" in candidate.reason


def test_a_workers_cpu_is_the_sum_of_its_threads_schedstat_and_none_without_proc(tmp_path: Path) -> None:
    from infermux.swap.probes import cpu_ns

    for tid, line in (("7", "1500 20 3\n"), ("8", "2500 1 1\n"), ("9", "garbage\n")):
        (tmp_path / "7" / "task" / tid).mkdir(parents=True)
        (tmp_path / "7" / "task" / tid / "schedstat").write_text(line)
    assert cpu_ns(7, proc=str(tmp_path)) == 4000  # a thread that cannot be read is left out
    assert cpu_ns(8, proc=str(tmp_path)) is None  # no such process, or no /proc: wall time is used instead
