"""Small HTTP client (stdlib only; the GPU image has requests/httpx too, but nothing is needed)."""

import json
import urllib.error
import urllib.request

def http_json(url, body=None, timeout=600.0):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read().decode())
    except urllib.error.HTTPError as e:
        detail = e.read().decode(errors="replace")[:2000]
        raise RuntimeError("HTTP %s from %s: %s" % (e.code, url, detail)) from None


def http_text(url, timeout=30.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode(errors="replace")
