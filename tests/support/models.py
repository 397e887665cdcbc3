"""Tiny ONNX models made by the tests, each for one behaviour."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper


def _save(nodes: list, inputs: list, outputs: list, inits: list, path: Path) -> Path:
    graph = helper.make_graph(nodes, path.parent.parent.name or "m", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model.SerializeToString())
    return path


def add_one(path: Path, width: int = 4, offset: float = 1.0) -> Path:
    """y = x + offset, float32 [N, width]; `offset` tells versions apart."""
    return _save(
        [helper.make_node("Add", ["x", "c"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", width])],
        [numpy_helper.from_array(np.float32([offset]), "c")], path)


def heavy(path: Path, offset: float = 1.0, repeat: int = 1) -> Path:
    """y = x + offset, float32 [N, 4], as add_one answers, computed through an [N, 4, repeat] intermediate
    that each call allocates and sums: `repeat` makes it as slow and memory-hungry as wanted (16 B x N x
    repeat per call), which a load does not show."""
    nodes = [helper.make_node("Unsqueeze", ["x", "axis"], ["column"]),
             helper.make_node("Expand", ["column", "wide"], ["spread"]),
             helper.make_node("ReduceSum", ["spread", "axis"], ["sum"], keepdims=0),
             helper.make_node("Mul", ["sum", "zero"], ["nothing"]),
             helper.make_node("Add", ["x", "c"], ["shifted"]),
             helper.make_node("Add", ["shifted", "nothing"], ["y"])]
    constants = [numpy_helper.from_array(np.int64([2]), "axis"), numpy_helper.from_array(np.int64([1, 1, repeat]), "wide"),
                 numpy_helper.from_array(np.float32([0]), "zero"), numpy_helper.from_array(np.float32([offset]), "c")]
    return _save(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])], constants, path)


def two_outputs(path: Path) -> Path:
    """sum = a + b and prod = a * b, float32 [N, 3]; for the outputs filter."""
    t = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", 3])  # noqa: E731
    return _save([helper.make_node("Add", ["a", "b"], ["sum"]), helper.make_node("Mul", ["a", "b"], ["prod"])],
                 [t("a"), t("b")], [t("sum"), t("prod")], [], path)


def slow(path: Path, layers: int = 12, width: int = 512) -> Path:
    """A chain of [N,width]x[width,width] matmuls: milliseconds per call on one thread."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32), "w")
    nodes, x = [], "x"
    for i in range(layers):
        y = "y" if i == layers - 1 else f"h{i}"
        nodes.append(helper.make_node("MatMul", [x, "w"], [y]))
        x = y
    return _save(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", width])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", width])], [w], path)


def one_matmul(path: Path, rows: int = 4096, cols: int = 6144) -> Path:
    """y = x @ w, float32 [N, rows] -> [N, cols]: a model that is almost all weights
    (4096 x 6144: 96 MiB), for memory that must be held once."""
    w = np.random.default_rng(0).standard_normal((rows, cols), dtype=np.float32)
    return _save([helper.make_node("MatMul", ["x", "w"], ["y"])],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", rows])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", cols])],
                 [numpy_helper.from_array(w, "w")], path)


def reshaper(path: Path) -> Path:
    """Reshape(x, shape): a shape whose size does not match fails inside onnxruntime (500)."""
    return _save([helper.make_node("Reshape", ["x", "shape"], ["y"])],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4]),
                  helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["A", "B"])], [], path)


def nonzero(path: Path, width: int = 20000) -> Path:
    """y = NonZero(x): int64 [2, count of non-zeros], an output whose shape depends on the data."""
    return _save([helper.make_node("NonZero", ["x"], ["y"])],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", width])],
                 [helper.make_tensor_value_info("y", TensorProto.INT64, [2, "K"])], [], path)


