"""`decoder = "gstreamer"`: a camera decoded by a GStreamer pipeline (docs/cameras.md#decoding).

The same `FrameSource` as PyAV's; what differs is the pipeline's elements. The H.264 decoder is
`nvv4l2decoder ! nvvidconv` (the Jetson's hardware decoder and its converter out of NVMM memory) where
GStreamer has it, else `avdec_h264` (FFmpeg's software decoder): the code and the pipeline around it
are one, so a box without the Jetson's elements runs the very path a Jetson does, in software. The
frames leave through an `appsink` holding one buffer and dropping older ones: the newest frame wins
already inside GStreamer. GStreamer's Python bindings (PyGObject, `gi`) come from the system's packages.
"""

from __future__ import annotations

import importlib
import time
from typing import Any, Iterator

import numpy as np

from infermux.cameras.config import CameraConfig
from infermux.cameras.source import (READ_TIMEOUT_S, CameraEnded, CameraError, CameraRefused, Decoded,
                                     redact)

JETSON_DECODER = "nvv4l2decoder ! nvvidconv"
SOFTWARE_DECODER = "avdec_h264"
PULL_S = 0.1  # the longest wait for a frame between two looks at the bus


def _gst() -> Any:
    """GStreamer, initialised; CameraRefused where its Python bindings are missing."""
    try:
        gi = importlib.import_module("gi")
        gi.require_version("Gst", "1.0")
        gst = importlib.import_module("gi.repository.Gst")
    except (ImportError, ValueError):
        raise CameraRefused("decoder = \"gstreamer\" needs GStreamer's Python bindings (Debian: python3-gi, "
                            "gir1.2-gstreamer-1.0, gstreamer1.0-plugins-good and -bad, gstreamer1.0-libav; on a "
                            "Jetson also nvidia-l4t-gstreamer); use decoder = \"software\" or \"auto\"") from None
    gst.init(None)
    return gst


def has_hardware_decoder() -> bool:
    """Whether GStreamer (with its bindings) has the Jetson's decoder here: `decoder = "auto"` then uses it."""
    try:
        return _gst().ElementFactory.find("nvv4l2decoder") is not None
    except CameraRefused:
        return False


def description(camera: CameraConfig, h264: str) -> str:
    """The pipeline for `camera`, with `h264` as its H.264 decoder; the source element is named `src` (its
    location is set as a property, never written into this text)."""
    kind = camera.kind
    if kind == "rtsp":
        protocols = "tcp" if camera.transport == "tcp" else "udp"
        head = f"rtspsrc name=src latency=0 protocols={protocols} ! rtph264depay ! h264parse name=sized ! {h264}"
    elif kind == "http":
        head = "souphttpsrc name=src is-live=true ! multipartdemux ! jpegparse name=sized ! jpegdec"
    elif kind == "device":
        head = "v4l2src name=src ! identity name=sized"
    else:
        head = "filesrc name=src ! decodebin ! identity name=sized"  # decodebin's choice: sized once decoded
    size = f",width={camera.size[0]},height={camera.size[1]}" if camera.size else ""
    sync = "true" if kind == "file" else "false"  # a file plays at its own pace; a live source as it comes
    return (f"{head} ! videoconvert ! videoscale ! video/x-raw,format=RGB{size} ! "
            f"appsink name=sink max-buffers=1 drop=true sync={sync}")


