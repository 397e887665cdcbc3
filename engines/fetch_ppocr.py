#!/usr/bin/env python3
"""Fetch PP-OCR's models for the OCR example pipeline (etc/infermux/examples/ocr.toml).

Takes the text detector, direction classifier and recogniser, and the
recogniser's character dictionary, out of the rapidocr-onnxruntime wheel
(from the installed package, or a wheel `pip download` fetches) into
engines/ppocr/ next to this script:

    python engines/fetch_ppocr.py          # then:
    infermux serve --config etc/infermux/examples/ocr.toml

The models are about 16 MB and are not committed (.gitignore).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
TARGET = HERE / "ppocr"
MODELS = {  # file in the wheel's models/ -> name in engines/ppocr/
    "ch_PP-OCRv4_det_infer.onnx": "det.onnx",
    "ch_ppocr_mobile_v2.0_cls_infer.onnx": "cls.onnx",
    "ch_PP-OCRv4_rec_infer.onnx": "rec.onnx",
}
CLS_LABELS = "0\n180\n"  # the direction classifier's two classes (rapidocr's label_list)


def installed_models() -> Path | None:
    """The models folder of an installed rapidocr-onnxruntime, found without importing it."""
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "models"
    return folder if all((folder / name).is_file() for name in MODELS) else None


def from_wheel(tmp: Path) -> Path:
    """Download the wheel (no dependencies) and unpack its models into `tmp`."""
    print("rapidocr-onnxruntime is not installed: downloading its wheel with pip ...", flush=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                    "-d", str(tmp), "rapidocr-onnxruntime"], check=True)
    wheel = next(tmp.glob("rapidocr_onnxruntime-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        for name in MODELS:
            member = f"rapidocr_onnxruntime/models/{name}"
            (tmp / name).write_bytes(archive.read(member))
    return tmp


def dictionary(rec: Path) -> str:
    """The recogniser's characters, one a line: stored in the model's metadata ("character")."""
    import onnx  # type: ignore[import-not-found]
    model = onnx.load(str(rec), load_external_data=False)
    for prop in model.metadata_props:
        if prop.key == "character":
            return prop.value if prop.value.endswith("\n") else prop.value + "\n"
    raise SystemExit(f"{rec} has no 'character' metadata; is it PP-OCR's recogniser?")


def dictionary_ort(rec: Path) -> str:
    """The same through onnxruntime, where the onnx package is not installed."""
    import onnxruntime as ort
    meta = ort.InferenceSession(str(rec), providers=["CPUExecutionProvider"]).get_modelmeta()
    text = meta.custom_metadata_map.get("character")
    if text is None:
        raise SystemExit(f"{rec} has no 'character' metadata; is it PP-OCR's recogniser?")
    return text if text.endswith("\n") else text + "\n"


def main(argv: list[str]) -> int:
    target = TARGET
    if argv[:1] == ["--into"] and len(argv) == 2:  # the tests fetch into a temporary folder
        target = Path(argv[1])
    elif argv:
        print("usage: python engines/fetch_ppocr.py [--into DIR]   (default: engines/ppocr/)", file=sys.stderr)
        return 2
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        source = installed_models()
        if source is None:
            try:
                source = from_wheel(Path(tmp))
            except (subprocess.CalledProcessError, StopIteration, KeyError) as exc:
                print(f"fetch_ppocr: cannot get the rapidocr-onnxruntime wheel ({exc}); install it with "
                      "`pip install --no-deps rapidocr-onnxruntime` and run this again", file=sys.stderr)
                return 1
        else:
            print(f"taking the models from the installed rapidocr-onnxruntime ({source})", flush=True)
        for name, renamed in MODELS.items():
            data = (source / name).read_bytes()
            (target / renamed).write_bytes(data)
            print(f"  {target / renamed}  {len(data) / 1e6:.1f} MB", flush=True)
        try:
            keys = dictionary(target / "rec.onnx")
        except ImportError:
            keys = dictionary_ort(target / "rec.onnx")
        (target / "keys.txt").write_text(keys, encoding="utf-8")
        (target / "cls_labels.txt").write_text(CLS_LABELS, encoding="utf-8")
        print(f"  {target / 'keys.txt'}  {keys.count(chr(10))} characters", flush=True)
    print("done: infermux serve --config etc/infermux/examples/ocr.toml", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
