"""`[[pipelines]]` entries and their `[[pipelines.steps]]`: keys read as declared (config/settings.py),
then the rules between them: a step is a processor or a model, names are unique, re-inference
and `[pipelines.events]` follow a track step, and each processor is built once so that a bad option
stops the file."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from infermux.config.declare import check_type, read_table
from infermux.config.errors import ConfigError, LibraryMissing
from infermux.config.models import check_queue_policy
from infermux.config.settings import PATH_OPTIONS, REINFER, LifecycleConfig, ModelConfig, PipelineConfig, StepConfig
from infermux.plugins import processors
from infermux.plugins.requirements import MissingDependency


def parse_pipelines(file: Path, raw: Any, models: list[ModelConfig],
                    engine_dir: Path) -> tuple[PipelineConfig, ...]:
    """Every `[[pipelines]]` entry; a name may not be a model's (both are addressed as "model")."""
    check_type(file, "pipelines", raw, list)
    out: list[PipelineConfig] = []
    names = {m.name for m in models}
    for i, table in enumerate(raw):
        pipeline = _parse_pipeline(file, f"pipelines[{i}]", table, names, engine_dir)
        if pipeline.name in names:
            raise ConfigError(file, f"pipelines[{i}].name", f"{pipeline.name!r} is already a model's or "
                              "another pipeline's name; pipelines and models share the request's \"model\" field")
        names.add(pipeline.name)
        out.append(pipeline)
    return tuple(out)


def _parse_pipeline(file: Path, where: str, table: Any, models: set[str], engine_dir: Path) -> PipelineConfig:
    raw = read_table(file, where, table, PipelineConfig)
    check_queue_policy(file, where, raw)
    name = raw["name"]
    if not raw["steps"]:
        raise ConfigError(file, f"{where}.steps", f"pipeline {name!r} needs at least one step")
    steps = [_parse_step(file, f"{where}.steps[{j}]", name, step, models, engine_dir)
             for j, step in enumerate(raw["steps"])]
    seen: set[str] = set()
    for j, step in enumerate(steps):
        if step.name in seen:
            raise ConfigError(file, f"{where}.steps[{j}].name", f"pipeline {name!r} already has a step "
                              f"named {step.name!r}; give one a `name`")
        seen.add(step.name)
    _check_tracked(file, where, name, steps)
    raw["steps"] = tuple(steps)
    if raw.get("events") is not None:
        raw["events"] = _lifecycle(file, f"{where}.events", name, raw["events"], steps)
    return PipelineConfig(**raw)


def _lifecycle(file: Path, where: str, name: str, raw: dict[str, Any], steps: list[StepConfig]) -> LifecycleConfig:
    """A pipeline's `[pipelines.events]`, read as declared: only where a `track` step gives objects their ids."""
    if not any(step.processor == "track" for step in steps):
        raise ConfigError(file, where, f"pipeline {name!r} makes events of tracked objects: it needs a 'track' "
                          "step (docs/events.md)")
    return LifecycleConfig(**raw)


def _parse_step(file: Path, where: str, pipeline: str, raw: dict[str, Any], models: set[str],
                engine_dir: Path) -> StepConfig:
    """A step table `read_table` has read: a processor with its options, or a model."""
    if bool(raw.get("processor")) == bool(raw.get("model")):
        raise ConfigError(file, where, f"pipeline {pipeline!r}: a step names either a `processor` or a `model`")
    raw.setdefault("name", raw.get("processor") or raw.get("model"))
    step = f"pipeline {pipeline!r} step {raw['name']!r}"
    if raw.get("model") and raw["model"] not in models:
        raise ConfigError(file, f"{where}.model", f"{step}: unknown model {raw['model']!r}; "
                          f"models: {', '.join(sorted(models)) or 'none'}")
    if raw.get("processor") and ({"input", "pad_value", "pad_multiple"} & set(raw)):
        raise ConfigError(file, where, f"{step}: input, pad_value and pad_multiple belong to model steps")
    if raw.get("model") and "options" in raw:
        raise ConfigError(file, f"{where}.options", f"{step}: options belong to processor steps")
    _check_reinfer(file, where, step, raw)
    raw["options"] = _step_paths(raw.get("options", {}), engine_dir)
    if raw.get("processor"):
        _check_processor(file, f"{where}.options", step, raw["processor"], raw["name"], raw["options"])
    return StepConfig(**raw)


def _check_reinfer(file: Path, where: str, step: str, raw: Mapping[str, Any]) -> None:
    """The re-inference options belong to a fan-out model step; a track step fans out on its own."""
    given = [key for key in REINFER if key in raw]
    if given and not (raw.get("model") and raw.get("for_each") == "regions"):
        raise ConfigError(file, f"{where}.{given[0]}", f"{step}: {', '.join(REINFER)} belong to model "
                          "steps with for_each = \"regions\" (a second stage run on each region)")
    if raw.get("processor") == "track" and raw.get("for_each"):
        raise ConfigError(file, f"{where}.for_each", f"{step}: a track step follows the frame's regions; "
                          "leave for_each out")


def _check_tracked(file: Path, where: str, pipeline: str, steps: list[StepConfig]) -> None:
    """A step that reuses answers per track needs a `track` step before it to give the tracks."""
    tracked = False
    for j, step in enumerate(steps):
        tracked = tracked or step.processor == "track"
        for key in ("reinfer_every", "reinfer_growth"):
            if getattr(step, key) and not tracked:
                raise ConfigError(file, f"{where}.steps[{j}].{key}", f"pipeline {pipeline!r} step {step.name!r}: "
                                  f"{key} needs a 'track' step before it: an answer is reused for the same "
                                  "track on a later frame (docs/pipelines.md#tracking)")


def _step_paths(options: Mapping[str, Any], engine_dir: Path) -> dict[str, Any]:
    """File options (a dictionary, a label file) relative to engine_dir, like a model's engine."""
    out = dict(options)
    for key in PATH_OPTIONS:
        value = out.get(key)
        if isinstance(value, str) and value and not Path(value).expanduser().is_absolute():
            out[key] = str(engine_dir / value)
    return out


def _check_processor(file: Path, where: str, step: str, kind: str, name: str, options: Mapping[str, Any]) -> None:
    """Build the step's processor once, so that a bad option stops the file here, named."""
    try:
        processors.create(kind, options, name)
    except MissingDependency as exc:
        raise LibraryMissing(file, where, exc) from None
    except processors.ProcessorError as exc:
        raise ConfigError(file, where, f"{step}: {exc.reason}") from None
