"""`[[cameras]]`: the cameras the daemon reads itself (docs/cameras.md#configuration).

Each key is declared once with the rest of the file's (config/settings.py `CameraConfig`) and read
by the configuration's parser (config/cameras.py), whose errors name the field path
(`cameras[name="gate-3"].fps`) and the reason. Named here for the cameras' modules.
"""

from __future__ import annotations

from infermux.config.cameras import MAX_NAME_BYTES, MAX_URL, NETWORK_SCHEMES, parse_cameras, restart_needed
from infermux.config.kinds import MAX_WARM_SIDE as MAX_SIDE
from infermux.config.settings import DECODERS, DEFAULT_MAX_PIXELS, DEVICE, MAX_FPS, TRANSPORTS, CameraConfig

__all__ = ["DECODERS", "DEFAULT_MAX_PIXELS", "DEVICE", "MAX_FPS", "MAX_NAME_BYTES", "MAX_SIDE", "MAX_URL",
           "NETWORK_SCHEMES", "TRANSPORTS", "CameraConfig", "parse_cameras", "restart_needed"]
