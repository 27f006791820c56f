"""Memory of receiving and decoding N concurrent ``/generate`` answers with R3, as the Proxy does.

An aiohttp server in a child process answers every ``POST /generate`` with one prebuilt SGLang body
(``--rows`` rows of base64 int32 routing, ``--output`` tokens with logprobs); this process sends
``--concurrency`` calls at once through :class:`SGLangClient` and decodes each answer into the
storage dtype (``decode_generate_response``, as ``ProxyCore.normalize``), keeping only the arrays.
It reports the peak of Python allocations (tracemalloc, numpy's included) and of the resident set
(``VmHWM``, reset before each round; ``MALLOC_MMAP_THRESHOLD_`` 128 KiB as in ``dressage bench memory``)
above the level before the round, the median of ``--rounds``.
Run it with the tree to measure on ``PYTHONPATH``::

    python benchmarks/r3_body_decode.py --concurrency 16 --rows 6000 --dtype uint8
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import gc
import inspect
import json
import multiprocessing as mp
import os
import socket
import statistics
import sys
import time
import tracemalloc

import numpy as np


def _body(rows: int, output: int, layers: int, topk: int, experts: int) -> bytes:
    rng = np.random.default_rng(0)
    ids = rng.integers(0, experts, size=(rows, layers, topk), dtype=np.int32)
    out = [int(t) for t in rng.integers(0, 150000, size=output)]
    meta = {"id": "x", "finish_reason": {"type": "stop"}, "prompt_tokens": rows + 1 - output,
            "completion_tokens": output, "weight_version": "0", "e2e_latency": 0.5,
            "output_token_logprobs": [[float(-0.01 * (i % 97)), t, None] for i, t in enumerate(out)],
            "routed_experts": base64.b64encode(ids.tobytes()).decode("ascii")}
    return json.dumps({"text": "word " * output, "output_ids": out, "meta_info": meta},
                      separators=(",", ":")).encode()


def _serve(port: int, body: bytes) -> None:
    from aiohttp import web

    async def generate(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=body, content_type="application/json")

    app = web.Application()
    app.router.add_post("/generate", generate)
    web.run_app(app, host="127.0.0.1", port=port, print=None, handle_signals=False)


def _status_kib(field: str) -> int:
    """A ``/proc/self/status`` memory line (``VmHWM``, ``VmRSS``) in KiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


async def _round(client, args, prompt_len: int, spec) -> tuple[float, float, float, list]:
    from dressage.fields.sglang import decode_generate_response

    held: list = []

    async def one(i: int) -> None:
        kw = {} if spec is None else {"routed_experts_spec": spec}
        body = await client.generate([1] * 4, {"max_new_tokens": 1}, return_routed_experts=True,
                                     routed_experts_start_len=0, rid=f"r{i}", **kw)
        out = decode_generate_response(body, prompt_len=prompt_len, num_layers=args.layers, topk=args.topk,
                                       want_routed_experts=True, routed_experts_dtype=args.dtype,
                                       num_experts=args.experts)
        held.append(out.routed_experts)  # as a recorded step holds it (a task's result outlives the round)

    gc.collect()  # the last round's tasks (and the arrays they hold as results) are cyclic garbage
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS
    rss0 = _status_kib("VmRSS")
    tracemalloc.reset_peak()
    base, _ = tracemalloc.get_traced_memory()
    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(args.concurrency)))
    wall = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    hwm = _status_kib("VmHWM")
    shapes = [a.shape for a in held]
    held.clear()
    return (peak - base) / 2**20, (hwm - rss0) / 1024, wall, shapes


async def _main(args, port: int) -> dict:
    from dressage.proxy.engines.sglang_client import SGLangClient

    spec = None
    if "routed_experts_spec" in inspect.signature(SGLangClient.generate).parameters:
        from dressage.fields.sglang import RoutedExpertsSpec
        spec = RoutedExpertsSpec(args.layers, args.topk, args.dtype, args.experts)
    client = SGLangClient(f"http://127.0.0.1:{port}", timeout=60)
    prompt_len = args.rows + 1 - args.output
    await _round(client, args, prompt_len, spec)  # warm-up: connections, imports
    tracemalloc.start()
    py, rss, wall = [], [], []
    for _ in range(args.rounds):
        p, r, w, shapes = await _round(client, args, prompt_len, spec)
        assert all(shape == (args.rows, args.layers, args.topk) for shape in shapes)
        py.append(p), rss.append(r), wall.append(w)
    tracemalloc.stop()
    await client.close()
    return {"streamed": spec is not None, "concurrency": args.concurrency, "rows": args.rows,
            "body_mib": round(len(_body(args.rows, args.output, args.layers, args.topk, args.experts)) / 2**20, 2),
            "tracemalloc_peak_mib": round(statistics.median(py), 1), "rss_peak_mib": round(statistics.median(rss), 1),
            "wall_ms": round(1000 * statistics.median(wall), 1), "rounds": args.rounds}


def main() -> None:
    if "MALLOC_MMAP_THRESHOLD_" not in os.environ:
        # As the memory bench's processes: large blocks are mapped, so a freed body leaves the RSS.
        os.environ["MALLOC_MMAP_THRESHOLD_"] = str(128 * 1024)
        os.execv(sys.executable, [sys.executable, *sys.argv])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--rows", type=int, default=6000)
    ap.add_argument("--output", type=int, default=1000)
    ap.add_argument("--layers", type=int, default=40)
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--experts", type=int, default=256)
    ap.add_argument("--dtype", default="uint8")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    body = _body(args.rows, args.output, args.layers, args.topk, args.experts)
    server = mp.get_context("spawn").Process(target=_serve, args=(port, body), daemon=True)
    server.start()
    del body
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
                break
            except OSError:
                time.sleep(0.1)
        print(json.dumps(asyncio.run(_main(args, port))))
    finally:
        server.terminate()
        server.join()


if __name__ == "__main__":
    main()
