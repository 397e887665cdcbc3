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
        self.dropped_regions = 0  # regions whose box or score was not a finite number
        # A model step's calls by the way they went (pipelines/calls.py): "in_process" (admitted
        # on the pipeline's thread), "computed_here" (of those, computed on it too), "via_frontend"
        # (admitted by the frontend thread: a cold worker had to be started).
        self.paths: dict[str, dict[str, int]] = {}
        self._lock = threading.Lock()  # the pipeline's threads count side by side

    def dropped(self, count: int) -> None:
        """`count` regions of a frame were dropped for a box or score that is not a finite number."""
        with self._lock:
            self.dropped_regions += count

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


def table(pipelines: list[dict[str, Any]], runs_on: bool = False) -> str:
    """Each pipeline and its steps as a fixed-width table (`infermux status`; `ctl pipelines` adds
    `runs_on`: each pipeline's input, workers and queue policy, and what each step runs). 409 counts
    the frames a newer one of their stream replaced (queue_policy newest_per_key): not errors, so
    ERR leaves them out."""
    head = ("PIPELINE/STEP", "RUNS", "FPS", "P50", "P99", "409", "ERR", "QUEUE", *(("DETAIL",) if runs_on else ()))
    rows = [head]
    for p in pipelines:
        f = p["frames"]
        what = (f"input {p.get('input', '?')!r}, {p.get('workers', '?')} workers, {p.get('queue_policy', '?')}",)
        rows.append((p["name"], str(f.get("served", 0)), fmt.rate(f.get("qps")), fmt.us(f.get("p50_us")),
                     fmt.us(f.get("p99_us")), str(fmt.superseded(f)), str(fmt.failures(f)), str(p.get("queued", 0)),
                     *(what if runs_on else ())))
        for name, s in p["steps"].items():
            step = (_runs_on(s),)
            rows.append((f"  {name}", str(s.get("served", 0)), fmt.rate(s.get("qps")), fmt.us(s.get("p50_us")),
                         fmt.us(s.get("p99_us")), str(fmt.superseded(s)), str(fmt.failures(s)), "",
                         *(step if runs_on else ())))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def _runs_on(step: dict[str, Any]) -> str:
    """`model ppocr_rec, each region` or `processor crop`: what a step of the view runs."""
    what = f"model {step['model']}" if step.get("model") else f"processor {step.get('processor', '?')}"
    return what + (", each region" if step.get("for_each") else "")
