"""The relay path layer by layer (issue 26): what each layer of an HTTP relay adds, side by side in one run.

Run: ``python benchmarks/proxy_layers.py [--quick] [--size BYTES]``.

Each target is a minimal ASGI app in its own process in front of ``proxy_bench.py``'s fake upstream (raw asyncio,
``TCP_NODELAY``), measured with its interleaved one-stream client (every target gets the same body back to back):

* ``server``: uvicorn answers the upstream's canned SSE bytes itself, body unread (accept, parse, respond);
* ``server+body``: the same after reading the whole request body;
* ``server(h11)+body`` / ``server(asyncio)+body``: the same on uvicorn's pure-Python parser / on asyncio's loop
  instead of httptools / uvloop;
* ``relay httpcore``: reads the body, sends it through an ``httpcore.AsyncConnectionPool`` and relays each chunk
  (the library under the proxy's transport);
* ``relay httpx``: the same through ``httpx.AsyncHTTPTransport`` (the proxy's transport, without its sharding);
* ``relay aiohttp``: the same through an ``aiohttp.ClientSession`` (its C parser), when aiohttp is installed;
* ``relay httpx-on-aiohttp``: the same through agentcache's ``AiohttpTransport`` (httpx's request and response
  objects over aiohttp, what the proxy uses): the cost of keeping httpx's interface;
* ``agentcache relay``: ``agentcache proxy`` on a relayed path (starlette, middleware, the sharded transport).

Figures: p50/p99 of the whole response (ms) and what each adds over ``direct``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from proxy_bench import _CHUNKS, Conversations, _free_port, _start, interleaved

_SSE = [(b"content-type", b"text/event-stream")]


async def _body(receive: Any) -> bytes:
    parts = []
    while True:
        message = await receive()
        parts.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(parts)


def _server_app(read: bool) -> Any:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if read:
            await _body(receive)
        await send({"type": "http.response.start", "status": 200, "headers": _SSE})
        for chunk in _CHUNKS:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    return app


def _relay_app(client: str, upstream: str) -> Any:
    state: dict[str, Any] = {}

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = await _body(receive)
        headers = [(k, v) for k, v in scope["headers"] if k not in (b"host", b"content-length")]
        url = upstream + scope["path"]
        await send({"type": "http.response.start", "status": 200, "headers": _SSE})
        async for chunk in _SENDERS[client](state, url, headers, body):
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    return app


async def _via_httpcore(state: dict[str, Any], url: str, headers: list[Any], body: bytes) -> Any:
    import httpcore

    if "pool" not in state:  # one pool per process (not ``setdefault``: that would build one per request)
        state["pool"] = httpcore.AsyncConnectionPool(max_connections=100)
    async with state["pool"].stream("POST", url, headers=headers, content=body) as response:
        async for chunk in response.aiter_stream():
            yield chunk


async def _via_httpx(state: dict[str, Any], url: str, headers: list[Any], body: bytes) -> Any:
    import httpx

    if "transport" not in state:
        state["transport"] = httpx.AsyncHTTPTransport()
    response = await state["transport"].handle_async_request(httpx.Request("POST", url, headers=headers, content=body))
    try:
        async for chunk in response.stream:  # type: ignore[union-attr]
            yield chunk
    finally:
        await response.aclose()


async def _via_aiohttp(state: dict[str, Any], url: str, headers: list[Any], body: bytes) -> Any:
    import aiohttp

    if "session" not in state:
        state["session"] = aiohttp.ClientSession(auto_decompress=False, skip_auto_headers=("User-Agent",))
    hdrs = [(k.decode(), v.decode()) for k, v in headers]
    async with state["session"].post(url, headers=hdrs, data=body) as response:
        async for chunk in response.content.iter_any():
            yield chunk


async def _via_agentcache(state: dict[str, Any], url: str, headers: list[Any], body: bytes) -> Any:
    import httpx

    from agentcache.proxy._aiotransport import AiohttpTransport
    from agentcache.proxy._transport import UpstreamClient

    if "client" not in state:
        state["client"] = UpstreamClient(AiohttpTransport(httpx.Limits(max_connections=100)), httpx.Timeout(60.0))
    client = state["client"]
    response = await client.send(client.build_request("POST", url, headers=headers, content=body))
    try:
        async for chunk in response.aiter_raw():
            yield chunk
    finally:
        await response.aclose()


_SENDERS = {
    "httpcore": _via_httpcore,
    "httpx": _via_httpx,
    "aiohttp": _via_aiohttp,
    "httpx-on-aiohttp": _via_agentcache,
}


def _serve(kind: str, port: int, upstream: str) -> None:
    import uvicorn

    http, loop = "httptools", "uvloop"
    if kind.startswith("server"):
        http = "h11" if "h11" in kind else "httptools"
        loop = "asyncio" if "asyncio" in kind else "uvloop"
        app = _server_app(read=kind != "server")
    else:
        app = _relay_app(kind.split()[-1], upstream)
    uvicorn.run(app, host="127.0.0.1", port=port, http=http, loop=loop, log_level="warning", access_log=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests (noisier)")
    parser.add_argument("--size", type=int, default=50_000, help="target request body bytes (first turn ~4 KB less)")
    parser.add_argument("--serve", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        _serve(args.serve[0], int(args.serve[1]), args.serve[2])
        return
    bench = str(Path(__file__).resolve().parent / "proxy_bench.py")
    up = _free_port()
    procs = [_start([sys.executable, bench, "--serve-upstream", str(up)], up)]
    upstream = f"http://127.0.0.1:{up}"
    kinds = ["server", "server+body", "server(h11)+body", "server(asyncio)+body", "relay httpcore", "relay httpx"]
    try:
        import aiohttp  # noqa: F401

        kinds += ["relay aiohttp", "relay httpx-on-aiohttp"]
    except ImportError:
        pass
    targets: dict[str, tuple[int, str]] = {"direct": (up, "/v1/messages")}
    try:
        for kind in kinds:
            port = _free_port()
            procs.append(_start([sys.executable, __file__, "--serve", kind, str(port), upstream], port))
            targets[kind] = (port, "/v1/messages")
        port = _free_port()
        argv = [sys.executable, "-m", "agentcache", "proxy", "--upstream", upstream, "--port", str(port)]
        procs.append(_start(argv, port))
        targets["agentcache relay"] = (port, "/relay/v1/messages")
        port = _free_port()  # the same on its httpcore transport
        argv = [sys.executable, "-m", "agentcache", "proxy", "--upstream", upstream, "--port", str(port)]
        procs.append(_start(argv, port, {"AGENTCACHE_PROXY_UPSTREAM_CLIENT": "httpx"}))
        targets["agentcache relay (httpx client)"] = (port, "/relay/v1/messages")
        convs = Conversations(args.size)
        res = asyncio.run(interleaved(targets, 100 if args.quick else 500, 10, convs))
        print(f"request body: {len(convs.session(0)[0]):,} bytes (first turn)\n")
        print("| layer | n | p50 | p99 | added p50 | added p99 |\n|---|---:|---:|---:|---:|---:|")
        d = res["direct"]["total"]
        for name, m in res.items():
            t = m["total"]
            print(f"| {name} | {m['n']} | {t['p50']:.3f} | {t['p99']:.3f} | {t['p50'] - d['p50']:.3f} | "
                  f"{t['p99'] - d['p99']:.3f} |")  # fmt: skip
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=20)


if __name__ == "__main__":
    main()
