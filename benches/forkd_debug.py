"""Helpers shared by the benchmark scripts (Python 3 standard library only)."""
import http.client
import json


def debug_streams(port):
    """GET /_debug/streams from the worker that answers (with workers = 1: the only one)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        c.request("GET", "/_debug/streams", headers={"Connection": "close"})
        return json.loads(c.getresponse().read())
    finally:
        c.close()
