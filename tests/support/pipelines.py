"""Pipeline configurations the tests share."""

from __future__ import annotations

from pathlib import Path

# The sample classifier (engines/classifier/1), the model `camera_pipeline` steps into, from the tests'
# engine directory (tests/conftest.py's `engines`).
CLASSIFIER_MODEL = """
[[models]]
name = "classifier"
engine = "classifier/1/model.onnx"
"""


def camera_pipeline(name: str, classify: bool = False) -> str:
    """A camera's pipeline as the shipped frames examples use it: the newest frame of each stream wins, and
    a frame is decoded, stretched to 64 x 64, normalised and given to the sample `classifier` model
    (`classify`: then reduced to its class and score). Braces are doubled: the daemon configurations of
    the tests are `str.format` templates."""
    steps = ["processor = \"decode\"", "processor = \"resize\"\noptions = {{ mode = \"stretch\", size = [64, 64] }}",
             "processor = \"normalize\"", "model = \"classifier\"", *(["processor = \"classify\""] if classify else [])]
    return (f"[[pipelines]]\nname = \"{name}\"\nqueue_policy = \"newest_per_key\"\n"
            + "".join(f"[[pipelines.steps]]\n{step}\n" for step in steps))


def gated_pipeline(gate: Path, policy: str = "newest_per_key", **settings: object) -> str:
    """The sample classifier and a pipeline `cams` on it whose one worker thread holds each frame at the fake
    `gate_processor:Gate` until the file `gate` exists (a str.format template, as `camera_pipeline`)."""
    extra = "".join(f"{k} = {v}\n" for k, v in settings.items())
    return (CLASSIFIER_MODEL + f'[[pipelines]]\nname = "cams"\nworkers = 1\nqueue_policy = "{policy}"\n{extra}'
            f'[[pipelines.steps]]\nprocessor = "gate_processor:Gate"\noptions = {{{{ path = "{gate}" }}}}\n'
            '[[pipelines.steps]]\nprocessor = "decode"\n'
            '[[pipelines.steps]]\nprocessor = "resize"\noptions = {{ mode = "stretch", size = [64, 64] }}\n'
            '[[pipelines.steps]]\nprocessor = "normalize"\n'
            '[[pipelines.steps]]\nmodel = "classifier"\n'
            '[[pipelines.steps]]\nprocessor = "classify"\n')
