"""Fixed daemon snapshots for the console's screenshot tests (the stats stream's format)."""

from __future__ import annotations

from typing import Any

T0 = 1_800_000_000.0  # a fixed "now": nothing on screen depends on the wall clock


def stats(qps: float = 0.0, p50: float | None = None, p99: float | None = None, served: int = 0,
          batches: dict[str, int] | None = None, contexts: int = 1, error_qps: float = 0.0) -> dict[str, Any]:
    one = {"window_s": 10.0, "queue_depth": 0, "in_flight": 0, "qps": qps, "error_qps": error_qps,
           "samples": served, "p50_us": p50, "p90_us": p99, "p99_us": p99, "max_us": p99,
           "queue_us": 12.0 if served else None, "compute_us": 80.0 if served else None,
           "service_time_us": None, "served": served, "by_status": {"200": served} if served else {},
           "batches": batches or {}}
    per_context = [dict(one, qps=qps / contexts, served=served // contexts) for _ in range(contexts)]
    return dict(one, contexts=per_context)


def version(name: str, ver: str, *, state: str = "ready", placement: str = "hot", default: bool = False,
            pinned: bool = False, contexts: int = 1, queues: list[int] | None = None, memory: int = 0,
            fallback: str = "", weight: int = 0, reason: str = "", strategy: str = "least_queue",
            share: float | None = None, **st: Any) -> dict[str, Any]:
    queues = queues if queues is not None else [0] * contexts
    return {"name": name, "version": ver, "state": state, "reason": reason, "placement": placement,
            "default": default, "pinned": pinned, "contexts": contexts, "queues": queues,
            "queue_depth": sum(queues), "in_flight": 1 if st.get("qps") else 0, "max_queue": 64,
            "timeout_ms": 1000, "fallback": fallback, "weight": weight, "strategy": strategy,
            "traffic_share": share if share is not None else 100.0 if default and state == "ready" else 0.0,
            "max_batch": 8, "batch_delay_us": 500, "memory_bytes": memory,
            "engine": f"/var/lib/infermux/engines/{name}/{ver}/model.plan", "backend": "plan",
            "last_load_ms": 840, "stats": stats(contexts=contexts, **st)}


GPU = {"gpu": "0", "name": "NVIDIA A2", "utilization_ratio": 0.37, "memory_used_bytes": 5_583_457_484,
       "memory_total_bytes": 16_106_127_360, "temperature_celsius": 54.0, "power_watts": 31.5}


def snapshot(step: int = 0) -> dict[str, Any]:
    """The daemon at `step` snapshots in: traffic on the detector rises and falls."""
    wave = [120, 180, 260, 310, 290, 240, 300, 420, 380, 350][step % 10]
    mib = 1024 * 1024
    models = [
        version("detector", "2", default=True, contexts=2, queues=[3, 1], memory=412 * mib, weight=90,
                strategy="weighted", share=90.0,
                fallback="detector_lite", qps=float(wave), p50=850.0, p99=2900.0 + 10 * wave,
                served=18_000 + 100 * step, batches={"1": 40, "2": 25, "4": 90, "8": 31}),
        version("detector", "1", memory=398 * mib, weight=10, strategy="weighted", share=10.0, qps=wave / 9,
                p50=900.0, p99=3100.0, served=2_000 + 10 * step, batches={"1": 12, "4": 9}),
        version("detector_lite", "1", default=True, memory=96 * mib, qps=4.5, p50=310.0, p99=780.0,
                served=640, batches={"1": 45}, error_qps=0.5),
        version("plates", "3", placement="cold", default=True, pinned=True, memory=210 * mib, qps=22.0,
                p50=1400.0, p99=5200.0, served=3_100, batches={"1": 30, "2": 10}),
        version("reid", "1", state="unloaded", placement="cold", default=True),
        version("segmenter", "1", state="failed", default=True,
                reason="engine built for TensorRT 10.3, this device has 8.6: rebuild it with infermux build"),
    ]
    daemon = {"version": "0.1.0", "pid": 4242, "uptime_s": 7384.0 + step / 4, "endpoints": ["ipc:///run/infermux/infer.sock"],
              "config": "/etc/infermux/infermux.toml", "requests": 1_234_567 + 100 * step, "accepting": True,
              "memory": {"budget_bytes": 6 * 1024 * mib, "models_bytes": 1116 * mib, "rss_bytes": 1480 * mib,
                         "total_bytes": 8 * 1024 * mib},
              "states": {"ready": 4, "unloaded": 1, "failed": 1},
              "routing": {"strategy": "least_queue", "version_mismatch": "fallback"},
              "gpu": {"source": "nvml", "devices": [GPU]}}
    return {"time": T0 + step / 4, "daemon": daemon, "models": models, "streams": streams(step),
            "cameras": cameras(step)}


def stream(model: str, key: str, fps_in: float, fps_served: float, p99_ms: float | None, seen_s: float,
           received: int, superseded: int = 0, refused: int = 0, silent: bool = False) -> dict[str, Any]:
    """One stream as admin `streams` and the stats stream give it."""
    return {"model": model, "key": key, "received": received, "served": received - superseded - refused,
            "superseded": superseded, "refused": refused, "failed": 0,
            "age_ms": {"p50": None if p99_ms is None else p99_ms / 3, "p99": p99_ms}, "last_seen_s": seen_s,
            "fps_in": fps_in, "fps_served": fps_served, "fps_dropped": fps_in - fps_served, "silent": silent}


def streams(step: int = 0) -> dict[str, Any]:
    """Four cameras on the detector and the OCR pipeline: one keeping up, one losing frames to newer ones,
    one refused, one gone silent."""
    return {"total": 4, "silent_s": 5.0, "shown": [
        stream("detector", "gate-1", 15.0, 15.0, 42.0, 0.05, 9_000 + 4 * step),
        stream("detector", "lot-2", 30.0, 21.5, 96.0, 0.02, 18_200 + 8 * step, superseded=4_100),
        stream("ocr", "dock-3", 5.0, 3.0, 880.0, 0.1, 3_000 + step, refused=1_200),
        stream("ocr", "door-4", 0.0, 0.0, 310.0, 73.0 + step / 4, 4_410, superseded=12, silent=True)]}


def camera(name: str, state: str, fps: float, gated: float, served: float, p99_ms: float | None,
           reconnects: int = 0, reason: str = "", last_error: str = "") -> dict[str, Any]:
    """One camera as admin `cameras` and the stats stream give it."""
    return {"camera": name, "url": f"rtsp://10.0.0.7/{name}", "pipeline": "ocr", "state": state, "reason": reason,
            "enabled": state != "disabled", "fps": 15.0, "pid": 4242, "fps_decoded": fps, "fps_gated": gated,
            "fps_sent": fps - gated, "fps_superseded": max(0.0, fps - gated - served), "fps_served": served,
            "decode_ms": 2.4 if fps else None,
            "capture_age_ms": {"p50": None if p99_ms is None else p99_ms / 3,
                               "p95": None if p99_ms is None else p99_ms * 0.8, "p99": p99_ms},
            "reconnects": reconnects, "restarts": 0, "last_error": last_error}


def cameras(step: int = 0) -> list[dict[str, Any]]:
    """Four cameras: one streaming, one gated by its motion gate, one lost (its server's words in the
    reason, a control character among them), one disabled."""
    return [camera("gate-1", "streaming", 15.0, 0.0, 15.0, 48.0),
            camera("yard", "streaming", 15.0, 14.2, 0.8, 51.0),
            camera("dock-3", "lost", 0.0, 0.0, 0.0, None, reconnects=3 + step // 4,
                   reason="no frame for 5 s: 454 Session Not Found\x1b[2J"),
            camera("door-4", "disabled", 0.0, 0.0, 0.0, None)]


EVENTS = [
    {"time": T0 - 600, "kind": "loaded", "model": "detector", "version": "1", "backend": "tensorrt", "load_ms": 910},
    {"time": T0 - 300, "kind": "loaded", "model": "detector", "version": "2", "backend": "tensorrt", "load_ms": 840},
    {"time": T0 - 299, "kind": "swapped", "model": "detector", "version": "2", "previous": "1"},
    {"time": T0 - 120, "kind": "failed", "model": "segmenter", "version": "1", "reason": "engine built for TensorRT 10.3"},
    {"time": T0 - 60, "kind": "evicted", "model": "reid", "version": "1", "idle_s": 600},
    {"time": T0 - 30, "kind": "admin", "cmd": "set", "args": '{"contexts": 2, "model": "detector"}', "uid": 1000},
    {"time": T0 - 20, "kind": "log", "model": "", "version": "", "level": "warning", "logger": "infermux.peers",
     "message": "client 7f3a is not reading its replies (its queue is full): dropping them until it reads",
     "repeated": 12},
    {"time": T0 - 10, "kind": "error", "model": "detector_lite", "version": "1",
     "reason": "inference failed model=detector_lite version=1 context=0: RuntimeError: CUDA out of memory"},
]
