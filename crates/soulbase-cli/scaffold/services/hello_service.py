#!/usr/bin/env python3
"""The example service behind skills/hello-http.yaml, made by `soulbase init`.

Soulbase's HTTP executor POSTs a call's arguments as a JSON object to /execute and
takes a 2xx answer of type application/json as the tool's result (429, 502, 503 and
504 are "unavailable, retry"; any other status or a body that is not JSON fails the
call). Python 3, standard library only:

    python3 services/hello_service.py        # listens on 127.0.0.1:@SERVICE_PORT@

HELLO_SERVICE_PORT overrides the port; the descriptor's endpoint and the net grant
in config.yaml name it too.
"""

import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT = int(os.environ.get("HELLO_SERVICE_PORT", "@SERVICE_PORT@"))
MAX_BODY = 64 * 1024


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        if self.path != "/execute":
            return self.answer(404, {"error": "no such route: POST /execute"})
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            return self.answer(413, {"error": "the arguments are too large"})
        try:
            args = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            return self.answer(400, {"error": "the body is not JSON"})
        name = args.get("name") if isinstance(args, dict) else None
        if not isinstance(name, str):
            return self.answer(400, {"error": "name (a string) is required"})
        self.answer(200, {"greeting": f"Hello, {name}!"})

    def do_GET(self):
        if self.path == "/healthz":
            return self.answer(200, {"ok": True})
        self.answer(404, {"error": "no such route"})

    def answer(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format, *args):
        sys.stderr.write("hello_service: " + (format % args) + "\n")


def main():
    server = ThreadingHTTPServer(("127.0.0.1", PORT), Handler)
    print(f"hello_service: listening on http://127.0.0.1:{PORT}/execute", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
