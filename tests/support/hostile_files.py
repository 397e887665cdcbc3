"""Frames made to lie or to cost: shared by the tests of the `decode` step and the pipeline bounds
(test_hostile_frames.py, test_pipeline_bounds.py) and by benchmarks/bench_hostile.py.

Each is a few hundred bytes to a few hundred KB on the wire.
"""

from __future__ import annotations

import io
import zlib

import cv2
import numpy as np


def small_jpeg() -> bytearray:
    return bytearray(cv2.imencode(".jpg", np.zeros((8, 8, 3), np.uint8))[1].tobytes())


def declaring(jpeg: bytearray, width: int, height: int) -> bytearray:
    """`jpeg` with its frame header (SOF0) saying `width` x `height`."""
    at = jpeg.index(b"\xff\xc0")
    jpeg[at + 5:at + 9] = height.to_bytes(2, "big") + width.to_bytes(2, "big")
    return jpeg


def jpeg_with_fill_byte(width: int = 32768, height: int = 32000) -> bytes:
    """A legal 0xFF fill byte before the SOF marker (a parser that expects a marker there gives up)."""
    jpeg = declaring(small_jpeg(), width, height)
    at = jpeg.index(b"\xff\xc0")
    return bytes(jpeg[:at] + b"\xff" + jpeg[at:])


def jpeg_with_big_app_segment(width: int = 20000, height: int = 20000, pad: int = 65533) -> bytes:
    """An APP1 segment of 65,535 bytes (the most one holds) first: the SOF lies past the first 64 KiB."""
    jpeg = declaring(small_jpeg(), width, height)
    return bytes(jpeg[:2] + b"\xff\xe1" + (pad + 2).to_bytes(2, "big") + bytes(pad) + jpeg[2:])


def _chunk(kind: bytes, body: bytes) -> bytes:
    return len(body).to_bytes(4, "big") + kind + body + zlib.crc32(kind + body).to_bytes(4, "big")


def png_with_a_chunk_before_ihdr(width: int = 30000, height: int = 30000) -> bytes:
    """A tEXt chunk first whose bytes 16..24 of the file read as 1 x 1; IHDR after it says the truth."""
    png = cv2.imencode(".png", np.zeros((1, 1, 3), np.uint8))[1].tobytes()
    ihdr = bytearray(png[8:33])
    ihdr[8:16] = width.to_bytes(4, "big") + height.to_bytes(4, "big")
    ihdr[-4:] = zlib.crc32(bytes(ihdr[4:-4])).to_bytes(4, "big")
    text = _chunk(b"tEXt", b"k\x00" + (1).to_bytes(4, "big") * 2)
    return png[:8] + text + bytes(ihdr) + png[33:]


def ppm_named_jpeg(width: int = 30000, height: int = 30000) -> bytes:
    """Not a JPEG at all: a binary PPM header, which cv2.imdecode would also take."""
    return f"P6\n{width} {height}\n255\n".encode() + bytes(64)


def drawn(rows: int, cols: int, line: int = 0, size: tuple[int, int] = (1920, 1080)) -> bytes:
    """A PNG of `rows` x `cols` tiny "AB" tokens (Pillow's 11 px bitmap font), and a line of `line`
    more across the bottom: each token is a text region, the line one very wide region."""
    from PIL import Image, ImageDraw, ImageFont

    image = Image.new("RGB", size, "white")
    draw, font = ImageDraw.Draw(image), ImageFont.load_default()
    for r in range(rows):
        for c in range(cols):
            draw.text((10 + c * 47, 8 + r * 42), "AB", fill="black", font=font)
    if line:
        draw.text((10, size[1] - 80), "AB " * line, fill="black", font=font)
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


def blank_png(width: int, height: int) -> bytes:
    """A one-colour grey PNG: 218 KB at 8192 x 8192."""
    from PIL import Image

    out = io.BytesIO()
    Image.new("L", (width, height), 255).save(out, "PNG")
    return out.getvalue()


def progressive_jpeg_with_scans(side: int = 2048, scans: int = 2000) -> bytes:
    """A progressive gray JPEG of `side` x `side` black pixels with `scans` more scans after its own,
    each a 10-byte DC refinement scan header and no data: libjpeg passes over the whole frame for each,
    so a file of tens of KB costs seconds of CPU, where a camera writes one scan."""
    jpeg = cv2.imencode(".jpg", np.zeros((side, side), np.uint8), [cv2.IMWRITE_JPEG_PROGRESSIVE, 1])[1].tobytes()
    sos = b"\xff\xda\x00\x08\x01\x01\x00\x00\x00\x10"  # one component, Ss = Se = 0, Ah = 1, Al = 0
    return jpeg[:-2] + sos * scans + b"\xff\xd9"
