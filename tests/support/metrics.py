"""Reading the daemon's HTTP endpoint: Prometheus's exposition the strict way, and the health probes."""

from __future__ import annotations

import re
import urllib.error
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


def probe(port: int, path: str) -> tuple[int, str]:
    """Status and body of one GET of `path` (/healthz, /readyz): a 503 is an answer here, not an error."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
