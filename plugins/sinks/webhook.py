"""The `webhook` sink: an HTTP POST of each event's JSON; a 2xx answer acknowledges it.

Any other answer, a timeout or a refused connection leaves the event in the
spool, and the sink's thread tries again after a backoff that doubles up to
the sink's `max_retry_s` (daemon/sinks/hub.py).
"""

from __future__ import annotations

import http.client
import ssl
from typing import Any, Mapping
from urllib.parse import urlsplit

from infermux.plugins.sinks.base import OutEvent, SinkConfigError, SinkDown, bounded, known, option

KIND = "webhook"
OPTIONS = {"url", "timeout_s", "headers", "ca_file"}
MAX_ANSWER_BYTES = 64 << 10  # what is read of an answer's body, to keep the connection usable


class WebhookSink:
    """POSTs to `url` over one kept-alive connection, made again after an error."""

    @staticmethod
    def check(options: Mapping[str, Any]) -> None:
        known(KIND, options, OPTIONS)
        url = urlsplit(option(KIND, options, "url", str, ""))
        if url.scheme not in ("http", "https") or not url.hostname:
            raise SinkConfigError(KIND, f"option 'url' must be an http:// or https:// URL, got {options.get('url')!r}",
                                  "url")
        bounded(KIND, "timeout_s", option(KIND, options, "timeout_s", (int, float), 5.0), 0.05, 600)
        headers = option(KIND, options, "headers", dict, {})
        for name, value in headers.items():
            if not isinstance(value, str) or any(c in name + value for c in "\r\n\0"):
                raise SinkConfigError(KIND, f"header {name!r} must be a string on one line", "headers")
        option(KIND, options, "ca_file", str, "")

    @staticmethod
    def probe(options: Mapping[str, Any], timeout_s: float) -> str:
        """Open a connection to the endpoint (TLS checked for https://); no request is sent."""
        sink = WebhookSink("probe", {**options, "timeout_s": min(float(options.get("timeout_s", 5.0)), timeout_s)})
        try:
            sink._connection().connect()
        except (OSError, http.client.HTTPException) as exc:
            raise SinkDown(f"cannot connect to {sink.url.scheme}://{sink.url.netloc}: {type(exc).__name__}: {exc}") \
                from None
        finally:
            sink.close()
        return f"connected to {sink.url.scheme}://{sink.url.netloc}" + (" (TLS verified)" if sink.url.scheme == "https"
                                                                          else "")

    def __init__(self, name: str, options: Mapping[str, Any]) -> None:
        self.check(options)
        self.url = urlsplit(str(options["url"]))
        self.timeout_s = float(options.get("timeout_s", 5.0))
        self.headers = {"Content-Type": "application/json", **dict(options.get("headers", {}))}
        self.ca_file = str(options.get("ca_file", "")) or None
        self._conn: http.client.HTTPConnection | None = None

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            host, port = self.url.hostname or "", self.url.port
            if self.url.scheme == "https":
                context = ssl.create_default_context(cafile=self.ca_file)
                self._conn = http.client.HTTPSConnection(host, port, timeout=self.timeout_s, context=context)
            else:
                self._conn = http.client.HTTPConnection(host, port, timeout=self.timeout_s)
        return self._conn

    def deliver(self, events: list[OutEvent]) -> int:
        """POST each event in order; the count answered 2xx before the first that was not."""
        path = (self.url.path or "/") + (f"?{self.url.query}" if self.url.query else "")
        for done, event in enumerate(events):
            try:
                conn = self._connection()
                conn.request("POST", path, body=event.data, headers=self.headers)
                answer = conn.getresponse()
                answer.read(MAX_ANSWER_BYTES)
                status = answer.status
                if answer.will_close or not answer.isclosed():  # closing, or a body past what is read
                    self.close()
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                if done:
                    return done
                raise SinkDown(f"POST {self.url.geturl()}: {type(exc).__name__}: {exc}") from None
            if not 200 <= status < 300:
                if done:
                    return done
                raise SinkDown(f"POST {self.url.geturl()}: HTTP {status}")
        return len(events)

    def result(self, key: str, payload: bytes) -> None:
        """Per-frame results are not posted."""

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
