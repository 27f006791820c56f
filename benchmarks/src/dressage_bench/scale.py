"""``dressage bench scale``: how the per-Step costs grow with the Step's size, against same-run floors.

For each R3 shape (layers x top-k), storage dtype and Step size T (tokens), it builds one SGLang
``/generate`` body (``T - 1`` rows of base64 int32 routing) and times, on this process's CPU clock:
the Proxy's decode of it (JSON parse, validation, decode into the storage dtype) against a bare base64
decode of the same routing string; and a trainer's restore of the stored array from an embedded
TransferQueue against a memcpy of the restored bytes, with the restore's peak of Python allocations
(tracemalloc, numpy's included) against those bytes. The StorageUnits curve writes Steps to 1-8 unit
processes over TCP and reads them back, against two bare TCP hops in the same run. Each measured path
and its floor take turns within every one of ``--rounds`` rounds, after an untimed warm-up; a figure is
the median over the rounds (the best beside it), and a bound is judged on the ratio of the medians, so
one busy spell of a shared machine moves neither. The JSON report names each bound and whether it is
met; ``--plot`` draws each curve.

The Step curve's Proxy-CPU column (:mod:`dressage_bench.scale_proxy_cpu`) times a whole chat call in a
``dressage proxy serve`` process in front of a stub engine (HTTP, JSON, decode, the Step, the TQ put)
against the same bare base64 decode.

The sessions curve (:mod:`dressage_bench.scale_sessions`) runs 16-1,024 concurrent agent sessions through
a Proxy process and the same agents straight to the engine, for the Proxy's own share of latency.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import json
import os
import platform
import time
import tracemalloc
from typing import Any, Callable

import numpy as np

from dressage_bench._link import LinkError, ShapedLoopback
from dressage_bench.scale_proxy_cpu import PROXY_CPU_BOUND, prompt_for, run_proxy_cpu_curve
from dressage_bench.scale_sessions import VARIANTS, SessionsConfig, plot_sessions, run_sessions_curve

__all__ = ["register", "run_step_curve", "run_units_curve", "BOUNDS"]

# The bounds the curve is held to (ratios to the same-run floor).
BOUNDS = {"proxy_decode_vs_b64": 1.5, "restore_vs_memcpy": 1.5, "restore_peak_vs_bytes": 1.1}
SHAPES = {"40x8": (40, 8), "78x8": (78, 8)}
EXPERTS = 256
OUTPUT_TOKENS = 16


def _body(tokens: int, layers: int, topk: int) -> tuple[bytes, slice]:
    """One ``/generate`` body and where its routing string sits in it: the body is built as one bytes
    object (a 256K-token 78-layer body is 874 MB; no str, dict or second copy of it is kept)."""
    rng = np.random.default_rng(tokens)
    rows = rng.integers(0, EXPERTS, size=(tokens - 1, layers, topk), dtype=np.int32)
    routing = base64.b64encode(memoryview(rows).cast("B"))
    del rows
    out = [int(t) for t in rng.integers(0, 150_000, size=OUTPUT_TOKENS)]
    meta = {"id": "x", "finish_reason": {"type": "stop"}, "prompt_tokens": tokens - OUTPUT_TOKENS,
            "completion_tokens": OUTPUT_TOKENS, "weight_version": "0",
            "output_token_logprobs": [[-0.01 * (i % 97), t, None] for i, t in enumerate(out)],
            "routed_experts": "@"}
    head, tail = json.dumps({"text": "", "output_ids": out, "meta_info": meta},
                            separators=(",", ":")).encode().split(b'"@"')
    at = len(head) + 1
    body = b"".join((head, b'"', routing, b'"', tail))
    return body, slice(at, at + len(routing))


def _interleaved(fns: dict[str, Callable[[], Any]], rounds: int) -> dict[str, list[float]]:
    """Each function's CPU seconds per call over ``rounds`` rounds, the functions taking turns within a
    round (in an order that alternates between rounds), so a busy spell of this shared machine lands on
    all of them alike. One untimed call each comes first (pages written, caches and pools filled) and
    sets how many calls a round times: enough for ~2 ms, so a 30 us memcpy is not one clock reading."""
    calls: dict[str, int] = {}
    for name, fn in fns.items():
        t0 = time.process_time()
        fn()
        calls[name] = max(1, min(1000, int(2e-3 / max(time.process_time() - t0, 1e-6))))
    times: dict[str, list[float]] = {name: [] for name in fns}
    order = list(fns)
    for r in range(rounds):
        for name in (order if r % 2 == 0 else order[::-1]):
            fn, n = fns[name], calls[name]
            t0 = time.process_time()
            for _ in range(n):
                fn()
            times[name].append(max((time.process_time() - t0) / n, 1e-9))
    return times


def _stats(prefix: str, values: list[float]) -> dict[str, float]:
    return {f"{prefix}_s": float(np.median(values)), f"{prefix}_best_s": min(values)}


def _step_point(tq: Any, tokens: int, layers: int, topk: int, dtype: str, rounds: int) -> dict[str, Any]:
    """One point: medians and bests of interleaved rounds (CPU clock), ratios of the medians judged."""
    import gc

    from dressage.fields.sglang import decode_generate_response
    from dressage.tq.transport.bulk import shared_pool

    body, at = _body(tokens, layers, topk)
    raw = memoryview(body)[at]  # the routing string as it sits in the received body

    def bare() -> Any:
        return np.frombuffer(binascii.a2b_base64(raw), dtype=np.int32)

    def proxy() -> Any:
        return decode_generate_response(json.loads(body), prompt_len=tokens - OUTPUT_TOKENS, num_layers=layers,
                                        topk=topk, want_routed_experts=True, routed_experts_dtype=dtype,
                                        num_experts=EXPERTS)

    decode = _interleaved({"b64_decode": bare, "proxy_decode": proxy}, rounds)
    stored = proxy().routed_experts
    body_bytes = len(body)
    del raw, body  # the body is not needed past the decode: a 256K-token point frees ~0.9 GB here
    gc.collect()
    client = tq.client()
    try:
        ref = client.put("routed_experts", stored)
        # The first restore's allocation peak: what a restore needs on top of what the process held, with
        # no idle receive-pool buffer to land in (one freed by an earlier point of the same size class would
        # make the restore allocate nothing, and the figure depend on the order of the points).
        shared_pool().drop_idle()
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            got = client.get_many([ref], copy=True)[0]
            peak = tracemalloc.get_traced_memory()[1] - base
        finally:
            tracemalloc.stop()
        assert np.array_equal(got, stored)
        del got
        target = np.empty_like(stored)
        copy = _interleaved({"memcpy": lambda: np.copyto(target, stored),
                             "restore": lambda: client.get_many([ref], copy=True)}, rounds)
        del target
        client.delete([ref])
    finally:
        client.close()
    point = {"tokens": tokens, "layers": layers, "topk": topk, "dtype": dtype, "body_bytes": body_bytes,
             "stored_bytes": int(stored.nbytes), "rounds": rounds}
    for name, values in (*decode.items(), *copy.items()):
        point.update(_stats(name, values))
    point.update({"restore_peak_bytes": int(peak),
                  "proxy_decode_vs_b64": point["proxy_decode_s"] / point["b64_decode_s"],
                  "proxy_decode_vs_b64_best": point["proxy_decode_best_s"] / point["b64_decode_best_s"],
                  "restore_vs_memcpy": point["restore_s"] / point["memcpy_s"],
                  "restore_vs_memcpy_best": point["restore_best_s"] / point["memcpy_best_s"],
                  "restore_peak_vs_bytes": peak / max(stored.nbytes, 1)})
    return point


def run_step_curve(sizes: list[int], shapes: list[str], dtypes: list[str], rounds: int,
                   proxy_cpu_sizes: list[int] | None = None) -> dict[str, Any]:
    """The Step-size curve: one point per shape, dtype and size; each bound checked on every point.
    ``proxy_cpu_sizes``: the sizes of its Proxy-CPU column (none: not measured)."""
    from dressage.tq import TransferQueue

    budget = 8 << 30
    points = []
    with TransferQueue.start({"deployment": "embedded", "num_storage_units": 1, "unit_memory_budget": budget,
                              "retention_s": None}) as tq:
        for shape in shapes:
            layers, topk = SHAPES[shape]
            for dtype in dtypes:
                for tokens in sizes:
                    points.append(_step_point(tq, tokens, layers, topk, dtype, rounds))
    worst = {name: max(p[name] for p in points) for name in BOUNDS}
    # The decode bound is stated for int32 Steps; the uint8 points are reported beside it.
    int32 = [p["proxy_decode_vs_b64"] for p in points if p["dtype"] == "int32"]
    if int32:
        worst["proxy_decode_vs_b64"] = max(int32)
    bounds = {name: {"limit": lim, "worst": worst[name], "met": worst[name] <= lim} for name, lim in BOUNDS.items()}
    out: dict[str, Any] = {"points": points, "bounds": bounds}
    if proxy_cpu_sizes:
        column = run_proxy_cpu_curve(proxy_cpu_sizes, {s: SHAPES[s] for s in shapes}, dtypes, rounds)
        out["proxy_cpu_points"] = column["points"]
        bounds["proxy_cpu_vs_b64"] = column["bound"]
    return out


UNIT_MODES = ("batched", "per_step")
"""How the units curve writes its Steps (see :func:`_units_point`); the bound is judged on ``batched``."""


def _batcher_groups(count: int, step_bytes: int, max_items: int, max_bytes: int) -> list[int]:
    """The put rounds a :class:`~dressage.tq.client.batching.PutBatcher` forms from ``count`` waiting
    Steps of ``step_bytes`` each: as many as fit ``max_items`` and ``max_bytes`` (at least one) per round."""
    per = max(1, min(max_items, max_bytes // max(step_bytes, 1)))
    return [min(per, count - at) for at in range(0, count, per)]


def _landed(a: np.ndarray) -> np.ndarray:
    from dressage.tq.transport.landing import landing

    out = landing(a.nbytes).view(a.dtype).reshape(a.shape)
    np.copyto(out, a)
    return out


def _units_point(units: int, steps: int, rounds: int, part_shape: tuple[int, ...]) -> dict[str, Any]:
    """``steps`` Step writes of one R3 field to a ``local`` deployment of ``units`` StorageUnit processes
    (shared memory off: every payload crosses TCP, as from another host, and is authenticated, as across
    hosts it must be), read back in one batch, against the same bytes over two bare TCP hops to a second
    process (``tcp-loopback``). Two ways of writing, each against a floor sending the same requests:

    - ``batched``: the Steps go through a :class:`PutBatcher`, the Proxy's TQ writer, all of them
      waiting at once (as under load, when Steps finish faster than one put round takes), so it sends
      them in rounds of up to its ``max_bytes`` / ``max_items``; the floor sends the same rounds, one
      acknowledged request each. The bound is judged on this mode.
    - ``per_step``: each Step its own put, from a thread pool (a Proxy with one Step in flight at a
      time); the floor acknowledges each Step.

    On get one request for the whole batch on the floor, one ``get_many`` in TQ. A second deployment
    with authentication off runs beside the authenticated one, to show what the MAC costs. All take
    turns within each round (the order rotating between rounds) after untimed rounds until every unit took a
    put (``warmup_rounds``; ``units_warmed`` counts the units they wrote); medians
    and bests of wall time."""
    from concurrent.futures import ThreadPoolExecutor
    from contextlib import ExitStack

    from dressage.tq import TransferQueue, TransferQueueClient
    from dressage.tq.client.batching import PutBatcher
    from dressage.tq.config import tq_default
    from dressage.units import parse_bytes
    from dressage_bench._systems import Part, Workload, make_items
    from dressage_bench._tcp import TcpLoopbackSystem

    part = Part("routed_experts", "uint8", part_shape)
    workload = Workload("scale-units", "small", (part,), count=steps)
    # Distinct Steps, the floor's very bytes, placed in their pages as TQ places its own buffers: a fresh
    # numpy array of this size starts 16 bytes into a page, and on this CPU every send from one is
    # slower (the floor's the most; see ``tq/transport/landing.py``), which would make the first point
    # of a run differ from the rest.
    payloads = [_landed(item[0]) for item in make_items(workload, units)]
    step_bytes = int(payloads[0].nbytes)
    used: set[str] = set()
    # The budget a deployment has by default, as users run it (nothing is allocated up front; it sizes
    # the placement leases and the units' pools of recycled buffers), or more if the rounds need it.
    budget = max(parse_bytes(tq_default("unit_memory_budget"), "unit_memory_budget"), 4 * steps * step_bytes)
    systems = ("tq", "tq_unauthenticated", "tcp")
    times: dict[tuple[str, str], list[float]] = {(m, n): [] for m in UNIT_MODES for n in systems}
    tq_rounds: list[int] = []
    tcp = TcpLoopbackSystem(units, batched_get=True)
    tcp.start()
    try:
        tcp.prepare(workload, payloads)
        with ExitStack() as stack:
            clients, batchers = {}, {}
            for name, auth in (("tq", True), ("tq_unauthenticated", False)):
                tq = stack.enter_context(TransferQueue.start({
                    "deployment": "local", "num_storage_units": units, "shared_memory": False,
                    "unit_memory_budget": budget, "retention_s": None, "authenticate": auth}))
                clients[name] = TransferQueueClient.connect(tq.client_spec())
                stack.callback(clients[name].close)
                batchers[name] = PutBatcher(clients[name], name=f"scale-{name}")
                stack.callback(batchers[name].close)
            pool = stack.enter_context(ThreadPoolExecutor(max(2, units)))
            some = next(iter(batchers.values()))
            groups = _batcher_groups(steps, step_bytes, some.max_items, some.max_bytes)

            def put_each(name: str, r: int) -> list[Any]:
                client = clients[name]
                return list(pool.map(lambda a: client.put("routed_experts", a, batch=f"r{r}"), payloads))

            def put_batched(name: str, r: int) -> list[Any]:
                batcher = batchers[name]
                before = batcher.rounds
                futures = [batcher.submit([("routed_experts", a)], keys=[f"{name}-{r}-{i}"], batch=f"r{r}")
                           for i, a in enumerate(payloads)]
                refs = [f.result()[0] for f in futures]
                tq_rounds.append(batcher.rounds - before)
                return refs

            def tq_round(mode: str, name: str, r: int) -> float:
                client = clients[name]
                t0 = time.perf_counter()
                refs = put_batched(name, r) if mode == "batched" else put_each(name, r)
                got = client.get_many(refs)
                took = time.perf_counter() - t0
                assert len(got) == steps and np.array_equal(got[-1], payloads[-1])
                del got  # its receive buffers go back to the pool, as the floor's stay written
                used.update(ref.unit_id for ref in refs)
                client.clear(f"r{r}")
                return took

            def one(mode: str, name: str, r: int) -> float:
                if name == "tcp":
                    return tcp.run_round(workload, groups if mode == "batched" else None).roundtrip_s
                return tq_round(mode, name, r)

            order = list(times)
            # Untimed rounds first, until every unit took a put (a round's puts go to as many units as it has
            # put rounds, the next round's to the next ones): as the floor's far end writes its buffers before
            # any timed round, so a long-running unit has its connection and its recycled buffers, and
            # no timed round is a unit's first (a fresh unit's first put lands in pages never touched).
            warm = -(-units // len(groups))
            for w in range(warm):
                for i, (mode, name) in enumerate(order):
                    one(mode, name, -1 - w * len(order) - i)
            warmed = len(used)
            tq_rounds.clear()
            for r in range(rounds):
                shift = r % len(order)
                for mode, name in order[shift:] + order[:shift]:
                    times[mode, name].append(one(mode, name, r))
        tcp.finish(workload)
    finally:
        tcp.close()
    moved = steps * step_bytes
    point: dict[str, Any] = {"units": units, "steps": steps, "step_bytes": step_bytes, "units_written": len(used),
                             "warmup_rounds": warm, "units_warmed": warmed,
                             "rounds": rounds, "batch_groups": groups,
                             "tq_put_rounds": float(np.median(tq_rounds)) if tq_rounds else 0.0}
    for mode in UNIT_MODES:
        med = {name: float(np.median(times[mode, name])) for name in systems}
        best = {name: min(times[mode, name]) for name in systems}
        point[mode] = {
            "tq_s": med["tq"], "tcp_two_hops_s": med["tcp"], "tq_best_s": best["tq"], "tcp_best_s": best["tcp"],
            "tq_unauthenticated_s": med["tq_unauthenticated"],
            "tq_gbps": 2 * moved / med["tq"] / 1e9, "tcp_gbps": 2 * moved / med["tcp"] / 1e9,
            "tq_unauthenticated_gbps": 2 * moved / med["tq_unauthenticated"] / 1e9,
            "tq_vs_tcp": med["tcp"] / med["tq"], "tq_vs_tcp_best": best["tcp"] / best["tq"],
            "tq_unauthenticated_vs_tcp": med["tcp"] / med["tq_unauthenticated"],
            "rounds_s": {name: times[mode, name] for name in systems}}
    return point


def run_units_curve(units: list[int], steps: int, rounds: int, part_shape: tuple[int, ...] = (4096, 40, 8), *,
                    link_gbit: float | None = None) -> dict[str, Any]:
    """The StorageUnits curve: TQ put+get across processes over TCP against two bare TCP hops sending
    the same requests. The bound is judged on the ratio of the medians of the ``batched`` mode (the
    Proxy's writer under load); the ``per_step`` mode's worst is reported beside it. ``link_gbit``: both
    cross a loopback link shaped to that rate (:class:`~dressage_bench._link.ShapedLoopback`), as between
    hosts, where the link sets the pace; without it loopback runs at the speed of this host's cores."""
    from contextlib import nullcontext

    link = ShapedLoopback(link_gbit) if link_gbit is not None else None
    with link if link is not None else nullcontext():
        points = [_units_point(n, steps, rounds, part_shape) for n in units]
    if link is not None:  # how close the floor runs to the link's rate: at it, the link sets the pace
        for p in points:
            for mode in UNIT_MODES:
                p[mode]["tcp_vs_link"] = p[mode]["tcp_gbps"] / (link.rate_gbit / 8)
    worst = min(p["batched"]["tq_vs_tcp"] for p in points)
    per_step = min(p["per_step"]["tq_vs_tcp"] for p in points)
    return {"points": points, "link": link.describe() if link is not None else None,
            "bounds": {"tq_vs_two_tcp_hops": {"limit": 0.8, "worst": worst, "met": worst >= 0.8, "mode": "batched",
                                              "per_step_worst": per_step}}}


def _plot(curve: dict[str, Any], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3 if curve.get("proxy_cpu_points") else 2,
                             figsize=(16 if curve.get("proxy_cpu_points") else 11, 4))
    series: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for p in curve["points"]:
        series.setdefault((p["layers"], p["dtype"]), []).append(p)
    for (layers, dtype), pts in sorted(series.items()):
        t = [p["tokens"] for p in pts]
        axes[0].plot(t, [p["proxy_decode_vs_b64"] for p in pts], marker="o", label=f"{layers} layers, {dtype}")
        axes[1].plot(t, [p["restore_vs_memcpy"] for p in pts], marker="o", label=f"{layers} layers, {dtype}")
    for ax, name, title in ((axes[0], "proxy_decode_vs_b64", "Proxy decode / bare base64 decode (CPU)"),
                            (axes[1], "restore_vs_memcpy", "restore / memcpy (CPU)")):
        ax.axhline(BOUNDS[name], color="grey", linestyle="--", label=f"bound {BOUNDS[name]}x")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("Step size (tokens)")
        ax.set_title(title)
        ax.legend(fontsize=7)
    if curve.get("proxy_cpu_points"):
        ax = axes[2]
        series = {}
        for p in curve["proxy_cpu_points"]:
            series.setdefault((p["layers"], p["dtype"]), []).append(p)
        for (layers, dtype), pts in sorted(series.items()):
            ax.plot([p["tokens"] for p in pts], [p["proxy_cpu_vs_b64"] for p in pts], marker="o",
                    label=f"{layers} layers, {dtype}")
        ax.axhline(PROXY_CPU_BOUND, color="grey", linestyle="--", label=f"bound {PROXY_CPU_BOUND}x (int32)")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("Step size (tokens)")
        ax.set_title("Proxy process CPU per call / bare base64 decode")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _plot_units(curve: dict[str, Any], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = curve["points"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    n = [p["units"] for p in pts]
    for mode, style, what in (("batched", "-", "batched as the Proxy writes"),
                              ("per_step", ":", "one put per Step")):
        ax.plot(n, [p[mode]["tq_gbps"] for p in pts], marker="o", linestyle=style, color="C0",
                label=f"TQ (TCP, authenticated), {what}")
        ax.plot(n, [p[mode]["tq_unauthenticated_gbps"] for p in pts], marker="^", linestyle=style, color="C1",
                label=f"TQ, authentication off, {what}")
        ax.plot(n, [p[mode]["tcp_gbps"] for p in pts], marker="s", linestyle=style, color="C2",
                label=f"two bare TCP hops, same requests, {what}")
    ax.set_xlabel("StorageUnits")
    ax.set_ylabel("GB/s (put + get)")
    ax.set_title("StorageUnits curve")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def curve_plot_path(path: str, curve: str) -> str:
    """Where ``--plot FILE`` puts another curve's plot: beside FILE, ``-<curve>`` before its suffix."""
    root, ext = os.path.splitext(path)
    return f"{root}-{curve}{ext or '.png'}"


def register(benches: argparse._SubParsersAction) -> None:
    p = benches.add_parser(
        "scale", help="per-Step costs against their same-run floors as the Step grows",
        description=("The Step-size curve: the Proxy's decode of a /generate body against a bare base64 "
                     "decode, and a trainer's restore against a memcpy (CPU time, median of --rounds interleaved rounds; the "
                     "restore's peak against the restored bytes), for the 40- and 78-layer top-8 shapes "
                     "and both storage dtypes; its Proxy-CPU column: a whole chat call's CPU in a Proxy process "
                     "against the same bare decode. --json writes every point and whether each bound is met."))
    p.add_argument("--json", metavar="FILE", help="write the report")
    p.add_argument("--plot", metavar="FILE",
                   help="draw the Step-size curve into this PNG, the units and sessions curves beside it "
                        "(FILE-units.png, FILE-sessions.png)")
    p.add_argument("--quick", action="store_true", help="1K and 4K tokens, 2 rounds: for CI")
    p.add_argument("--sizes", nargs="+", type=int, metavar="TOKENS",
                   help="Step sizes (default 1024 4096 16384 65536 262144; quick: 1024 4096)")
    p.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=sorted(SHAPES), metavar="SHAPE",
                   help="R3 shapes, layers x top-k (default: %(default)s)")
    p.add_argument("--dtypes", nargs="+", choices=("int32", "uint8"), default=["int32", "uint8"], metavar="DTYPE",
                   help="R3 storage dtypes (default: %(default)s)")
    p.add_argument("--proxy-cpu-sizes", nargs="*", type=int, metavar="TOKENS",
                   help="Step sizes of the Proxy-CPU column: a whole chat call's CPU in a Proxy process against "
                        "a bare base64 decode (default: the --sizes; quick: 1024; none: skip it)")
    p.add_argument("--rounds", type=int, metavar="N", help="timed rounds per point (default 5; quick: 2)")
    p.add_argument("--units", nargs="*", type=int, metavar="N",
                   help="StorageUnit counts of the units curve (default 1 2 4 8; quick: 1 2; none: skip it)")
    p.add_argument("--unit-steps", type=int, metavar="N",
                   help="Step writes (4K tokens of 40x8 uint8 R3, 1.25 MiB) per round of the units curve "
                        "(default 64; quick: 8)")
    p.add_argument("--link-gbit", type=float, metavar="GBIT",
                   help="run the units curve over a loopback link shaped to this rate (tc tbf on lo, for the "
                        "curve's duration; needs root): the link, not this host's cores, sets the pace, as "
                        "between hosts (default: unshaped loopback)")
    p.add_argument("--sessions", nargs="*", type=int, metavar="N",
                   help="concurrent agent sessions of the sessions curve (default 16 64 256 1024; quick: 16 64; "
                        "none: skip it)")
    p.add_argument("--session-turns", type=int, metavar="N", help="chat calls per session (default 3; quick: 2)")
    p.add_argument("--session-service-s", type=float, metavar="S",
                   help="the stub engine's time per call (default 8.0; quick: 0.2)")
    p.add_argument("--session-think-s", type=float, metavar="S",
                   help="an agent's longest think time between turns (default 4.0; quick: 0.1)")
    p.add_argument("--session-variants", nargs="+", choices=sorted(VARIANTS), metavar="VARIANT",
                   help="engine answers: logprobs only, or with R3 routed experts (default: both; quick: r3)")
    p.set_defaults(func=_run)


def _sessions_config(args: argparse.Namespace) -> SessionsConfig | None:
    sessions = args.sessions if args.sessions is not None else ([16, 64] if args.quick else [16, 64, 256, 1024])
    if not sessions:
        return None
    q = args.quick
    try:
        return SessionsConfig(
            sessions=tuple(sessions), turns=args.session_turns or (2 if q else 3),
            service_s=args.session_service_s if args.session_service_s is not None else (0.2 if q else 8.0),
            think_s=args.session_think_s if args.session_think_s is not None else (0.1 if q else 4.0),
            variants=tuple(args.session_variants or (["r3"] if q else ["logprobs", "r3"])))
    except ValueError as exc:
        raise SystemExit(f"--sessions: {exc}") from None


def _run(args: argparse.Namespace) -> int:
    from dressage.flags import check_writable

    for path, what in ((args.json, "--json"), (args.plot, "--plot")):
        if path:  # before the curves, which an output that cannot be written would lose at their end
            check_writable(path, what, make_parents=True)
    if args.link_gbit is not None:
        try:  # before the curves: a link that cannot be shaped here fails now, not after the Step curve
            ShapedLoopback(args.link_gbit).check()
        except LinkError as exc:
            raise SystemExit(f"--link-gbit: {exc}") from None
    sizes = args.sizes or ([1024, 4096] if args.quick else [1024, 4096, 16384, 65536, 262144])
    if any(s <= OUTPUT_TOKENS for s in sizes):
        raise SystemExit(f"--sizes: a Step needs more than {OUTPUT_TOKENS} tokens")
    rounds = args.rounds or (2 if args.quick else 5)
    proxy_cpu_sizes = args.proxy_cpu_sizes if args.proxy_cpu_sizes is not None else ([1024] if args.quick else sizes)
    for s in proxy_cpu_sizes:
        try:
            prompt_for(s)
        except ValueError as exc:
            raise SystemExit(f"--proxy-cpu-sizes: {exc}") from None
    curve = run_step_curve(sizes, args.shapes, args.dtypes, rounds, proxy_cpu_sizes)
    units = args.units if args.units is not None else ([1, 2] if args.quick else [1, 2, 4, 8])
    sessions = _sessions_config(args)
    curves = {"step_size": curve}
    if units:
        try:
            curves["storage_units"] = run_units_curve(units, args.unit_steps or (8 if args.quick else 64), rounds,
                                                      link_gbit=args.link_gbit)
        except LinkError as exc:
            raise SystemExit(f"--link-gbit: {exc}") from None
    if sessions is not None:
        curves["sessions"] = run_sessions_curve(sessions)
    report = {"bench": "scale", "curves": curves,
              "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "node": platform.node()}}
    for p in curve["points"]:
        print(f"{p['layers']:>3}x{p['topk']} {p['dtype']:>5} T={p['tokens']:>7}: decode {p['proxy_decode_vs_b64']:.2f}x "
              f"b64 (best {p['proxy_decode_vs_b64_best']:.2f}x), restore {p['restore_vs_memcpy']:.2f}x memcpy "
              f"(best {p['restore_vs_memcpy_best']:.2f}x), restore peak {p['restore_peak_vs_bytes']:.2f}x", flush=True)
    for p in curve.get("proxy_cpu_points", []):
        print(f"{p['layers']:>3}x{p['topk']} {p['dtype']:>5} T={p['tokens']:>7}: Proxy CPU per call "
              f"{p['proxy_cpu_s'] * 1e3:.1f} ms, {p['proxy_cpu_vs_b64']:.2f}x b64 "
              f"(best {p['proxy_cpu_vs_b64_best']:.2f}x)", flush=True)
    link = curves.get("storage_units", {}).get("link")
    if link is not None:
        print(f"units curve over {link['device']} shaped to {link['rate_gbit']:g} Gbit/s ({link['qdisc']})")
    for p in curves.get("storage_units", {}).get("points", []):
        for mode in UNIT_MODES:
            m = p[mode]
            at_link = f" ({m['tcp_vs_link']:.2f}x the link)" if "tcp_vs_link" in m else ""
            print(f"units={p['units']} {mode:>8}: TQ {m['tq_gbps']:.3f} GB/s, two TCP hops {m['tcp_gbps']:.3f} GB/s"
                  f"{at_link}: "
                  f"{m['tq_vs_tcp']:.2f}x (best against best {m['tq_vs_tcp_best']:.2f}x; unauthenticated "
                  f"{m['tq_unauthenticated_vs_tcp']:.2f}x)")
    for p in curves.get("sessions", {}).get("points", []):
        print(f"{p['variant']:>8} sessions={p['sessions']:>5}: Proxy own p50 {p['proxy_own_p50_ms']:.1f} ms "
              f"p99 {p['proxy_own_p99_ms']:.1f} ms; direct own p50 {p['direct_own_p50_ms']:.1f} ms "
              f"p99 {p['direct_own_p99_ms']:.1f} ms; {p['proxy_cpu_ms_per_call']:.2f} ms Proxy CPU per call; "
              f"GC {p['proxy_gc_collections']} collections, longest {p['proxy_gc_max_pause_ms']:.0f} ms")
    for c in curves.values():
        for name, b in c["bounds"].items():
            print(f"{name}: worst {b['worst']:.2f} (bound {b['limit']}) {'met' if b['met'] else 'NOT met'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    if args.plot:
        _plot(curve, args.plot)
        if "storage_units" in curves:
            _plot_units(curves["storage_units"], curve_plot_path(args.plot, "units"))
        if "sessions" in curves:
            plot_sessions(curves["sessions"], curve_plot_path(args.plot, "sessions"))
    return 0
