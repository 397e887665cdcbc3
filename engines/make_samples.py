"""Make the sample engines served by etc/infermux/infermux.toml.

    python engines/make_samples.py [ENGINE_DIR]

Writes <dir>/classifier/1/model.onnx (float32 [N,3,64,64] -> probs [N,10])
and <dir>/mlp/1/model.onnx (float32 [N,256] -> logits [N,10]). Weights come
from a fixed seed, so the files are the same on every run. Needs `onnx`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8  # readable by onnxruntime >= 1.14 and TensorRT 8.6+


def _init(name: str, array: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(array.astype(np.float32), name)


def _save(graph: onnx.GraphProto, path: Path) -> None:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="infermux-samples")
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model.SerializeToString())
    print(f"wrote {path} ({path.stat().st_size} bytes)")


def classifier(rng: np.random.Generator) -> onnx.GraphProto:
    """conv3x3(3->16, stride 2) -> relu -> conv3x3(16->32, stride 2) -> relu -> GAP -> fc(32->10) -> softmax."""
    inits = [
        _init("w1", rng.normal(0, 0.2, (16, 3, 3, 3))), _init("b1", rng.normal(0, 0.1, 16)),
        _init("w2", rng.normal(0, 0.1, (32, 16, 3, 3))), _init("b2", rng.normal(0, 0.1, 32)),
        _init("fc_w", rng.normal(0, 0.3, (32, 10))), _init("fc_b", rng.normal(0, 0.1, 10)),
    ]
    conv = dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2])
    nodes = [
        helper.make_node("Conv", ["images", "w1", "b1"], ["c1"], **conv),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], **conv),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["gap"]),
        helper.make_node("Flatten", ["gap"], ["flat"], axis=1),
        helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=1),
    ]
    return helper.make_graph(
        nodes, "classifier",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["N", 3, 64, 64])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["N", 10])], inits)


def mlp(rng: np.random.Generator) -> onnx.GraphProto:
    """fc(256->512) -> relu -> fc(512->512) -> relu -> fc(512->10)."""
    dims = [256, 512, 512, 10]
    inits, nodes, x = [], [], "features"
    for i, (a, b) in enumerate(zip(dims, dims[1:])):
        inits += [_init(f"w{i}", rng.normal(0, 1 / np.sqrt(a), (a, b))), _init(f"b{i}", rng.normal(0, 0.05, b))]
        y = "logits" if i == len(dims) - 2 else f"h{i}"
        nodes.append(helper.make_node("Gemm", [x, f"w{i}", f"b{i}"], [y if y == "logits" else f"g{i}"]))
        if y != "logits":
            nodes.append(helper.make_node("Relu", [f"g{i}"], [y]))
        x = y
    return helper.make_graph(
        nodes, "mlp",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["N", 256])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])], inits)


def main(argv: list[str]) -> None:
    out = Path(argv[0]) if argv else Path(__file__).resolve().parent
    _save(classifier(np.random.default_rng(1)), out / "classifier" / "1" / "model.onnx")
    _save(mlp(np.random.default_rng(2)), out / "mlp" / "1" / "model.onnx")


if __name__ == "__main__":
    main(sys.argv[1:])
