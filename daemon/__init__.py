"""infermux: a multi-model inference daemon for edge GPUs."""

__version__ = "0.1.0"
