"""Sockets and their guards: ipc socket files, CURVE for tcp, the shared-memory registration socket,
what one peer (`peers`) and one message (`limits`) may cost."""
