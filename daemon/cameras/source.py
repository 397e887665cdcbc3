"""Where a camera's frames come from: a stream, a file or a device, decoded (docs/cameras.md#decoding).

`open_source(camera)` gives a `FrameSource` whose `frames()` yields `Decoded` frames (RGB, scaled to
the camera's `size` on the way out of the decoder) and raises `CameraError(reason)` when the camera
refuses, sends what does not decode, or stops sending; `CameraEnded` at the end of a file played once.
`probe(camera, timeout_s)` opens a camera once and decodes one frame, within a bound (`infermux doctor`).

Software decoding is FFmpeg through PyAV, for every URL kind: rtsp:// (over `transport`), http(s)://
MJPEG, files (played at their own pace, looped or not) and /dev/videoN (V4L2). `decoder = "gstreamer"`
is the Jetson path (nvv4l2decoder): the same protocol with GStreamer elements, refused with the reason
where GStreamer's Python bindings are missing (cameras/gstreamer.py).
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterator, Protocol

import numpy as np

from infermux.cameras.config import CameraConfig

OPEN_TIMEOUT_S = 5.0  # opening a stream (a connect, RTSP's DESCRIBE and SETUP) that takes longer is lost
READ_TIMEOUT_S = 5.0  # a stream silent this long is lost
# A live stream's probe: FFmpeg's default reads seconds of it to estimate the frame rate, all of it added
# to each reconnection (docs/cameras.md#decoding); a camera's stream gives its size in its first key frame.
PROBE = {"analyzeduration": "500000", "probesize": "1000000"}
MAX_BAD_PACKETS = 50  # packets in a row that do not decode: the stream sends garbage
REASON_CHARS = 300  # a reason's length, at most: it travels in events and `ctl cameras`


class CameraError(Exception):
    """The camera cannot be read now: `reason` says why (refused, unreachable, garbage, silent)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason[:REASON_CHARS]
        super().__init__(self.reason)


class CameraEnded(CameraError):
    """A file played once (`loop = false`) has ended."""


class CameraRefused(CameraError):
    """The stream is one the camera's settings refuse (over `max_pixels`): retrying soon changes nothing."""


@dataclass
class Decoded:
    """One decoded frame: H x W x 3 uint8 RGB, its capture time (epoch seconds) and what decoding it cost."""

    image: np.ndarray
    captured: float
    decode_ms: float


class FrameSource(Protocol):
    """A camera's decoded frames, until it fails (CameraError) or ends (CameraEnded)."""

    def frames(self) -> Iterator[Decoded]:
        """Decoded frames as they come; raises CameraError."""
        ...

    def close(self) -> None:
        """Release the stream (any thread)."""
        ...


_USERINFO = re.compile(r"(?<=://)[^/@]*@")


def redact(url: str) -> str:
    """The URL without its user and password (rtsp://user:secret@host/ -> rtsp://***@host/)."""
    return _USERINFO.sub("***@", url)


def open_source(camera: CameraConfig) -> FrameSource:
    """The FrameSource of `camera`'s decoder; CameraError where that decoder cannot run here. "auto" is the
    Jetson's hardware decoder for an RTSP camera where GStreamer has it, else PyAV."""
    if camera.decoder == "software":
        return PyAVSource(camera)
    # Imports this module's errors: loaded when a camera may use GStreamer, not at import.
    from infermux.cameras.gstreamer import GStreamerSource, has_hardware_decoder

    if camera.decoder == "gstreamer" or (camera.kind == "rtsp" and has_hardware_decoder()):
        return GStreamerSource(camera)
    return PyAVSource(camera)


def _av() -> Any:
    try:
        import av
    except ImportError:
        raise CameraRefused("cameras need PyAV: pip install 'infermux[cameras]' (or av)") from None
    return av