class GStreamerSource:
    """A camera read through GStreamer: `frames()` pulls the appsink's newest buffer."""

    def __init__(self, camera: CameraConfig) -> None:
        self.camera = camera
        self.gst = _gst()
        h264 = JETSON_DECODER if self.gst.ElementFactory.find("nvv4l2decoder") else SOFTWARE_DECODER
        self.h264 = h264  # which decoder `infermux doctor` reports
        try:
            self.pipeline = self.gst.parse_launch(description(camera, h264))
        except Exception as exc:  # GLib.Error: an element this GStreamer does not have
            raise CameraRefused(f"cannot build the GStreamer pipeline: {exc}") from None
        key = "device" if camera.kind == "device" else "location"
        self.pipeline.get_by_name("src").set_property(key, camera.url)
        self.sink = self.pipeline.get_by_name("sink")
        self.bus = self.pipeline.get_bus()
        self.refused = ""  # why the stream is over max_pixels, once its caps said so (a streaming thread sets it)
        probe = self.gst.PadProbeType.EVENT_DOWNSTREAM | self.gst.PadProbeType.BUFFER
        self.pipeline.get_by_name("sized").get_static_pad("src").add_probe(probe, self._sized)

    def _sized(self, _pad: Any, info: Any) -> Any:
        """The stream's size as the element named `sized` announces it (a parser's caps: before the decoder
        sees a byte of a frame, at the size the stream sends, not `size`): over max_pixels, the camera is
        refused and nothing more reaches the decoder."""
        gst = self.gst
        if info.type & gst.PadProbeType.BUFFER:
            return gst.PadProbeReturn.DROP if self.refused else gst.PadProbeReturn.OK
        event = info.get_event()
        if event is None or event.type != gst.EventType.CAPS:
            return gst.PadProbeReturn.OK
        caps = event.parse_caps()
        structure = caps.get_structure(0) if caps is not None and caps.get_size() else None
        found_w, width = structure.get_int("width") if structure is not None else (False, 0)
        found_h, height = structure.get_int("height") if structure is not None else (False, 0)
        if found_w and found_h and width * height > self.camera.max_pixels:
            self.refused = (f"the stream's frames are {width}x{height} ({width * height} pixels), over this camera's "
                            f"max_pixels ({self.camera.max_pixels}); raise max_pixels to take it")
        return gst.PadProbeReturn.OK

    def frames(self) -> Iterator[Decoded]:
        gst = self.gst
        try:
            self.pipeline.set_state(gst.State.PLAYING)
            silent_since = time.monotonic()
            while True:
                if self.refused:
                    raise CameraRefused(self.refused)
                self._check_bus()
                begin = time.perf_counter()
                # In slices, so that an error on the bus (a refused connection) is seen at once.
                sample = self.sink.emit("try-pull-sample", int(PULL_S * 1e9))
                if sample is not None:
                    silent_since = time.monotonic()
                    yield Decoded(self._image(sample), time.time(), (time.perf_counter() - begin) * 1e3)
                elif time.monotonic() - silent_since > READ_TIMEOUT_S:
                    raise CameraError(f"{redact(self.camera.url)} sent no frame for {READ_TIMEOUT_S:.0f} s")
        finally:
            self.close()

    def _check_bus(self) -> None:
        gst = self.gst
        message = self.bus.pop_filtered(gst.MessageType.ERROR | gst.MessageType.EOS)
        if message is None:
            return
        if message.type == gst.MessageType.EOS:
            self._ended()
            return
        error, _ = message.parse_error()
        raise CameraError(f"{redact(self.camera.url)}: {' '.join(str(error.message).split())[:200]}")

    def _ended(self) -> None:
        """The end of the stream: a file loops (or ends), a live stream is lost."""
        if self.camera.kind != "file":
            raise CameraError(f"{redact(self.camera.url)} closed the stream")
        if not self.camera.loop:
            raise CameraEnded("the file ended")
        gst = self.gst
        self.pipeline.seek_simple(gst.Format.TIME, gst.SeekFlags.FLUSH | gst.SeekFlags.KEY_UNIT, 0)

    def _image(self, sample: Any) -> np.ndarray:
        """The sample's RGB pixels as H x W x 3, its rows' padding (GStreamer pads them to 4 bytes) dropped."""
        caps = sample.get_caps().get_structure(0)
        width, height = caps.get_value("width"), caps.get_value("height")
        if width * height > self.camera.max_pixels:
            raise CameraRefused(f"a frame is {width}x{height}, over this camera's max_pixels ({self.camera.max_pixels})")
        buffer = sample.get_buffer()
        ok, info = buffer.map(self.gst.MapFlags.READ)
        if not ok:
            raise CameraError("a decoded frame could not be read")
        try:
            rows = np.frombuffer(info.data, np.uint8)
            stride = rows.size // height
            return rows[:stride * height].reshape(height, stride)[:, :width * 3].reshape(height, width, 3).copy()
        finally:
            buffer.unmap(info)

    def close(self) -> None:
        self.pipeline.set_state(self.gst.State.NULL)
