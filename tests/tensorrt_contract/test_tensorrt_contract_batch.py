"""Contract tests: dynamic batching within a TensorRT engine's profile.

They run against the stand-in in fakes_tensorrt.py (profile 0 admits 1..8 rows). They check
our code's use of the engine's profile range, not TensorRT itself (tests/gpu/ does that).
"""

from __future__ import annotations

import json
import logging
import time

import numpy as np
import pytest
from support.fakes.tensorrt import PROFILE, write_plan

from infermux.config import ModelConfig
from infermux.plugins import backends
from infermux.protocol import Request
from infermux.execution.executor import Executor, Queued
from infermux.execution.job import Job
from infermux.execution.hooks import FrontendHooks
from infermux.execution.scheduler import Scheduler
from infermux.execution.stats import ModelStats

pytest_plugins = ["support.fakes.tensorrt"]  # fake_gpu, fake_trt fixtures

PROFILE_MAX_ROWS = PROFILE[2][0]


@pytest.fixture
def engine(fake_trt, tmp_path):
    path = write_plan(tmp_path)
    engine = backends.for_path(path).load(path, {})
    yield engine
    engine.close()


def scheduler_policy(engine, max_batch: int):
    """The batching policy a hot placement builds for `engine`, its executor stopped again."""
    config = ModelConfig("det", engine.path, max_batch=max_batch, batch_delay_us=0)
    scheduler = Scheduler(config, engine, ModelStats("det", "1"),
                          FrontendHooks(lambda envelope, frames, outcome=None: None, lambda job: None), "least_loaded")
    scheduler.stop(5)
    return scheduler.policy


def test_contract_max_batch_above_the_profile_is_clamped_and_logged_once(engine, caplog):
    """Checks our code's use of the profile range, not TensorRT: max_batch 16 on an engine whose
    profile stops at 8 rows batches at most 8, configured or set live, with one warning."""
    with caplog.at_level(logging.WARNING, "infermux.executor"):
        policy = scheduler_policy(engine, 16)
        policy.max_batch = 32  # admin `set max_batch 32`
        policy.max_batch = 4
    assert policy.max_batch == 4
    policy.max_batch = 64
    assert policy.max_batch == PROFILE_MAX_ROWS
    warnings = [r for r in caplog.records if "batch maximum" in r.getMessage()]
    assert len(warnings) == 1 and "det:1" in warnings[0].getMessage()


def test_contract_two_valid_requests_are_never_merged_past_the_profile(engine):
    """Checks our code, not TensorRT: two 5-row requests queued together with max_batch 16 run as
    two calls and both succeed, instead of one [10, 4] call refused with 400 to both."""
    policy = scheduler_policy(engine, 16)
    replies: list[dict] = []
    executor = Executor("det", "1", 0, engine.create_context(),
                        lambda envelope, frames, outcome=None: replies.append(json.loads(frames[0])), lambda job: None, policy)
    now = time.perf_counter_ns()
    for k in range(2):
        request = Request("det", {"x": np.full((5, 4), k, np.float32)})
        executor.queue.put(Job([b"c%d" % k], request, [], now, now + 10**10))
    executor.row_us = 1.0  # Queued work computes only once a row time is known
    executor.compute(Queued(lambda batch_us, requests: True))
    assert [r["status"] for r in replies] == [200, 200]
