"""A loopback double of the Prometheus HTTP API (`GET /api/v1/query`) for the answers a real
Prometheus cannot be made to give on demand: NaN values, an answer that never comes, 503s, chosen
sample times. Answers follow the API's shape (Prometheus docs, "HTTP API": `{"status":
"success", "data": {"resultType": "vector", "result": [{"metric": {...}, "value": [<unix time>,
"<value>"]}]}}`).
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

from support.kube_pods import send_json


def vector(samples: list[tuple[str, float, str]], label: str = "model_name") -> dict:
    """A vector answer of (`label` value, evaluation time, value text) samples: per LLM, or per
    workflow (`label="workflow"`, the entry's metrics)."""
    result = [{"metric": {label: name}, "value": [t, v]} for name, t, v in samples]
    return {"status": "success", "data": {"resultType": "vector", "result": result}}


class PrometheusDouble:
    """Answers each PromQL text from `answers[query]`, a list of (status, body) given in turn (the
    last repeats), else `default`; while `hang` is set no answer comes until `close`."""

    def __init__(self) -> None:
        self.answers: dict[str, list[tuple[int, dict]]] = {}
        self.default: tuple[int, dict] = (200, vector([]))
        self.asked: list[str] = []
        self.hang = threading.Event()
        self.release = threading.Event()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.closed = False
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        """Stop answering: afterwards the port refuses connections."""
        self.release.set()
        if not self.closed:
            self.closed = True
            self.server.shutdown()
            self.server.server_close()

    def _handler(self):
        double = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format, *args):
                pass

            def do_GET(self):
                query = parse_qs(urlparse(self.path).query)["query"][0]
                double.asked.append(query)
                if double.hang.is_set():
                    double.release.wait()
                    return
                turns = double.answers.get(query)
                code, body = (turns.pop(0) if len(turns) > 1 else turns[0]) if turns else double.default
                send_json(self, code, body)

        return Handler
