"""The request path inside the daemon: the frontend thread, routing, scheduling, batching, executors, statistics."""
