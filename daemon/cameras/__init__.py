"""Cameras the daemon reads itself (docs/cameras.md): configuration, decoding, motion gating, supervision."""
