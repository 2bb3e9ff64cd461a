"""experiments/pd_proxy.py against fake P and D upstreams on 127.0.0.1 (loopback only)."""

import asyncio
import json
import os
import sys
import time

import pytest

aiohttp = pytest.importorskip("aiohttp")
from aiohttp import web  # noqa: E402

EXP = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "experiments")
sys.path.insert(0, EXP)
import pd_proxy  # noqa: E402

P_KV = {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [3, 4, 5],
        "remote_engine_id": "engine-P", "remote_host": "localhost", "remote_port": 5600,
        "remote_request_id": "cmpl-abc", "tp_size": 1}
EXPECTED_P_PARAMS = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                     "remote_block_ids": None, "remote_host": None, "remote_port": None}


def test_rewrite_functions():
    body = {"model": "m", "prompt": "w5 w6", "max_tokens": 16, "stream": True,
            "stream_options": {"include_usage": True}, "min_tokens": 4, "temperature": 0}
    p = pd_proxy.prefill_request(body)
    assert p["max_tokens"] == 1 and p["stream"] is False
    assert "stream_options" not in p and "min_tokens" not in p
    assert p["kv_transfer_params"] == EXPECTED_P_PARAMS
    assert p["prompt"] == "w5 w6" and p["temperature"] == 0
    assert body["max_tokens"] == 16 and "kv_transfer_params" not in body  # original untouched
    d = pd_proxy.decode_request(body, {"kv_transfer_params": P_KV})
    assert d == dict(body, kv_transfer_params=P_KV)
    with pytest.raises(ValueError):
        pd_proxy.decode_request(body, {"choices": []})


def test_token_ids_to_d():
    """--token-ids-to-d: P is asked for its prompt ids, D gets them instead of the text; without them
    from P the proxy refuses rather than sending D something else."""
    body = {"model": "m", "prompt": "w5 w6", "max_tokens": 16}
    assert "return_token_ids" not in pd_proxy.prefill_request(body)
    assert pd_proxy.prefill_request(body, token_ids=True)["return_token_ids"] is True
    p_resp = {"kv_transfer_params": P_KV, "choices": [{"text": "w9", "prompt_token_ids": [7, 8], "token_ids": [9]}]}
    d = pd_proxy.decode_request(body, p_resp, token_ids=True)
    assert d == dict(body, prompt=[7, 8], kv_transfer_params=P_KV) and body["prompt"] == "w5 w6"
    assert pd_proxy.decode_request(body, p_resp)["prompt"] == "w5 w6"  # lever off: the text
    with pytest.raises(ValueError, match="no prompt_token_ids"):
        pd_proxy.decode_request(body, {"kv_transfer_params": P_KV, "choices": [{"text": "w9"}]}, token_ids=True)
    batch = dict(body, prompt=["w5", "w6"])  # not one string prompt: as it came
    assert pd_proxy.decode_request(batch, p_resp, token_ids=True)["prompt"] == ["w5", "w6"]


async def _serve(app):
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return runner, "http://127.0.0.1:%d" % port


def _upstream(name, seen, fail=False):
    async def completions(request):
        body = await request.json()
        seen.append((name, body, request.headers.get("X-Request-Id")))
        if fail:
            return web.json_response({"error": "boom"}, status=500)
        if name == "P":
            return web.json_response({"choices": [{"text": "w9"}], "kv_transfer_params": P_KV})
        if body.get("stream"):
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for i in range(3):
                await resp.write(b'data: {"choices": [{"text": " w%d"}]}\n\n' % (10 + i))
                await asyncio.sleep(0.01)
            await resp.write(b"data: [DONE]\n\n")
            return resp
        return web.json_response({"choices": [{"text": "w10 w11", "token_ids": [10, 11]}], "from": "D"})

    async def models(request):
        return web.json_response({"data": [{"id": "model-from-" + name}]})

    async def health(request):
        return web.Response(text="")

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    return app


def test_proxy_end_to_end_on_loopback():
    async def main():
        seen = []
        rp, p_url = await _serve(_upstream("P", seen))
        rd, d_url = await _serve(_upstream("D", seen))
        rx, x_url = await _serve(pd_proxy.make_app(p_url, d_url))
        try:
            async with aiohttp.ClientSession() as s:
                # non-streaming
                body = {"model": "m", "prompt": "w5 w6", "max_tokens": 8, "temperature": 0, "ignore_eos": True}
                async with s.post(x_url + "/v1/completions", json=body) as r:
                    assert r.status == 200
                    out = await r.json()
                assert out["from"] == "D" and out["choices"][0]["token_ids"] == [10, 11]
                (pn, pb, pid), (dn, db, did) = seen
                assert pn == "P" and dn == "D"
                assert pb["max_tokens"] == 1 and pb["stream"] is False
                assert pb["kv_transfer_params"] == EXPECTED_P_PARAMS
                assert db == dict(body, kv_transfer_params=P_KV)
                assert pid == did and pid  # one request id for both legs
                # streaming (what `vllm bench serve` does)
                seen.clear()
                sbody = dict(body, stream=True, stream_options={"include_usage": True})
                async with s.post(x_url + "/v1/completions", json=sbody) as r:
                    assert r.status == 200
                    assert r.headers["Content-Type"].startswith("text/event-stream")
                    raw = (await r.read()).decode()
                assert raw.count("data: ") == 4 and raw.rstrip().endswith("data: [DONE]")
                assert seen[0][1]["stream"] is False and "stream_options" not in seen[0][1]
                assert seen[1][1]["stream"] is True and seen[1][1]["stream_options"] == {"include_usage": True}
                # /v1/models comes from D, /health checks both
                async with s.get(x_url + "/v1/models") as r:
                    assert (await r.json())["data"][0]["id"] == "model-from-D"
                async with s.get(x_url + "/health") as r:
                    assert r.status == 200
                    h = await r.json()
                    assert h["prefill"] == 200 and h["decode"] == 200 and h["requests"] == 2
            await rd.cleanup()  # D goes away: health must say so
            async with aiohttp.ClientSession() as s:
                async with s.get(x_url + "/health") as r:
                    assert r.status == 503
        finally:
            await rx.cleanup()
            await rp.cleanup()
            await rd.cleanup()

    asyncio.run(main())