class PyAVSource:
    """FFmpeg's demuxers and decoders through PyAV; a file is paced to its own timestamps."""

    def __init__(self, camera: CameraConfig) -> None:
        self.camera = camera
        self._container: Any = None
        self._closed = False

    def _open(self) -> Any:
        av = _av()
        camera = self.camera
        options: dict[str, str] = {}
        fmt = None
        if camera.kind in ("rtsp", "http"):
            options.update(PROBE)
        if camera.kind == "rtsp":
            options["rtsp_transport"] = camera.transport
        elif camera.kind == "device":
            fmt = "v4l2"
        try:
            container = av.open(camera.url, format=fmt, options=options, timeout=(OPEN_TIMEOUT_S, READ_TIMEOUT_S))
        except av.FFmpegError as exc:
            raise CameraError(f"cannot open {redact(camera.url)}: {_text(exc)}") from None
        except OSError as exc:
            raise CameraError(f"cannot open {redact(camera.url)}: {exc.strerror or exc}") from None
        if not container.streams.video:
            container.close()
            raise CameraError(f"{redact(camera.url)} has no video stream")
        return container

    def _check_size(self, stream: Any) -> None:
        """Refuse a stream whose advertised frames are over `max_pixels`, before one is decoded."""
        width, height = stream.codec_context.width or 0, stream.codec_context.height or 0
        if width * height > self.camera.max_pixels:
            raise CameraRefused(f"the stream's frames are {width}x{height} ({width * height} pixels), over this "
                                f"camera's max_pixels ({self.camera.max_pixels}); raise max_pixels to take it")

    def frames(self) -> Iterator[Decoded]:
        av = _av()
        self._container = container = self._open()
        try:
            stream = container.streams.video[0]
            # Slice threads only: frame threads hold each frame back by as many frames as there are
            # threads, latency the capture-to-result age cannot see (docs/decisions.md, decoding cameras).
            stream.thread_type = "SLICE"
            # A frame cut into several slices reaches us from FFmpeg's RTSP demuxer as one packet per slice
            # (its parser does not join them): `chunks` has the decoder put a frame together from packets
            # and hand it over once its last macroblock row is decoded, not a part-frame per packet.
            stream.codec_context.options = {**stream.codec_context.options, "flags2": "+chunks"}
            self._check_size(stream)
            paced = self.camera.kind == "file"
            while not self._closed:
                start, first_pts = time.monotonic(), None
                for decoded, pts in self._decode(av, container, stream):
                    if paced and pts is not None:
                        first_pts = pts if first_pts is None else first_pts
                        _sleep_until(start + pts - first_pts)
                        decoded.captured = time.time()  # a file's frame is "captured" when its time comes
                    yield decoded
                if not paced:  # a live stream that ends was closed by the camera: lost, and opened again
                    raise CameraError(f"{redact(self.camera.url)} closed the stream")
                if not self.camera.loop:
                    raise CameraEnded("the file ended")
                container.seek(0)
        finally:
            self.close()

    def _decode(self, av: Any, container: Any, stream: Any) -> Iterator[tuple[Decoded, float | None]]:
        """Each decoded frame, and its timestamp in the stream (s; None where it has none)."""
        bad = 0
        to_rgb = RGBConverter(self.camera.size)
        packets = container.demux(stream)
        while True:
            try:
                packet = next(packets)
                begin = time.perf_counter()
                frames = packet.decode()
            except StopIteration:
                return
            except av.InvalidDataError as exc:
                bad += 1
                if bad >= MAX_BAD_PACKETS:
                    raise CameraError(f"{bad} packets in a row do not decode ({_text(exc)})") from None
                continue
            except av.FFmpegError as exc:
                if self._closed:
                    return
                raise CameraError(f"reading {redact(self.camera.url)}: {_text(exc)}") from None
            bad = 0
            for frame in frames:
                if frame.width * frame.height > self.camera.max_pixels:
                    raise CameraRefused(f"a frame is {frame.width}x{frame.height}, over this camera's max_pixels "
                                        f"({self.camera.max_pixels})")
                image = to_rgb(frame)
                yield Decoded(image, time.time(), (time.perf_counter() - begin) * 1e3), frame.time
                begin = time.perf_counter()

    def close(self) -> None:
        self._closed = True
        container, self._container = self._container, None
        if container is not None:
            try:
                container.close()
            except Exception:  # closing a stream that failed: nothing more to release
                pass


