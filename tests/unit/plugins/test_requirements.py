"""A plugin's missing library is named with what installs it (plugins/requirements.py)."""

from __future__ import annotations

from infermux.plugins.requirements import MissingDependency, missing_dependency


def missing(module: str) -> MissingDependency | None:
    return missing_dependency(ModuleNotFoundError(f"No module named {module!r}", name=module), "backend 'x'")


def test_each_library_a_built_in_plugin_imports_names_its_extra_or_package() -> None:
    assert "pip install 'infermux[processors]'" in str(missing("cv2")) and "apt install python3-opencv" in str(
        missing("cv2"))
    assert "pip install 'infermux[onnx]'" in str(missing("onnxruntime"))
    assert "pip install 'infermux[tensorrt]'" in str(missing("cuda.bindings"))  # a submodule: its package
    assert "apt install python3-libnvinfer" in str(missing("tensorrt"))
    assert str(missing("cv2")).startswith("backend 'x' needs OpenCV, which is not installed here")


def test_a_library_nobody_documented_stays_an_import_error() -> None:
    assert missing("some_private_module") is None
    # Installed but broken is not "missing": its own message says more.
    assert missing_dependency(ImportError("cannot import name 'X' from 'cv2'", name="cv2"), "p") is None
