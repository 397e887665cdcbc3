"""Whether a fallback can stand in for its model: it must take the same inputs.

A request is sent to the fallback as it is, so the fallback must accept
every request its model accepts: the same input names, dtypes, and rank and
dimensions after the batch one (a dynamic `-1` on either side matches any
size). Inputs are known only once an engine is loaded, so the check runs
when a version of either model becomes ready (`Registry.load`), after a
reload, and at `ctl set ... fallback=` (where both are loaded then; else
the first load checks it). A refused fallback is removed and said so, in the
reply or in a `fallback_refused` event.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from infermux.plugins.base import TensorSpec

if TYPE_CHECKING:
    from infermux.models.version import Model


def describe(specs: Sequence[TensorSpec]) -> str:
    """`images float32[?,3,64,64]`, the way an operator reads inputs."""
    return ", ".join(f"{s.name} {s.dtype}[{','.join('?' if d < 0 else str(d) for d in s.shape)}]"
                     for s in sorted(specs, key=lambda s: s.name))


def mismatch(model: Sequence[TensorSpec], fallback: Sequence[TensorSpec]) -> str:
    """What in `fallback`'s inputs differs from `model`'s, or "" when it takes the same."""
    theirs = {s.name: s for s in fallback}
    if set(theirs) != {s.name for s in model}:
        return "the input names differ"
    for ours in model:
        other = theirs[ours.name]
        if other.dtype != ours.dtype:
            return f"input {ours.name!r} is {ours.dtype} here but {other.dtype} there"
        if len(other.shape) != len(ours.shape) or any(
                a >= 0 and b >= 0 and a != b for a, b in zip(ours.shape[1:], other.shape[1:])):
            return f"input {ours.name!r} differs in rank or in a dimension after the batch one"
    return ""


def inputs_of(model: "Model") -> Sequence[TensorSpec] | None:
    """The inputs of `model`'s default version if loaded, else of any loaded version; None if none is."""
    default = model.default()
    loaded = [mv for mv in ([default] if default is not None else []) + model.ordered() if mv.engine is not None]
    engine = loaded[0].engine if loaded else None
    return engine.inputs if engine is not None else None


def refusal(model: "Model", fallback: "Model") -> str:
    """Why `fallback` cannot stand in for `model` ("" if it can, or if either is not loaded yet)."""
    ours, theirs = inputs_of(model), inputs_of(fallback)
    if ours is None or theirs is None:
        return ""
    why = mismatch(ours, theirs)
    if not why:
        return ""
    return (f"fallback {fallback.name!r} does not take the inputs of {model.name!r} ({why}): "
            f"{model.name!r} takes {describe(ours)}, {fallback.name!r} takes {describe(theirs)}")
