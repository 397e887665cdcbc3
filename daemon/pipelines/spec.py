"""A `[[pipelines]]` entry as steps ready to run: built processors, model steps, fan-out stages."""

from __future__ import annotations

from dataclasses import dataclass

from infermux.config import PipelineConfig, StepConfig
from infermux.pipelines.reinfer import Lifetimes, Policy, Reinfer
from infermux.plugins import processors
from infermux.plugins.processors import Processor
from infermux.plugins.processors.track import Track


@dataclass(frozen=True)
class ProcessorStep:
    """Runs `processor` on the frame's Sample (or, in a fan-out, on each crop's)."""

    name: str
    processor: Processor
    fan_out: bool


@dataclass(frozen=True)
class ModelStep:
    """Sends the working tensor to model `model` (a fan-out's crops as one batched request);
    `reinfer` decides which of a frame's regions it computes, where its options are set."""

    name: str
    model: str
    input: str  # "" until known: the model's only input
    fan_out: bool
    pad_value: float
    pad_multiple: int
    reinfer: Reinfer | None = None


Step = ProcessorStep | ModelStep


@dataclass(frozen=True)
class Stage:
    """Consecutive steps at one level: the frame's (`fan_out` False) or each region's."""

    fan_out: bool
    steps: tuple[Step, ...]


def build_step(config: StepConfig, tracker: Track | None = None) -> Step:
    """The runnable step of one step entry (its options were checked when the file was read);
    `tracker` is the `track` step before it, whose bounds a re-inferred step's memory takes."""
    fan_out = config.for_each == "regions"
    if config.model:
        policy = Policy(config.reinfer_every, config.reinfer_growth, config.max_calls_per_s)
        reinfer = Reinfer(policy, lifetimes(tracker)) if policy != Policy() else None
        return ModelStep(config.name, config.model, config.input, fan_out, config.pad_value, config.pad_multiple,
                         reinfer)
    return ProcessorStep(config.name, processors.create(config.processor, config.options, config.name), fan_out)


def lifetimes(tracker: Track | None) -> Lifetimes:
    """What a re-inferred step remembers lasts as long as the tracks it belongs to."""
    if tracker is None:
        return Lifetimes()
    c = tracker.config
    return Lifetimes(ttl_s=c.track_ttl_s, max_keys=c.max_keys, forget_after=c.max_lost + 1, max_tracks=c.max_tracks)


def stages(config: PipelineConfig) -> tuple[Stage, ...]:
    """The steps grouped into runs at the same level, in order."""
    out: list[Stage] = []
    tracker: Track | None = None
    for entry in config.steps:
        step = build_step(entry, tracker)
        if isinstance(step, ProcessorStep) and isinstance(step.processor, Track):
            tracker = step.processor
        if out and out[-1].fan_out == step.fan_out:
            out[-1] = Stage(step.fan_out, (*out[-1].steps, step))
        else:
            out.append(Stage(step.fan_out, (step,)))
    return tuple(out)


def model_steps(config: PipelineConfig) -> list[str]:
    """Names of the steps that call a model (whose outputs a request may ask for)."""
    return [s.name for s in config.steps if s.model]
