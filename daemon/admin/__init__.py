"""Operators and the service manager: the admin socket and stats stream, commands, snapshots, metrics, sd_notify."""
