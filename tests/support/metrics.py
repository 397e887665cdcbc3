"""Reading the daemon's Prometheus endpoint the strict way."""

from __future__ import annotations

import re
import urllib.request

SAMPLE = re.compile(r'^([a-z_:][a-z0-9_:]*)(\{([a-z_]+="(?:[^"\\]|\\.)*",?)*\})? (-?[0-9.e+-]+|[+-]Inf|NaN)$')


def scrape(port: int) -> dict[str, float]:
    """Parse the exposition strictly: every line a comment or a valid sample."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    samples: dict[str, float] = {}
    families = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            families.add(line.split()[2])
            continue
        if line.startswith("#"):
            continue
        match = SAMPLE.match(line)
        assert match, f"not a valid sample line: {line!r}"
        samples[line.rsplit(" ", 1)[0]] = float(line.rsplit(" ", 1)[1])
    assert "infermux_inference_request_success_total" in families
    return samples
