"""Pipeline configurations the tests share."""

from __future__ import annotations


def camera_pipeline(name: str, classify: bool = False) -> str:
    """A camera's pipeline as the shipped frames examples use it: the newest frame of each stream wins, and
    a frame is decoded, stretched to 64 x 64, normalised and given to the sample `classifier` model
    (`classify`: then reduced to its class and score). Braces are doubled: the daemon configurations of
    the tests are `str.format` templates."""
    steps = ["processor = \"decode\"", "processor = \"resize\"\noptions = {{ mode = \"stretch\", size = [64, 64] }}",
             "processor = \"normalize\"", "model = \"classifier\"", *(["processor = \"classify\""] if classify else [])]
    return (f"[[pipelines]]\nname = \"{name}\"\nqueue_policy = \"newest_per_key\"\n"
            + "".join(f"[[pipelines.steps]]\n{step}\n" for step in steps))
