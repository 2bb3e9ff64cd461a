#!/usr/bin/env python3
"""A minimal prefill/decode (P/D) proxy for vLLM's NixlConnector (OpenAI completions API).

For every request:
  1. send it to the prefill instance (P) with max_tokens=1, no streaming, and
     kv_transfer_params = {"do_remote_decode": true, "do_remote_prefill": false, rest null}:
     P computes the prompt's KV cache, keeps the blocks, and answers with the
     kv_transfer_params the decode side needs (remote engine id, block ids, host, port, ...);
  2. send the *original* request to the decode instance (D) with those kv_transfer_params:
     D reads the KV blocks from P over NIXL and generates; its answer (streamed or not)
     goes back to the client unchanged.

Also: GET /v1/models (passed through to D, so `vllm bench serve` can find the model),
GET /health (200 when both P and D answer /health), POST /v1/chat/completions (same flow).
--token-ids-to-d (a proxy-side handoff lever): P is asked for its prompt token ids
(``return_token_ids``) and D gets them as the prompt instead of the text, so D does not
tokenise the prompt again (completions with one string prompt; anything else goes as it came).
GET /timings: where each request's time went since the last reset (?reset=1 resets after
reading): P's answer (the whole one-token prefill request) and D's first byte (from sending
D the request to its first streamed chunk; its whole answer when not streamed), mean and
median in ms -- the split of the P/D TTFT that pd_bench.sh records per repetition.
--trace FILE: one JSON line per answered request with the wall-clock times (time.time(), the clock
the engines' handoff trace uses: experiments/negative_control/xlkv_handoff_trace.py) of: the
request's arrival (t_in), the request sent to P (t_p_sent), P's answer (t_p_answer), the request sent
to D (t_d_sent), D's first byte (t_d_first; a request not streamed: D's whole answer, as t_d_done) and
D's last (t_d_done); a request that failed writes no line; pdtools/handoff.py joins them
with the engines' lines by the X-Request-Id the proxy gives both (``rid``).

usage: pd_proxy.py --port 8000 --prefill http://127.0.0.1:8100 --decode http://127.0.0.1:8200
Needs aiohttp (in the GPU image).
"""

import argparse
import copy
import statistics
import itertools
import json
import logging
import sys
import time

import aiohttp
from aiohttp import web

log = logging.getLogger("pd_proxy")

PREFILL_KV_PARAMS = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}

# Fields that make no sense (or are rejected) for the one-token, non-streaming P request.
_DROP_FOR_PREFILL = ("stream_options", "min_tokens", "max_completion_tokens")


def prefill_request(body, token_ids=False):
    """The request P gets: same prompt and sampling, one token, no stream, remote decode (and,
    with ``token_ids``, P's prompt token ids in its answer)."""
    req = copy.deepcopy(body)
    if token_ids:
        req["return_token_ids"] = True
    req["max_tokens"] = 1
    req["stream"] = False
    for k in _DROP_FOR_PREFILL:
        req.pop(k, None)
    req["kv_transfer_params"] = dict(PREFILL_KV_PARAMS)
    return req


def prompt_token_ids(prefill_response):
    """P's prompt token ids (a completions answer to ``return_token_ids``), or None."""
    choices = (prefill_response or {}).get("choices") or []
    ids = choices[0].get("prompt_token_ids") if choices and isinstance(choices[0], dict) else None
    return ids if isinstance(ids, list) and ids and all(isinstance(i, int) for i in ids) else None


def decode_request(body, prefill_response, token_ids=False):
    """The request D gets: the original one plus P's kv_transfer_params; with ``token_ids``, a
    single string prompt replaced by P's prompt token ids (when P returned them)."""
    req = copy.deepcopy(body)
    params = (prefill_response or {}).get("kv_transfer_params")
    if not params:
        raise ValueError("prefill response carries no kv_transfer_params (is P running with NixlConnector?)")
    req["kv_transfer_params"] = params
    if token_ids and isinstance(body.get("prompt"), str):
        ids = prompt_token_ids(prefill_response)
        if ids is None:
            raise ValueError("--token-ids-to-d: P's answer has no prompt_token_ids (does this vLLM know "
                             "return_token_ids?); run the proxy without --token-ids-to-d")
        req["prompt"] = ids
    return req


def timing_summary(split):
    """Mean and median of P's answer and D's first byte (ms) over (p_ms, d_ms) pairs."""
    out = {"n": len(split)}
    for i, name in ((0, "prefill_ms"), (1, "decode_first_ms")):
        xs = [x[i] for x in split]
        out[name + "_mean"] = statistics.mean(xs) if xs else None
        out[name + "_median"] = statistics.median(xs) if xs else None
    return out


