"""The fake Dynamo frontend: lists the model once a decode worker is registered in DYN_FILE_KV, logs "Prefill
worker detected" once a prefill worker is, refuses vLLM's extra completions fields (400, as Dynamo 1.6.1 does for
``return_token_ids``), sends each request to prefill (max_tokens 1, do_remote_decode) and then to decode with
prefill's kv_transfer_params, and counts its time to first token and route stage in /metrics."""
import argparse
import glob
import json
import os
import time

import aiohttp
from aiohttp import web

ap = argparse.ArgumentParser()
ap.add_argument("--http-host", default="127.0.0.1")
ap.add_argument("--http-port", type=int, required=True)
a = ap.parse_args()
disc = os.environ["DYN_FILE_KV"]
ttft = {"sum": 0.0, "count": 0}
said = set()


def workers():
    out = {}
    for path in glob.glob(os.path.join(disc, "*.json")):
        with open(path) as f:
            w = json.load(f)
        out[w["role"]] = w
        if w["role"] == "prefill" and "prefill" not in said:
            said.add("prefill")
            print("INFO fake dynamo.frontend: Prefill worker detected for %s" % w["model"], flush=True)
    return out


async def models(request):
    w = workers()
    data = [{"id": w["decode"]["model"], "object": "model"}] if "decode" in w else []
    return web.json_response({"object": "list", "data": data})


async def metrics(request):
    return web.Response(text="\n".join([
        'dynamo_frontend_time_to_first_token_seconds_sum{model="m"} %s' % ttft["sum"],
        'dynamo_frontend_time_to_first_token_seconds_count{model="m"} %s' % ttft["count"],
        'dynamo_frontend_stage_duration_seconds_sum{stage="route"} %s' % (ttft["count"] * 1e-4),
        'dynamo_frontend_stage_duration_seconds_count{stage="route"} %s' % ttft["count"], ""]))


async def completions(request):
    body = await request.json()
    bad = [k for k in ("return_token_ids", "return_tokens_as_token_ids") if k in body]
    if bad:
        return web.json_response({"error": json.dumps({"message": "Validation: Unsupported parameter(s): `%s`" % bad[0],
                                                       "code": 400})}, status=400)
    w = workers()
    t0 = time.perf_counter()
    async with aiohttp.ClientSession() as s:
        p_body = dict(body, max_tokens=1, stream=False, kv_transfer_params={"do_remote_decode": True})
        p_body.pop("stream_options", None)
        async with s.post(w["prefill"]["url"] + "/v1/completions", json=p_body) as r:
            kvp = (await r.json()).get("kv_transfer_params")
        d_body = dict(body, kv_transfer_params=kvp)
        async with s.post(w["decode"]["url"] + "/v1/completions", json=d_body) as r:
            if not body.get("stream"):
                out = await r.json()
                ttft["sum"] += time.perf_counter() - t0
                ttft["count"] += 1
                out.pop("kv_transfer_params", None)
                return web.json_response(out)
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            first = True
            async for chunk in r.content.iter_any():
                if first:
                    ttft["sum"] += time.perf_counter() - t0
                    ttft["count"] += 1
                    first = False
                await resp.write(chunk)
            await resp.write_eof()
            return resp


app = web.Application()
app.router.add_get("/v1/models", models)
app.router.add_get("/metrics", metrics)
app.router.add_post("/v1/completions", completions)
print("INFO fake dynamo.frontend on %s:%d, discovery %s" % (a.http_host, a.http_port, disc), flush=True)
web.run_app(app, host=a.http_host, port=a.http_port, print=None)
