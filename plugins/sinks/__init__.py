"""Sink discovery: built-ins plus the entry-point group `infermux.sinks` (docs/events.md#sinks).

Found and loaded the way processors are: a kind maps to "module:Class",
imported on first use; "module:Class" itself is accepted as a kind, for a
sink not installed as a package (the daemon's configuration file only).
"""

from __future__ import annotations

from typing import Any, Mapping, cast

from infermux.plugins import discovery
from infermux.plugins.sinks.base import OutEvent, Sink, SinkConfigError, SinkDown, SinkFactory, SinkInUse

__all__ = ["OutEvent", "Sink", "SinkConfigError", "SinkDown", "SinkFactory", "SinkInUse", "available", "check", "create", "probe"]

# Listed here as well as in pyproject's entry points: a source checkout without `pip install` finds them.
BUILTIN = {
    "jsonl": "infermux.plugins.sinks.jsonl:JsonlSink",
    "zmq": "infermux.plugins.sinks.zmqpub:ZmqSink",
    "mqtt": "infermux.plugins.sinks.mqtt:MqttSink",
    "webhook": "infermux.plugins.sinks.webhook:WebhookSink",
}


def available() -> dict[str, str]:
    """Sink kind -> 'module:Class' for every sink that can be tried."""
    return discovery.specs("infermux.sinks", BUILTIN)


def factory(kind: str) -> SinkFactory:
    """The class of sink `kind` (or "module:Class"); SinkConfigError when unknown or not importable."""
    specs = discovery.specs("infermux.sinks", BUILTIN, kind)
    if kind not in specs:
        raise SinkConfigError(kind, f"unknown sink kind; installed: {', '.join(sorted(specs))}")
    try:
        return cast(SinkFactory, discovery.resolve(specs[kind]))
    except (ImportError, AttributeError) as exc:
        raise SinkConfigError(kind, f"sink is not usable here: {exc}") from exc


def check(kind: str, options: Mapping[str, Any]) -> None:
    """SinkConfigError when `options` do not suit sink `kind` (nothing is connected)."""
    factory(kind).check(options)


def create(kind: str, name: str, options: Mapping[str, Any]) -> Sink:
    """A started sink of `kind` named `name` (connections are made on first delivery)."""
    return factory(kind)(name, options)


def probe(kind: str, options: Mapping[str, Any], timeout_s: float) -> str | None:
    """What sink `kind`'s probe reached (None: the kind has none); SinkDown or SinkConfigError if not."""
    found = factory(kind)
    factory_probe = getattr(found, "probe", None)
    return None if factory_probe is None else str(factory_probe(options, timeout_s))
