"""Cameras the daemon reads itself (docs/cameras.md): one process per camera decodes its stream, takes
frames at its rate, gates them on motion and sends them to its pipeline through shared memory."""
