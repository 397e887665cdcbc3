"""Sockets and their guards: ipc socket files, CURVE for tcp, the shared-memory registration socket."""