class RGBConverter:
    """Decoded frames to H x W x 3 RGB arrays, scaled to `size` (width, height) where one is given.

    `frame.to_ndarray(format="rgb24")` makes a new swscale context for each frame, on a thread a core: most
    of what converting cost (docs/decisions.md, decoding cameras). One context kept across a stream's
    frames, on the calling thread, gives the same pixels for less CPU; OpenCV's I420
    conversion measured no cheaper than that, so swscale converts every frame, scaled or not."""

    def __init__(self, size: tuple[int, int] | None) -> None:
        from av.video.reformatter import VideoReformatter

        self._scale = {"width": size[0], "height": size[1]} if size else {}
        self._reformatter = VideoReformatter()

    def __call__(self, frame: Any) -> np.ndarray:
        image: np.ndarray = self._reformatter.reformat(frame, format="rgb24", threads=1, **self._scale).to_ndarray()
        return image


@dataclass(frozen=True)
class Probe:
    """What opening a camera once found: the decoder it uses, then its first frame's size and how long it
    took to come, or why none came (`refused`: the camera's own settings refuse it; retrying changes nothing)."""

    decoder: str
    size: tuple[int, int] | None = None  # width, height
    ms: float = 0.0
    error: str = ""
    refused: bool = False


def decoder_name(source: FrameSource) -> str:
    """Which decoder a source is, as an operator reads it: software (FFmpeg through PyAV) or GStreamer's."""
    if isinstance(source, PyAVSource):
        return f"software (FFmpeg through PyAV {_av().__version__})"
    # GStreamer's H.264 decoder is chosen for RTSP; other kinds are decodebin's choice.
    camera, h264 = getattr(source, "camera", None), str(getattr(source, "h264", ""))
    if camera is not None and camera.kind == "rtsp" and "nvv4l2decoder" in h264:
        return "gstreamer (nvv4l2decoder, the Jetson's hardware decoder)"
    return "gstreamer (software elements)"


def probe(camera: CameraConfig, timeout_s: float) -> Probe:
    """Open `camera`, decode its first frame and close it, in at most about `timeout_s` (a camera that
    accepts the connection and sends nothing is closed then, from this thread)."""
    try:
        source = open_source(camera)
    except CameraError as exc:
        return Probe("none", error=exc.reason, refused=isinstance(exc, CameraRefused))
    found: list[Probe] = []
    decoder, begin = decoder_name(source), time.monotonic()

    def first() -> None:
        try:
            frame = next(iter(source.frames()))
            found.append(Probe(decoder, (frame.image.shape[1], frame.image.shape[0]), (time.monotonic() - begin) * 1e3))
        except CameraError as exc:
            found.append(Probe(decoder, error=exc.reason, refused=isinstance(exc, CameraRefused)))
        except StopIteration:
            found.append(Probe(decoder, error="the stream ended before its first frame"))
        except Exception as exc:  # a decoder's own failure: reported as the camera's, never raised to doctor
            found.append(Probe(decoder, error=f"{type(exc).__name__}: {_text(exc)}"))

    reader = threading.Thread(target=first, name=f"probe-{camera.name}", daemon=True)
    reader.start()
    reader.join(timeout_s)
    source.close()
    reader.join(1.0)
    return found[0] if found else Probe(decoder, error=f"no frame within {timeout_s:g} s: it accepted the "
                                                       "connection and sent nothing that decodes")


def _sleep_until(deadline: float) -> None:
    left = deadline - time.monotonic()
    if left > 0:
        time.sleep(min(left, 1.0))


def _text(exc: BaseException) -> str:
    """An FFmpeg error as one printable line."""
    text = " ".join(str(getattr(exc, "strerror", None) or exc).split())
    return "".join(c if c.isprintable() else "?" for c in text)[:200]