def test_proxy_passes_prefill_errors_through():
    async def main():
        seen = []
        rp, p_url = await _serve(_upstream("P", seen, fail=True))
        rd, d_url = await _serve(_upstream("D", seen))
        rx, x_url = await _serve(pd_proxy.make_app(p_url, d_url))
        try:
            async with aiohttp.ClientSession() as s:
                async with s.post(x_url + "/v1/completions", json={"prompt": "w2", "max_tokens": 2}) as r:
                    assert r.status == 500
                    assert "boom" in await r.text()
            assert [n for n, _, _ in seen] == ["P"]  # D never asked
        finally:
            await rx.cleanup()
            await rp.cleanup()
            await rd.cleanup()

    asyncio.run(main())


def test_proxy_timings_split_p_and_d():
    """/timings: P's answer and D's first streamed byte, per request, reset on request."""
    async def slow(name, delay, first_delay):
        async def completions(request):
            body = await request.json()
            await asyncio.sleep(delay)
            if name == "P":
                return web.json_response({"choices": [{"text": "w9"}], "kv_transfer_params": P_KV})
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            await resp.write(b'data: {"choices": [{"text": " w1"}]}\n\n')
            await asyncio.sleep(first_delay)  # later chunks do not count
            await resp.write(b"data: [DONE]\n\n")
            return resp
        app = web.Application()
        app.router.add_post("/v1/completions", completions)
        return app

    async def main():
        rp, p_url = await _serve(await slow("P", 0.15, 0))
        rd, d_url = await _serve(await slow("D", 0.05, 0.3))
        rx, x_url = await _serve(pd_proxy.make_app(p_url, d_url))
        try:
            async with aiohttp.ClientSession() as s:
                async with s.get(x_url + "/timings") as r:
                    assert (await r.json()) == {"n": 0, "prefill_ms_mean": None, "prefill_ms_median": None,
                                                "decode_first_ms_mean": None, "decode_first_ms_median": None}
                body = {"model": "m", "prompt": "w5", "max_tokens": 4, "stream": True}
                for _ in range(2):
                    async with s.post(x_url + "/v1/completions", json=body) as r:
                        assert r.status == 200
                        await r.read()
                async with s.get(x_url + "/timings?reset=1") as r:
                    t = await r.json()
                assert t["n"] == 2
                assert 150 <= t["prefill_ms_mean"] < 290, t
                assert 50 <= t["decode_first_ms_mean"] < 290, t  # the first chunk, not the 300 ms stream
                async with s.get(x_url + "/timings") as r:
                    assert (await r.json())["n"] == 0  # reset
        finally:
            await rx.cleanup()
            await rp.cleanup()
            await rd.cleanup()

    asyncio.run(main())


def test_proxy_trace_writes_wall_clock_times_per_request(tmp_path):
    """--trace: one line per answered request, its times in order and on the engines' clock
    (time.time()), the rid the proxy sent P and D as X-Request-Id (pdtools/handoff.py joins by it)."""
    trace = tmp_path / "proxy.jsonl"

    async def main():
        seen = []
        rp, p_url = await _serve(_upstream("P", seen))
        rd, d_url = await _serve(_upstream("D", seen))
        rx, x_url = await _serve(pd_proxy.make_app(p_url, d_url, trace=str(trace)))
        t0 = time.time()
        try:
            async with aiohttp.ClientSession() as s:
                for stream in (True, False):
                    body = {"model": "m", "prompt": "w5", "max_tokens": 4, "stream": stream}
                    async with s.post(x_url + "/v1/completions", json=body) as r:
                        assert r.status == 200
                        await r.read()
        finally:
            await rx.cleanup()
            await rp.cleanup()
            await rd.cleanup()
        return seen, t0, time.time()

    seen, t0, t1 = asyncio.run(main())
    lines = [json.loads(x) for x in trace.read_text().splitlines()]
    assert [x["stream"] for x in lines] == [True, False]
    keys = ("t_in", "t_p_sent", "t_p_answer", "t_d_sent", "t_d_first", "t_d_done")
    for x in lines:
        ts = [x[k] for k in keys]
        assert t0 <= ts[0] and ts[-1] <= t1 and ts == sorted(ts), x
        assert {h for _, _, h in seen if h == x["rid"]} == {x["rid"]}  # P and D got it as X-Request-Id
    assert sum(1 for _, _, h in seen if h == lines[0]["rid"]) == 2
