"""The top of the daemon: the frontend loop (`server`) and admission policy (`router`).

The server owns the inference socket and the thread that reads it, sends
every reply, and wires the registry, worker pool, pipelines and engine
watcher together; the router decides what becomes of each request.
"""
