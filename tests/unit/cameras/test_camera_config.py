"""`[[cameras]]` as the configuration parser reads it, and the request header's `captured`."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from infermux import config as cfg
from infermux.cameras.config import DEFAULT_MAX_PIXELS
from infermux.protocol import ProtocolError, encode_request, parse_request

HEAD = """
[[models]]
name = "m"
engine = "m/1/model.onnx"
[[pipelines]]
name = "cams"
[[pipelines.steps]]
model = "m"
"""


def parse(cameras: str, folder: Path = Path("/etc/infermux")) -> cfg.Config:
    return cfg.parse(HEAD + cameras, folder / "infermux.toml")


def error(cameras: str) -> cfg.ConfigError:
    with pytest.raises(cfg.ConfigError) as caught:
        parse(cameras)
    return caught.value


def test_a_camera_takes_its_defaults_and_a_relative_file_resolves_against_the_configuration() -> None:
    config = parse('[[cameras]]\nname = "yard"\nurl = "clips/yard.mp4"\npipeline = "cams"\n')
    (camera,) = config.cameras
    assert (camera.url, camera.kind, camera.fps, camera.transport, camera.loop, camera.enabled) == (
        "/etc/infermux/clips/yard.mp4", "file", 15.0, "tcp", True, True)
    assert camera.max_pixels == DEFAULT_MAX_PIXELS and camera.size is None and camera.gate is None


def test_rtsp_http_and_device_urls_keep_their_text_and_kind() -> None:
    config = parse("".join(f'[[cameras]]\nname = "c{i}"\nurl = "{url}"\npipeline = "cams"\n' for i, url in
                           enumerate(("rtsp://10.0.0.1/s", "http://cam/video.mjpg", "/dev/video0"))))
    assert [(c.url, c.kind) for c in config.cameras] == [
        ("rtsp://10.0.0.1/s", "rtsp"), ("http://cam/video.mjpg", "http"), ("/dev/video0", "device")]


def test_a_misspelt_field_is_named_with_the_camera_and_its_nearest_field() -> None:
    exc = error('[[cameras]]\nname = "yard"\nurl = "a.mp4"\npipeline = "cams"\ntransprot = "udp"\n')
    assert exc.path == 'cameras[name="yard"].transprot' and "did you mean `transport`?" in exc.reason


def test_an_unknown_pipeline_is_refused_with_the_pipelines_there_are() -> None:
    exc = error('[[cameras]]\nname = "yard"\nurl = "a.mp4"\npipeline = "camz"\n')
    assert exc.path == 'cameras[name="yard"].pipeline' and "did you mean `cams`?" in exc.reason


@pytest.mark.parametrize("field, value, words", [
    ("fps", "0", "must be > 0"), ("fps", "1000", "must be <= 240"), ("transport", '"http"', "tcp, udp"),
    ("decoder", '"nvdec"', "auto, software, gstreamer"), ("size", "[640]", "[width, height]"),
    ("max_pixels", "0", ">= 1"), ("loop", '"yes"', "must be bool"), ("url", '"ftp://x/y"', "ftp://"),
    ("name", '"a\\u001b[2Jb"', "printable")])
def test_a_bad_value_is_refused_naming_its_field(field: str, value: str, words: str) -> None:
    fields = {"name": '"yard"', "url": '"a.mp4"', "pipeline": '"cams"', field: value}
    exc = error("[[cameras]]\n" + "".join(f"{k} = {v}\n" for k, v in fields.items()))
    assert exc.path.endswith(f".{field}") and words in exc.reason, exc


@pytest.mark.parametrize("url, field, value", [
    ("clips/yard.mp4", "transport", '"udp"'), ("http://cam/video.mjpg", "transport", '"tcp"'),
    ("rtsp://10.0.0.1/s", "loop", "false"), ("/dev/video0", "loop", "true")])
def test_a_field_for_another_kind_of_url_is_refused_naming_the_kind_it_belongs_to(url: str, field: str,
                                                                                    value: str) -> None:
    exc = error(f'[[cameras]]\nname = "yard"\nurl = "{url}"\npipeline = "cams"\n{field} = {value}\n')
    assert exc.path == f'cameras[name="yard"].{field}' and "only applies to" in exc.reason, exc


def test_two_cameras_of_one_name_are_refused() -> None:
    exc = error('[[cameras]]\nname = "a"\nurl = "a.mp4"\npipeline = "cams"\n' * 2)
    assert exc.path == "cameras[1].name" and "already defined" in exc.reason


def test_the_capture_time_travels_in_the_header_and_a_time_far_off_is_refused() -> None:
    now = time.time()
    frames = encode_request("cams", {}, key="yard", captured=now - 0.5)
    assert parse_request([bytes(f) for f in frames]).captured == pytest.approx(now - 0.5)
    for bad in (now + 2 * 86_400, "soon", True, 0):
        header = json.dumps({"model": "cams", "captured": bad}).encode()
        with pytest.raises(ProtocolError, match="'captured'"):
            parse_request([header])


def test_a_cameras_gate_is_read_with_the_camera_and_its_errors_name_the_camera() -> None:
    entry = '[[cameras]]\nname = "yard"\nurl = "a.mp4"\npipeline = "cams"\n[cameras.gate]\n'
    (camera,) = parse(entry + "every_s = 5\n").cameras
    assert camera.gate is not None and camera.gate.every_s == 5.0
    exc = error(entry + "treshold = 0.1\n")
    assert exc.path == 'cameras[name="yard"].gate.treshold' and "did you mean `threshold`?" in exc.reason
    assert exc.file.endswith("infermux.toml")
