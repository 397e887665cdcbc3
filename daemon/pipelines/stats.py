"""Per-pipeline and per-step counts and latencies, on the daemon's own `Stats` (execution/stats.py)."""

from __future__ import annotations

import threading
from typing import Any

from infermux.execution.stats import Stats
from infermux import format as fmt


class PipelineStats:
    """One `Stats` for the pipeline's replies (statuses, latency per frame) and one per step."""

    def __init__(self, steps: list[str]) -> None:
        self.frames = Stats()
        self.steps = {name: Stats() for name in steps}
        # A model step's calls by the way they went (pipelines/calls.py): "in_process" (admitted
        # on the pipeline's thread), "computed_here" (of those, computed on it too), "via_frontend"
        # (admitted by the frontend thread: a cold worker had to be started).
        self.paths: dict[str, dict[str, int]] = {}
        self._lock = threading.Lock()  # the pipeline's threads count side by side

    def called(self, step: str, in_process: bool, here: bool) -> None:
        """Model step `step` was answered (whatever the status), admitted in-process or not, computed on its thread or not."""
        with self._lock:
            paths = self.paths.get(step)
            if paths is None:
                paths = self.paths[step] = {"in_process": 0, "computed_here": 0, "via_frontend": 0}
            paths["in_process" if in_process else "via_frontend"] += 1
            paths["computed_here"] += here

    def step(self, name: str, status: int, us: int) -> None:
        """Step `name` ran once (over one frame, or all of a frame's crops) in `us` µs."""
        self.steps[name].record(status, us)

    def view(self) -> dict[str, Any]:
        """What `infermux status`, the admin `models` command and Prometheus show."""
        frames = self.frames.snapshot()
        steps = {name: _brief(s.snapshot().as_json()) for name, s in self.steps.items()}
        with self._lock:
            for name, paths in self.paths.items():
                steps[name]["calls"] = dict(paths)
        return {"frames": _brief(frames.as_json()), "steps": steps}


def _brief(snap: dict[str, Any]) -> dict[str, Any]:
    keep = ("qps", "error_qps", "p50_us", "p99_us", "served", "by_status", "sums_us", "samples")
    return {k: snap[k] for k in keep if k in snap}


def table(pipelines: list[dict[str, Any]]) -> str:
    """Each pipeline and its steps as a fixed-width table (`infermux status`)."""
    head = ("PIPELINE/STEP", "RUNS", "FPS", "P50", "P99", "ERR", "QUEUE")
    rows = [head]
    for p in pipelines:
        f = p["frames"]
        rows.append((p["name"], str(f.get("served", 0)), fmt.rate(f.get("qps")), fmt.us(f.get("p50_us")),
                     fmt.us(f.get("p99_us")), str(fmt.failures(f)), str(p.get("queued", 0))))
        for name, s in p["steps"].items():
            rows.append((f"  {name}", str(s.get("served", 0)), fmt.rate(s.get("qps")), fmt.us(s.get("p50_us")),
                         fmt.us(s.get("p99_us")), str(fmt.failures(s)), ""))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)
