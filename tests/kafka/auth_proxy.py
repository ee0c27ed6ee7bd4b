"""An HTTPS reverse proxy that demands HTTP basic auth, in front of a
schema registry: what a secured registry looks like to its clients.

    auth_proxy.py --port P --upstream http://127.0.0.1:R --cert leaf.pem
                  --key leaf.key --user U --password W

Prints `ready` once listening; then one line per request:
`<method> <path> <status>` (401 when the credentials are missing or wrong).
"""

import argparse
import base64
import ssl
import sys
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--user", required=True)
    parser.add_argument("--password", required=True)
    args = parser.parse_args()
    # print() writes the text and the newline separately: lines from two
    # request threads would interleave without the lock.
    output = threading.Lock()
    expected = "Basic " + base64.b64encode(f"{args.user}:{args.password}".encode()).decode()

    class Proxy(BaseHTTPRequestHandler):
        def relay(self):
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            if self.headers.get("Authorization") != expected:
                status, content = 401, b'{"error_code":401,"message":"Unauthorized"}'
            else:
                request = urllib.request.Request(
                    args.upstream + self.path, data=body, method=self.command,
                    headers={"Content-Type": self.headers.get("Content-Type", "application/json")},
                )
                try:
                    with urllib.request.urlopen(request) as response:
                        status, content = response.status, response.read()
                except urllib.error.HTTPError as e:
                    status, content = e.code, e.read()
            self.send_response(status)
            self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
            self.send_header("Content-Length", str(len(content)))
            self.end_headers()
            self.wfile.write(content)
            with output:
                sys.stdout.write(f"{self.command} {self.path} {status}\n")
                sys.stdout.flush()

        do_GET = do_POST = do_PUT = do_DELETE = relay

        def log_message(self, *_):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", args.port), Proxy)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(args.cert, args.key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    print("ready", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