def conv(path: Path, channels: int = 24, layers: int = 4, size: int = 112) -> Path:
    """A small image classifier: `layers` 3x3 convolutions (with ReLU) over images float32 [N,3,size,size],
    global average pooling, then 10 scores "probs": milliseconds a frame on one thread, as a camera's
    model costs (tests/benchmarks/bench_streams.py)."""
    rng = np.random.default_rng(1)
    inits, nodes, x, c_in = [], [], "images", 3
    for i in range(layers):
        w = (rng.standard_normal((channels, c_in, 3, 3)) / np.sqrt(9 * c_in)).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes += [helper.make_node("Conv", [x, f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"])]
        x, c_in = f"r{i}", channels
    inits += [numpy_helper.from_array((rng.standard_normal((channels, 10)) / 4).astype(np.float32), "head"),
              numpy_helper.from_array(np.int64([0, -1]), "flat")]
    nodes += [helper.make_node("GlobalAveragePool", [x], ["pooled"]),
              helper.make_node("Reshape", ["pooled", "flat"], ["features"]),
              helper.make_node("MatMul", ["features", "head"], ["probs"])]
    return _save(nodes, [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["N", 3, size, size])],
                 [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["N", 10])], inits, path)
def tiler(path: Path, width: int = 512) -> Path:
    """y = Tile(x, repeats): float32 [N, width] in, [N * r0, width * r1] out; the client chooses how big."""
    return _save([helper.make_node("Tile", ["x", "repeats"], ["y"])],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", width]),
                  helper.make_tensor_value_info("repeats", TensorProto.INT64, [2])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", "W"])], [], path)


def brightness_map(path: Path) -> Path:
    """y = the brightest channel of each pixel, float32 [1, 3, H, W] -> [1, 1, H, W]: a "detector" whose
    map `dbnet` reads the bright objects of a dark frame from (tests/support/tracking.py's frames)."""
    return _save([helper.make_node("ReduceMax", ["x"], ["y"], axes=[1], keepdims=1)],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "H", "W"])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, "H", "W"])], [], path)


def external_weights(path: Path, width: int = 4, offset: float = 1.0) -> Path:
    """add_one (y = x + offset) with its constant in `<path>.data` beside it, as ONNX external data."""
    import onnx
    from onnx.external_data_helper import convert_model_to_external_data

    add_one(path, width, offset)
    model = onnx.load(str(path))
    convert_model_to_external_data(model, all_tensors_to_one_file=True, location=path.name + ".data",
                                   size_threshold=0)
    onnx.save_model(model, str(path))
    return path


def box_echo(path: Path) -> Path:
    """y = x reshaped to [1, 5, W / 5], float32 [1, 1, 1, W] in: a "detector" that answers, in YOLOv8's
    layout (cx, cy, w, h, score per box), whatever boxes its frame's pixels spell (tests/daemon/
    test_hostile_boxes.py): one pixel row scaled by `normalize` is a box of any size, or infinity."""
    shape = numpy_helper.from_array(np.array([1, 5, -1], np.int64), "shape")
    _save([helper.make_node("Reshape", ["x", "shape"], ["y"])],
          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 1, "W"])],
          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5, "B"])], [shape], path)
    np.savez(path.parent / "warmup.npz", x=np.zeros((1, 1, 1, 5), np.float32))  # W = 1 spells no box
    return path


def box_echo_pipeline(name: str, scale: str, *, track: bool = False, crop: str = "", tail: str = "",
                      head: str = "") -> str:
    """A pipeline (TOML) that turns a raw gray frame into box_echo's boxes: decode to gray, normalize by
    `scale`, the model "echo", yolo, optionally track, then crop (with `crop` as its options) and the
    steps in `tail`; `head` is put under the pipeline's name (e.g. its own bounds)."""
    track_step = '[[pipelines.steps]]\nprocessor = "track"\n' if track else ""
    crop_options = f"options = {{ {crop} }}\n" if crop else ""
    return (f'\n[[pipelines]]\nname = "{name}"\n{head}'
            '[[pipelines.steps]]\nprocessor = "decode"\noptions = { to = "gray" }\n'
            f'[[pipelines.steps]]\nprocessor = "normalize"\noptions = {{ scale = {scale} }}\n'
            '[[pipelines.steps]]\nmodel = "echo"\n'
            '[[pipelines.steps]]\nprocessor = "yolo"\noptions = { score = 0.1, per_class = false }\n'
            f'{track_step}[[pipelines.steps]]\nprocessor = "crop"\n{crop_options}{tail}')


def ppocr(target: Path) -> Path:
    """The OCR example's models in `target`, fetched by its own script (engines/fetch_ppocr.py, from the
    installed rapidocr-onnxruntime wheel): det.onnx, cls.onnx, rec.onnx and keys.txt."""
    from support.harness import REPO

    out = subprocess.run([sys.executable, str(REPO / "engines/fetch_ppocr.py"), "--into", str(target)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert {p.name for p in target.iterdir()} >= {"det.onnx", "cls.onnx", "rec.onnx", "keys.txt"}
    return target
