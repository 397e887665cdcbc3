"""Shared by the benchmark scripts: machine facts and RESULTS.md sections.

Each script owns one `## ` section of RESULTS.md and replaces only that
section, so scripts run at different times keep each other's figures.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import platform
import subprocess
from pathlib import Path

from infermux.admin import hardware

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def machine() -> str:
    """One line naming what the figures were measured on."""
    usable, total = len(os.sched_getaffinity(0)), os.cpu_count()
    cpus = f"nproc {usable}" + (f" of {total} (taskset)" if usable != total else "")
    parts = [cpus, f"{platform.machine()}", *cpu_model(), f"Python {platform.python_version()}"]
    for module in ("onnxruntime", "zmq", "numpy"):
        try:
            parts.append(f"{module} {__import__(module).__version__}")
        except ImportError:
            pass
    return ", ".join(parts)


def cpu_model() -> list[str]:
    """The processor's name from /proc/cpuinfo, where it has one (x86 does; many Arm boards do not)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return [" ".join(line.split(":", 1)[1].split())]
    except OSError:
        pass
    return []


def stamp() -> str:
    """Date and machine, the first line under every heading."""
    return f"Measured {datetime.date.today().isoformat()} on {machine()}."


def write_section(heading: str, body: str, path: Path = RESULTS) -> None:
    """Replace the section under `## heading` (up to the next `## `), or append it."""
    title = f"## {heading}"
    lines = path.read_text().splitlines() if path.exists() else ["# Benchmark results", ""]
    try:
        start = lines.index(title)
    except ValueError:
        start = len(lines)
        if lines and lines[-1].strip():
            lines.append("")
            start += 1
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    section = [title, "", *body.strip("\n").splitlines(), ""]
    path.write_text("\n".join(lines[:start] + section + lines[end:]).rstrip("\n") + "\n")


def print_and_write(heading: str, body: str, *, write: bool, titled: bool = False, path: Path = RESULTS) -> None:
    """The end of a script's run: print the section (under its `## heading` with `titled`) and, with
    `write` (a script's --no-write clears it), put it in RESULTS.md in place of the last one."""
    print(f"\n## {heading}\n\n{body}" if titled else body)
    if write:
        write_section(heading, body, path)


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """A GitHub table; numbers are right-aligned by the caller's formatting."""
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---:" if i else "---" for i in range(len(header))) + "|"]
    out += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(out)


def stop_server(process: subprocess.Popen, grace_s: float = 15) -> None:
    """SIGTERM (the daemon drains and exits), SIGKILL if it is not gone within `grace_s`."""
    process.terminate()
    try:
        process.wait(grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def process_cpu_s(pid: int) -> float:
    """User + system time of process `pid` so far, all its threads (the daemon's own /proc reader)."""
    sample = hardware.process_sample("benchmark", pid)
    assert sample is not None, f"process {pid} is gone"
    return sample.cpu_seconds


def thread_cpu_s(pid: int) -> dict[int, tuple[str, float]]:
    """Each thread of process `pid` by id: its name (comm) and its user + system time so far."""
    tasks = Path(f"/proc/{pid}/task")
    threads: dict[int, tuple[str, float]] = {}
    for entry in tasks.iterdir():
        sample = hardware.process_sample("thread", int(entry.name), tasks)
        with contextlib.suppress(OSError):  # a thread that ended between the listing and the read
            if sample is not None:
                threads[int(entry.name)] = ((entry / "comm").read_text().strip(), sample.cpu_seconds)
    return threads
