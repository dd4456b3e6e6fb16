"""A stand-in for musterd's REST on loopback, for tests of musterctl's
redirect handling: python3 tests/fake-rest.py PORT LOG (redirect URL | serve).
Every GET is logged to LOG as "PORT PATH auth=AUTHORIZATION"; with a URL it is
answered 307 to URL + path (a standby naming a leader), with "serve" 200 and
a leader's status. Runs until killed."""
import http.server
import json
import sys

port, log, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3]
target = sys.argv[4] if mode == "redirect" else ""


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        with open(log, "a") as f:
            f.write("%d %s auth=%s\n" % (port, self.path, self.headers.get("Authorization", "-")))
        if mode == "redirect":
            body = b'{"error": "not the leader"}'
            self.send_response(307)
            self.send_header("Location", target + self.path)
        else:
            body = json.dumps({"state": "running", "store": {"role": "leader"}}).encode()
            self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
