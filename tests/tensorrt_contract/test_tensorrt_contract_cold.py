"""Contract tests: a TensorRT engine served cold (placement = "cold") by a real daemon and worker.

The daemon and its worker run the stand-in of fakes_tensorrt.py (tests/support/fakes/tensorrt_site puts
it in both processes). They check our code, not TensorRT: the worker caps batching at the
engine's batch maximum, and the daemon's status shows the max_batch the worker runs with.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from support.fakes.tensorrt import PROFILE, write_plan
from support.harness import FAKES


def test_contract_a_cold_versions_status_shows_the_capped_max_batch(make_daemon, tmp_path: Path):
    """max_batch 16 on an engine whose profile stops at 8 rows: the status says 8, set live to
    32 it says 8 again, and a 5-row request is served by the worker's (stand-in) engine."""
    (tmp_path / "det" / "1").mkdir(parents=True)
    write_plan(tmp_path / "det" / "1")
    d = make_daemon('[[models]]\nname = "det"\nengine = "{root}/det/1/model.plan"\nplacement = "cold"\n'
                    'max_batch = 16\nbatch_delay_us = 100\npreload = true\n', root=str(tmp_path),
                    env={"INFERMUX_FAKE_TRT": "1", "PYTHONPATH": str(FAKES / "tensorrt_site")})
    with d.client() as client:
        x = np.arange(20, dtype=np.float32).reshape(5, 4)
        reply = client.infer("det", {"x": x})
        assert reply.ok, reply.error
        assert reply.outputs["total"].tolist() == x.sum(1).tolist()
    with d.admin() as admin:
        def max_batch() -> int:
            return next(m for m in admin.call("models")["models"] if m["name"] == "det")["max_batch"]
        assert max_batch() == PROFILE[2][0]
        admin.call("set", model="det", version="1", max_batch=32)
        assert max_batch() == PROFILE[2][0]
