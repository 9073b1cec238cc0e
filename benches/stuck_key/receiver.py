#!/usr/bin/env python3
"""A webhook endpoint for benches/stuck_key/run.sh: answers 400 to every event of the stuck
key until the file named by --heal exists, 200 to the rest, and appends one line per
delivered request to --log: `<Ordo-Event-Id> <key> <n>`. Standard library only."""

import argparse
import json
import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--stuck", default="stuck")
    parser.add_argument("--heal", required=True)
    args = parser.parse_args()
    log = open(args.log, "a", buffering=1)

    class Handler(BaseHTTPRequestHandler):
        # Keep-alive: the relay's connections are reused, as a real endpoint's are.
        protocol_version = "HTTP/1.1"

        def answer(self, status):
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            payload = json.loads(body)
            key = payload.get("k")
            if key == args.stuck and not os.path.exists(args.heal):
                self.answer(400)
                return
            log.write(f"{self.headers.get('Ordo-Event-Id')} {key} {payload.get('n')}\n")
            self.answer(200)

        def log_message(self, *_):
            pass

    ThreadingHTTPServer(("127.0.0.1", args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
