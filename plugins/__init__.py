"""Backends (onnxruntime, tensorrt) and their plugin interface."""
