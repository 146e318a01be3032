"""A local OpenAI-compatible chat server that replays recorded replies, for testing the LLM coder
over real HTTP with the real `openai` client. Test-only: it never ships in the library.

Each POST to /v1/chat/completions answers the next recorded reply (a JSON file in `replies/`
holding a chat-completion response as an endpoint sent it) and keeps the request body, so a test
can check what the agent asked.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

REPLIES = Path(__file__).parent / "replies"


class ReplayServer:
    """Serves `replies` in order on 127.0.0.1 at a free port; `base_url` ends in /v1."""

    def __init__(self, replies: list[str]) -> None:
        self.replies = [json.loads((REPLIES / name).read_text()) for name in replies]
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path != "/v1/chat/completions" or not server.replies:
                    self._send(404, {"error": {"message": f"nothing recorded for {self.path}"}})
                    return
                server.requests.append(body)
                server.headers.append({k.lower(): v for k, v in self.headers.items()})
                reply = server.replies.pop(0)
                self._send(200, {**reply, "model": body.get("model", reply.get("model"))})

            def _send(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *_: Any) -> None:  # keep pytest's output clean
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def __enter__(self) -> ReplayServer:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
