"""`ctc`: greedy CTC decoding of a text recogniser's [N, T, classes] output with a character dictionary.

Class 0 is the blank; classes 1..len(dict) are the dictionary's lines; with
`space` (PP-OCR's convention) one more class after them is " ".
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from infermux.plugins.processors.base import ProcessorError, Sample, model_output, parse_config, read_lines


@dataclass(frozen=True)
class CtcConfig:
    """`dictionary`: one character a line; `space`: the class after the dictionary is a space."""

    dictionary: Path
    output: str | None = None
    space: bool = True


def ctc_greedy(probs: np.ndarray, characters: list[str], blank: int = 0) -> list[tuple[str, float]]:
    """(text, mean probability of the kept steps) per row of [N, T, classes]: best class per step,
    repeats collapsed, blanks dropped. An empty text scores 0."""
    best = probs.argmax(axis=2)
    best_p = probs.max(axis=2)
    keep = np.ones_like(best, dtype=bool)
    keep[:, 1:] = best[:, 1:] != best[:, :-1]
    keep &= best != blank
    out = []
    for row, p, k in zip(best, best_p, keep):
        text = "".join(characters[i] for i in row[k])
        out.append((text, float(p[k].mean()) if k.any() else 0.0))
    return out


class Ctc:
    """Sets `sample.texts` and, where rows match regions, each region's `text` and `text_score`."""

    kind = "ctc"

    def __init__(self, options: Mapping[str, Any], step: str = "ctc") -> None:
        self.step = step
        self.config = parse_config(step, CtcConfig, options)
        self.characters = ["<blank>", *read_lines(step, "dictionary", self.config.dictionary)]
        if self.config.space:
            self.characters.append(" ")

    def __call__(self, sample: Sample) -> None:
        probs = np.asarray(model_output(self.step, sample, self.config.output))
        if probs.ndim != 3 or probs.shape[2] != len(self.characters):
            raise ProcessorError(self.step, f"expects [N, T, {len(self.characters)}] (blank + dictionary"
                                 f"{' + space' if self.config.space else ''}), got {list(probs.shape)}")
        sample.texts = ctc_greedy(probs, self.characters)
        if len(sample.regions) == len(sample.texts):
            for region, (text, score) in zip(sample.regions, sample.texts):
                region.text, region.text_score = text, score
