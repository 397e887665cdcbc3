"""Pipelines (docs/pipelines.md): processor and model steps run on a frame, addressed like a model.

`spec` turns a `[[pipelines]]` entry into typed steps, `calls` sends a model
step's tensors to the model's own placement as an internal request, `runner`
runs the steps on a small bounded thread pool, `stats` keeps per-step counts
and latencies for the views.
"""