class Proxy:
    def __init__(self, prefill, decode, timeout_s, token_ids=False, trace=None):
        self.token_ids = token_ids
        self.trace_path, self.trace = trace, None
        self.prefill = prefill.rstrip("/")
        self.decode = decode.rstrip("/")
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.session = None
        self.ids = itertools.count()
        self.stats = {"requests": 0, "errors": 0}
        self.split = []  # (P's answer ms, D's first byte ms) per finished request since the reset

    #: seconds an idle connection to P or D is kept for reuse: under the servers' own keep-alive (uvicorn's
    #: default, vLLM's too, is 5 s).  aiohttp's default (15 s) reused a connection the server was closing
    #: just then: on 2026-11-27 (logs-2026-11-27e-2xH200-handoff-ab) one request failed with "Server
    #: disconnected", sent 5.0 s after the warm-up's last one
    KEEPALIVE_S = 2.0

    async def start(self, app):
        self.session = aiohttp.ClientSession(timeout=self.timeout,
                                             connector=aiohttp.TCPConnector(keepalive_timeout=self.KEEPALIVE_S))
        if self.trace_path:
            self.trace = open(self.trace_path, "a", buffering=1)

    async def stop(self, app):
        await self.session.close()
        if self.trace is not None:
            self.trace.close()

    def _headers(self, request, rid):
        h = {"Content-Type": "application/json", "X-Request-Id": rid}
        if "Authorization" in request.headers:
            h["Authorization"] = request.headers["Authorization"]
        return h

    async def handle(self, request):
        path = request.path  # /v1/completions or /v1/chat/completions
        try:
            body = await request.json()
        except json.JSONDecodeError:
            return web.json_response({"error": "request body is not JSON"}, status=400)
        self.stats["requests"] += 1
        w_in = time.time()
        rid = "pd-%d-%d" % (int(w_in * 1000), next(self.ids))
        headers = self._headers(request, rid)
        t0 = time.perf_counter()
        wall = {"rid": rid, "t_in": w_in, "stream": bool(body.get("stream"))}
        # 1. prefill on P
        ids = self.token_ids and path == "/v1/completions"
        wall["t_p_sent"] = time.time()
        async with self.session.post(self.prefill + path, json=prefill_request(body, ids), headers=headers) as r:
            text = await r.text()
            if r.status != 200:
                self.stats["errors"] += 1
                log.warning("prefill %s failed: %s %s", rid, r.status, text[:500])
                return web.Response(status=r.status, text=text, content_type="application/json")
            p_resp = json.loads(text)
        t1 = time.perf_counter()
        wall["t_p_answer"] = time.time()
        try:
            d_body = decode_request(body, p_resp, ids)
        except ValueError as e:
            self.stats["errors"] += 1
            return web.json_response({"error": str(e)}, status=502)
        # 2. decode on D; relay its answer (stream or not) unchanged
        wall["t_d_sent"] = time.time()
        async with self.session.post(self.decode + path, json=d_body, headers=headers) as r:
            if not body.get("stream"):
                text = await r.text()
                if r.status == 200:
                    self.split.append(((t1 - t0) * 1e3, (time.perf_counter() - t1) * 1e3))
                    wall["t_d_first"] = wall["t_d_done"] = time.time()
                    self._trace(wall)
                log.debug("%s prefill %.1f ms, total %.1f ms", rid, (t1 - t0) * 1e3, (time.perf_counter() - t0) * 1e3)
                return web.Response(status=r.status, text=text, content_type="application/json")
            resp = web.StreamResponse(status=r.status, headers={"Content-Type": r.headers.get(
                "Content-Type", "text/event-stream"), "Cache-Control": "no-cache"})
            await resp.prepare(request)
            t_first = None
            async for chunk in r.content.iter_any():
                if t_first is None:
                    t_first = time.perf_counter()
                    wall["t_d_first"] = time.time()
                await resp.write(chunk)
            await resp.write_eof()
            if r.status == 200 and t_first is not None:
                self.split.append(((t1 - t0) * 1e3, (t_first - t1) * 1e3))
                wall["t_d_done"] = time.time()
                self._trace(wall)
            return resp

    def _trace(self, wall):
        if self.trace is not None:
            self.trace.write(json.dumps(wall, sort_keys=True) + "\n")

    async def timings(self, request):
        out = timing_summary(self.split)
        if request.query.get("reset") in ("1", "true"):
            self.split = []
        return web.json_response(out)

    async def models(self, request):
        async with self.session.get(self.decode + "/v1/models") as r:
            return web.Response(status=r.status, text=await r.text(), content_type="application/json")

    async def health(self, request):
        out = {}
        for name, url in (("prefill", self.prefill), ("decode", self.decode)):
            try:
                async with self.session.get(url + "/health", timeout=aiohttp.ClientTimeout(total=5)) as r:
                    out[name] = r.status
            except Exception as e:  # connection refused, timeout
                out[name] = "%s" % type(e).__name__
        ok = all(v == 200 for v in out.values())
        out.update(self.stats)
        return web.json_response(out, status=200 if ok else 503)


def make_app(prefill, decode, timeout_s=3600, token_ids=False, trace=None):
    proxy = Proxy(prefill, decode, timeout_s, token_ids, trace)
    app = web.Application(client_max_size=256 * 2**20)
    app.on_startup.append(proxy.start)
    app.on_cleanup.append(proxy.stop)
    app.router.add_post("/v1/completions", proxy.handle)
    app.router.add_post("/v1/chat/completions", proxy.handle)
    app.router.add_get("/v1/models", proxy.models)
    app.router.add_get("/health", proxy.health)
    app.router.add_get("/timings", proxy.timings)
    return app


def main(argv=None):
    ap = argparse.ArgumentParser(description="P/D proxy for vLLM NixlConnector")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--prefill", required=True, help="base URL of P, e.g. http://127.0.0.1:8100")
    ap.add_argument("--decode", required=True, help="base URL of D, e.g. http://127.0.0.1:8200")
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--token-ids-to-d", action="store_true",
                    help="D gets P's prompt token ids instead of the prompt text (completions)")
    ap.add_argument("--trace", metavar="FILE", help="append one JSON line of wall-clock times per answered request")
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if a.verbose else logging.INFO,
                        format="%(asctime)s pd_proxy %(levelname)s %(message)s")
    log.info("proxy on %s:%d -> P %s, D %s%s", a.host, a.port, a.prefill, a.decode,
             " (D gets P's prompt token ids)" if a.token_ids_to_d else "")
    web.run_app(make_app(a.prefill, a.decode, a.timeout, a.token_ids_to_d, a.trace), host=a.host, port=a.port, access_log=None,
                print=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
