"""Sinks: each with a durable spool under the state directory, delivered from its own thread (docs/events.md)."""

from pathlib import Path

SCHEMA = Path(__file__).with_name("event.schema.json")  # the events' JSON Schema, shipped with the package
