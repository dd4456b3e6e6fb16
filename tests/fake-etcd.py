"""A hostile stand-in for one etcd member's JSON gateway on loopback, for
tests of musterd's store: python3 tests/fake-etcd.py PORT LOG.
The leader key is held by someone else, with the value in $FAKE_LEADER_VALUE
(any bytes, as a Python escaped string); a campaign loses to it. The first
watch sends its "created" line, then one line that never ends (1 MiB chunks,
64 MiB at most); later watches send "created" and then nothing. LOG gets a
line per request ("PATH") and per watch ended ("watch sent N bytes")."""
import base64
import codecs
import http.server
import json
import os
import sys
import threading

port, log = int(sys.argv[1]), sys.argv[2]
value = codecs.decode(os.environ.get("FAKE_LEADER_VALUE", ""), "unicode_escape").encode("latin-1")
lock = threading.Lock()
watches = [0]


def note(text):
    with lock, open(log, "a") as f:
        f.write(text + "\n")


def kv(key):
    return {"key": key, "create_revision": "5", "mod_revision": "5", "version": "1", "lease": "9",
            "value": base64.b64encode(value).decode()}


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def answer(self, doc):
        body = json.dumps(doc).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
        note(self.path)
        head = {"header": {"revision": "10"}}
        if self.path == "/v3/lease/grant":
            self.answer(dict(head, ID="7", TTL="3"))
        elif self.path == "/v3/kv/txn":
            key = req["compare"][0]["key"]
            self.answer(dict(head, succeeded=False,
                             responses=[{"response_range": dict(head, kvs=[kv(key)], count="1")}]))
        elif self.path == "/v3/kv/range":
            self.answer(dict(head, kvs=[kv(req["key"])], count="1"))
        elif self.path == "/v3/watch":
            with lock:
                watches[0] += 1
                first = watches[0] == 1
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Connection", "close")
            self.end_headers()
            sent = 0
            try:
                created = json.dumps({"result": dict(head, created=True)}).encode() + b"\n"
                self.wfile.write(created)
                sent += len(created)
                chunk = b"x" * (1 << 20)
                while first and sent < (64 << 20):
                    self.wfile.write(chunk)
                    sent += len(chunk)
                if not first:
                    self.rfile.read(1)  # until musterd hangs up
            except (BrokenPipeError, ConnectionResetError):
                pass
            note("watch sent %d bytes" % sent)
            self.close_connection = True
        else:
            self.answer({})

    def log_message(self, *args):
        pass


http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
