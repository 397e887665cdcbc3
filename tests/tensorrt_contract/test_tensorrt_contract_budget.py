"""Contract tests: the memory budget on a box with several GPUs, and a cold
version's status showing the batch maximum it runs with.

NVML is a stand-in here (the entry points budget.Nvml calls, over two GPUs of different sizes);
tests/gpu/test_gpu_budget.py reads the real one.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from infermux.config import ModelConfig
from infermux.models import budget
from support.fakes.nvml import StandInLibNvml

GiB = 1 << 30


@pytest.fixture
def two_gpus(monkeypatch: pytest.MonkeyPatch) -> StandInLibNvml:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return StandInLibNvml([8 * GiB, 16 * GiB], [1 * GiB, 2 * GiB], [{100: 1 * GiB}, {100: 3 * GiB, 200: GiB}])


def test_contract_each_gpu_has_its_own_budget_and_free_figure(two_gpus: StandInLibNvml) -> None:
    """Checks our use of NVML, not NVML: every visible GPU is read, `memory_budget` is taken of each
    one's own total, free memory is read on the GPU asked for, and a worker's GPU memory is summed
    over the GPUs it holds memory on."""
    b = budget.MemoryBudget("50%", "test.toml", gpus=budget.Nvml.open_all(two_gpus))
    assert b.source == "gpu" and b.limits == [4 * GiB, 8 * GiB] and b.limit == 4 * GiB
    assert b.available(0) == 7 * GiB and b.available(1) == 14 * GiB
    assert b.gpu_used() == {100: 4 * GiB, 200: GiB}
    on_one = ModelConfig("det", Path("det.plan"), options={"device": 1})
    assert b.device_for(on_one) == 1 and b.limit_of(1) == 8 * GiB
    assert b.device_for(ModelConfig("cls", Path("cls.plan"))) == 0


def test_contract_cuda_visible_devices_picks_and_orders_the_gpus(two_gpus: StandInLibNvml,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """CUDA device 0 is the first GPU CUDA_VISIBLE_DEVICES names: with "1" only the 16 GiB GPU is
    visible, and one budget covers it (a single GPU charges every model in one sum)."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    b = budget.MemoryBudget("50%", "test.toml", gpus=budget.Nvml.open_all(two_gpus))
    assert b.total == 16 * GiB and b.limit == 8 * GiB
    assert b.device_for(ModelConfig("det", Path("det.plan"), options={"device": 1})) is None
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert budget.Nvml.open_all(two_gpus) == []


def test_contract_a_model_is_charged_on_the_gpu_it_runs_on(two_gpus: StandInLibNvml, tmp_path: Path) -> None:
    """Checks our code: a 6 GiB load on GPU 1 (8 GiB budget there) fits although GPU 0's models
    already use 3.5 of its 4 GiB, and the same load on GPU 0 is refused naming GPU 0."""
    from infermux.events import EventLog
    from infermux.models.memory import MemoryKeeper
    from infermux.execution.hooks import FrontendHooks
    from infermux.models.registry import Registry
    from infermux.models.version import State
    from infermux import config as cfg

    plan = tmp_path / "m.plan"
    plan.write_bytes(b"x")
    config = cfg.Config(tmp_path / "infermux.toml", cfg.DaemonConfig(), cfg.RoutingConfig(), models=(
        ModelConfig("held", plan, options={"device": 0}), ModelConfig("new1", plan, version="1", options={"device": 1}),
        ModelConfig("new0", plan, version="1", options={"device": 0})))
    registry = Registry(config, EventLog(), FrontendHooks(lambda *a, **k: None, lambda *a: None))
    held = registry.model("held").versions["1"]
    held.memory_bytes, held.state = int(3.5 * GiB), State.READY
    b = budget.MemoryBudget("50%", "test.toml", gpus=budget.Nvml.open_all(two_gpus))
    keeper = MemoryKeeper(registry, b, stop=lambda mv: None, stoppable=lambda mv: False)
    keeper.footprints = {("new1", "1"): 6 * GiB, ("new0", "1"): 6 * GiB}
    keeper.make_room(registry.model("new1").versions["1"])
    with pytest.raises(budget.BudgetExceeded, match="GPU 0"):
        keeper.make_room(registry.model("new0").versions["1"])


def test_contract_settling_after_a_load_looks_at_that_gpu_only(two_gpus: StandInLibNvml, tmp_path: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    """Checks our code: after a 6 GiB load on GPU 1 (8 GiB budget), the 3.5 GiB on GPU 0 do not
    count against GPU 1, so nothing is over budget; GPU 0's own sum is compared with its own limit."""
    from infermux import config as cfg
    from infermux.events import EventLog
    from infermux.models.memory import MemoryKeeper
    from infermux.execution.hooks import FrontendHooks
    from infermux.models.registry import Registry
    from infermux.models.version import State

    plan = tmp_path / "m.plan"
    plan.write_bytes(b"x")
    config = cfg.Config(tmp_path / "infermux.toml", cfg.DaemonConfig(), cfg.RoutingConfig(), models=(
        ModelConfig("held", plan, options={"device": 0}), ModelConfig("new1", plan, options={"device": 1})))
    registry = Registry(config, EventLog(), FrontendHooks(lambda *a, **k: None, lambda *a: None))
    held, new1 = registry.model("held").versions["1"], registry.model("new1").versions["1"]
    held.memory_bytes, held.state = int(3.5 * GiB), State.READY
    new1.memory_bytes, new1.state = 6 * GiB, State.READY
    b = budget.MemoryBudget("50%", "test.toml", gpus=budget.Nvml.open_all(two_gpus))
    keeper = MemoryKeeper(registry, b, stop=lambda mv: None, stoppable=lambda mv: False)
    assert keeper.used(device=1) == 6 * GiB and keeper.used(device=0) == int(3.5 * GiB)
    keeper.settle(new1)
    assert not [r for r in caplog.records if "memory budget exceeded" in r.getMessage()]
