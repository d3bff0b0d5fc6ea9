"""Live deltas: the time from a model delta produced in a worker to its arrival at an SSE client.

A real worker (``celery -A tasks worker -P threads``) runs ``bench_streamer`` turns
(:mod:`bench.bench_stream_agents`), whose model streams fragments stamped with the wall-clock time
they were produced at; a real API process (``threads-celery api``, uvicorn) serves the event
stream; ``--streams`` SSE clients (asyncio sockets, in this process) subscribe to the threads of
up to ``--runs`` concurrent runs and take, for every stamp in every ``text_delta`` they receive,
arrival time minus production time.

The runs are started one after another, ``--start-gap-ms`` apart, while the earlier ones stream:
by a starter process of their own, either through ``POST /v1/runs`` on the very API process that
serves the streams (``api``) or with the Python client (``Threads.start``, ``python``), which
leaves the API nothing to do but stream. Each run's streams subscribe as soon as its start has
answered; its model waits ``--subscribe-ms`` before its first fragment. One row per number of
streams and way of starting (``--starters``, alternating over ``--repeat`` rounds): p50, p99 and
max of that latency, and the CPU per delta of the API process (per delta frame delivered) and of
the worker (per fragment produced, the whole streamed turn included).

Then the worker's CPU per streamed turn with publishing on and off (``THREADS_LIVE_DELTAS``),
alternating rounds: what publishing deltas adds to a streamed turn, for the function model above
and for a turn through a real provider's path (pydantic-ai's OpenAI model and the ``openai``
SDK, streaming over HTTP from :class:`threads_celery.testing.ProviderEmulator`); ``--cpu-turns 0``
leaves it out. Targets: p50 at most 20 ms and p99 at most 100 ms at 100 streams (issue 23), with
the runs started either way (issue 44); publishing adds at most 10% to a turn's worker CPU.
Run by hand, never by CI::

    .venv/bin/python bench/stream_latency.py --streams 100
    .venv/bin/python bench/stream_latency.py --streams 1,100,500 --runs 10

Needs PostgreSQL and Redis on loopback; creates a fresh database (dropped at the end) and
flushes the Redis DB of ``--redis-url`` (default DB 8).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.harness import fresh_database  # noqa: E402
from tests.support.processes import ManagedProcess, free_port  # noqa: E402
from threads_celery.testing import ProviderEmulator  # noqa: E402

AGENTS_MODULE = "bench.bench_stream_agents"
TOKEN = "bench-stream-token-0123456789"
STAMP_BYTES = re.compile(rb"@(\d+);")
#: The run event of a completed run, as the API writes it (compact JSON).
DONE = b'"status":"completed"'
DELTA_LINE = b'data: {"type":"text_delta"'
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process (and of its waited-for children) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / TICK


@contextmanager
def process(name: str, argv: list[str], env: dict[str, str], directory: Path) -> Iterator[ManagedProcess]:
    managed = ManagedProcess(name, argv, env=env, log_path=directory / f"{name}.log", cwd=REPO)
    managed.start()
    try:
        yield managed
    finally:
        managed.terminate(timeout=20)


def worker_argv(concurrency: int) -> list[str]:
    return [
        str(Path(sys.executable).with_name("celery")), "-A", "tasks", "worker", "-P", "threads",
        "-c", str(concurrency), "-l", "warning", "--without-heartbeat", "--without-gossip",
        "--without-mingle", "-n", f"bench-stream-{uuid.uuid4().hex[:6]}@%h",
    ]  # fmt: skip


def wait_ready(api: ManagedProcess, api_url: str) -> None:
    """Until the API answers and sees a worker (``/readyz?worker=1``)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{api_url}/readyz?worker=1", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"the API did not become ready:\n{api.log_tail()}")
        time.sleep(0.3)


async def client(url: str, thread_id: str, samples: list[tuple[int, float]], counts: list[int]) -> None:
    """One SSE stream, read as raw bytes: each stamp found is a sample (when it was produced, how
    long it took to arrive), taken when it arrived.

    A plain socket and a regular expression over what arrives, not an HTTP client's line parser:
    the 500 clients share two cores with the API and the worker, and what they spend parsing
    would be counted as delivery latency.
    """
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        f"GET /v1/threads/{thread_id}/events HTTP/1.1\r\nHost: {host}\r\n"
        f"Authorization: Bearer {TOKEN}\r\nAccept: text/event-stream\r\n\r\n".encode()
    )
    await writer.drain()
    tail = b""
    try:
        while True:
            chunk = await reader.read(65536)
            if not chunk:
                return
            now = time.time_ns()
            data = tail + chunk
            cut = data.rfind(b"\n") + 1  # whole lines only: the rest waits for the next read
            lines, tail = data[:cut], data[cut:]
            for line in lines.split(b"\n"):
                # Only the deltas: the committed message and the run's output hold the stamps too.
                if line.startswith(DELTA_LINE):
                    counts[0] += 1
                    for stamp in STAMP_BYTES.findall(line):
                        samples.append((int(stamp), (now - int(stamp)) / 1e6))
                elif DONE in line:
                    return
    finally:
        writer.close()


def start_runs(how: str, api_url: str, orders: list[tuple[str, str]], gap_s: float) -> None:
    """The starter process: start each ``(thread_id, message)`` in turn, ``gap_s`` apart (or
    right after the last if that took longer), and print each thread's id once its start answered.

    ``api``: ``POST /v1/runs`` on the API that serves the streams; ``python``: ``Threads.start``
    in this process (its database and broker from the environment), as a web app's own process
    would. Either way the benchmark's process, which reads the streams, does none of the work.
    """
    if how == "api":
        http = httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)

        def start(thread_id: str, message: str) -> None:
            body = {"agent": "bench_streamer", "message": message, "thread_id": thread_id}
            http.post("/v1/runs", json=body).raise_for_status()

        close = http.close
    else:
        from threads_celery import Threads

        threads = Threads(migrate=False)

        def start(thread_id: str, message: str) -> None:
            threads.start("bench_streamer", message, thread_id=thread_id)

        close = threads.close
    try:
        took = []
        began = time.monotonic()
        for i, (thread_id, message) in enumerate(orders):
            time.sleep(max(0.0, began + i * gap_s - time.monotonic()))
            t0 = time.perf_counter()
            start(thread_id, message)
            took.append(time.perf_counter() - t0)
            print(thread_id, flush=True)
        took.sort()
        print(f"took {statistics.median(took) * 1000:.2f} {took[-1] * 1000:.2f}", flush=True)
    finally:
        close()


async def one_level(
    api_url: str,
    env: dict[str, str],
    *,
    streams: int,
    runs: int,
    markers: int,
    interval_ms: int,
    starter: str = "api",
    gap_ms: float = 25.0,
    subscribe_ms: int = 500,
) -> dict[str, float]:
    """One round: ``runs`` runs started by ``starter`` while the earlier ones stream, ``streams``
    SSE clients over them; the latency of every stamp received."""
    samples: list[tuple[int, float]] = []
    counts = [0]  # delta frames received
    thread_ids = [f"bench-{uuid.uuid4().hex[:10]}" for _ in range(runs)]
    orders = [(thread_id, f"{markers} {interval_ms} {subscribe_ms}") for thread_id in thread_ids]
    clients_of = {thread_id: sum(1 for i in range(streams) if i % runs == n) for n, thread_id in enumerate(thread_ids)}
    argv = [__file__, "--start-runs", starter, "--api-url", api_url, "--start-gap-ms", str(gap_ms)]
    process = await asyncio.create_subprocess_exec(
        sys.executable, *argv, env=env, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, cwd=REPO
    )
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write(json.dumps(orders).encode())
    process.stdin.close()
    tasks: list[asyncio.Task[None]] = []
    start_ms = (float("nan"), float("nan"))
    starts_done_ns = 0
    while line := (await process.stdout.readline()).decode().strip():
        if line.startswith("took "):
            starts_done_ns = time.time_ns()
            median, longest = line.split()[1:]
            start_ms = (float(median), float(longest))
            continue
        tasks.extend(asyncio.create_task(client(api_url, line, samples, counts)) for _ in range(clients_of[line]))
    if await process.wait() != 0 or len(tasks) != streams:
        raise RuntimeError(f"the {starter} starter failed after {len(tasks)} of {streams} streams")
    await asyncio.wait_for(asyncio.gather(*tasks), timeout=120 + markers * interval_ms / 1000)
    during = sorted(latency for stamp, latency in samples if stamp < starts_done_ns)
    after = sorted(latency for stamp, latency in samples if stamp >= starts_done_ns)
    every = sorted(during + after)
    return {
        "samples": len(every),
        "expected": streams * markers,
        "frames": counts[0],
        "p50": percentile(every, 0.5),
        "p99": percentile(every, 0.99),
        "max": percentile(every, 1.0),
        "during_starts": len(during),
        "p99_during_starts": percentile(during, 0.99),
        "p99_after_starts": percentile(after, 0.99),
        "start_p50": start_ms[0],
        "start_max": start_ms[1],
    }


def percentile(ordered: list[float], q: float) -> float:
    """The ``q`` quantile of sorted samples (the highest at 1.0); NaN for none."""
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def cpu_per_turn(
    env: dict[str, str],
    directory: Path,
    live: bool,
    turns: int,
    order: str,
    database_url: str,
    redis_url: str,
    agent: str = "bench_streamer",
) -> float:
    """The worker's CPU seconds per streamed turn (``turns`` in sequence, each asked ``order``)."""
    from threads_celery import Threads

    worker_env = {**env, "THREADS_LIVE_DELTAS": "true" if live else "false"}
    threads = Threads(database_url=database_url, broker_url=redis_url)
    try:
        with process(f"cpu-worker-{'on' if live else 'off'}", worker_argv(2), worker_env, directory) as worker:
            threads.wait(threads.start(agent, "5 1 0").run_id, 60)  # warm up
            before = cpu_seconds(worker.pid)
            for _ in range(turns):
                threads.wait(threads.start(agent, order).run_id, 120)
            return (cpu_seconds(worker.pid) - before) / turns
    finally:
        threads.close()


def one_round(
    api: ManagedProcess,
    worker: ManagedProcess,
    api_url: str,
    env: dict[str, str],
    args: argparse.Namespace,
    *,
    streams: int,
    runs: int,
    starter: str,
) -> dict[str, float]:
    """:func:`one_level` with the API's CPU per delta frame and the worker's per fragment."""
    api_cpu, worker_cpu = cpu_seconds(api.pid), cpu_seconds(worker.pid)
    result = asyncio.run(
        one_level(
            api_url, env, streams=streams, runs=runs, markers=args.markers, interval_ms=args.interval_ms,
            starter=starter, gap_ms=args.start_gap_ms, subscribe_ms=args.subscribe_ms,
        )
    )  # fmt: skip
    api_cpu, worker_cpu = cpu_seconds(api.pid) - api_cpu, cpu_seconds(worker.pid) - worker_cpu
    result["api_us_per_frame"] = api_cpu / max(result["frames"], 1) * 1e6
    result["worker_us_per_delta"] = worker_cpu / (runs * args.markers) * 1e6
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", default="1,100,500", help="comma-separated numbers of SSE clients")
    parser.add_argument("--runs", type=int, default=100, help="streamed runs per round (at most one per stream)")
    parser.add_argument("--starters", default="api,python", help="how runs start: api (POST /v1/runs), python")
    parser.add_argument("--repeat", type=int, default=2, help="rounds of each level and starter, alternating")
    parser.add_argument("--start-gap-ms", type=float, default=25.0, help="between two runs' starts")
    parser.add_argument("--subscribe-ms", type=int, default=500, help="a run's wait before its first fragment")
    parser.add_argument("--markers", type=int, default=25, help="fragments each run streams")
    parser.add_argument("--interval-ms", type=int, default=200, help="between two fragments")
    parser.add_argument("--cpu-turns", type=int, default=20, help="turns for the publishing on/off CPU comparison")
    parser.add_argument("--cpu-markers", type=int, default=100, help="fragments per turn there")
    parser.add_argument("--cpu-interval-ms", type=int, default=20, help="between two fragments there")
    parser.add_argument("--cpu-repeat", type=int, default=3, help="alternating off/on rounds there")
    parser.add_argument("--coalesce-ms", type=float, default=None, help="THREADS_LIVE_COALESCE_MS for the workers")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/8")
    parser.add_argument("--pg-host", default="127.0.0.1")
    parser.add_argument("--pg-port", type=int, default=5432)
    parser.add_argument("--pg-user", default="postgres")
    parser.add_argument("--start-runs", choices=("api", "python"), help=argparse.SUPPRESS)  # the starter process
    parser.add_argument("--api-url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.start_runs:
        start_runs(args.start_runs, args.api_url, json.load(sys.stdin), args.start_gap_ms / 1000)
        return
    levels = [int(n) for n in args.streams.split(",")]
    starters = [s.strip() for s in args.starters.split(",") if s.strip()]

    import redis

    redis.Redis.from_url(args.redis_url).flushdb()
    print(
        f"machine: {platform.machine()} cpus={os.cpu_count()} python={platform.python_version()} "
        f"date={time.strftime('%Y-%m-%d %H:%M:%S %z')} load={' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    rows = []
    with fresh_database(args.pg_host, args.pg_port, args.pg_user, False) as database_url, \
            tempfile.TemporaryDirectory(prefix="tc-bench-stream-") as tmp:  # fmt: skip
        directory = Path(tmp)
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
            "THREADS_DATABASE_URL": database_url,
            "THREADS_BROKER_URL": args.redis_url,
            "THREADS_AGENTS": AGENTS_MODULE,
            "THREADS_API_TOKENS": TOKEN,
            "OPENAI_API_KEY": "bench",
            **(
                {"THREADS_LIVE_COALESCE_MS": str(args.coalesce_ms)} if args.coalesce_ms is not None else {}
            ),  # bench_provider is loaded everywhere; only the CPU phase calls it
        }
        port = free_port()
        api_url = f"http://127.0.0.1:{port}"
        api_argv = [str(Path(sys.executable).with_name("threads-celery")), "api", "--port", str(port)]
        with process("worker", worker_argv(max(args.runs, 2)), env, directory) as worker, \
                process("api", api_argv, env, directory) as api:  # fmt: skip
            wait_ready(api, api_url)
            for starter in starters:  # warm up
                asyncio.run(one_level(api_url, env, streams=1, runs=1, markers=10, interval_ms=10, starter=starter))
            rounds = [(streams, starter) for streams in levels for _ in range(args.repeat) for starter in starters]
            for streams, starter in rounds:
                runs = min(streams, args.runs)
                result = one_round(api, worker, api_url, env, args, streams=streams, runs=runs, starter=starter)
                rows.append((streams, runs, starter, result))
                shown = json.dumps({k: round(v, 2) for k, v in result.items()})
                print(f"{streams} streams, started by {starter}: {shown}", flush=True)
        cpu: dict[str, tuple[list[float], list[float]]] = {}
        if args.cpu_turns > 0:
            order = f"{args.cpu_markers} {args.cpu_interval_ms} 0"
            reply = " ".join(f"w{i}" for i in range(args.cpu_markers))  # chunks of 4 characters
            emulator = ProviderEmulator(
                lambda body: {"text": reply, "chunk_delay": args.cpu_interval_ms / 1000}, text_chunk_size=4
            )
            with emulator:
                provider_env = {**env, "OPENAI_BASE_URL": emulator.base_url, "OPENAI_API_KEY": "bench"}
                for agent, agent_env in (("bench_streamer", env), ("bench_provider", provider_env)):
                    off, on = cpu.setdefault(agent, ([], []))
                    for _ in range(args.cpu_repeat):  # alternating, so that the machine's load falls on both
                        for live, into in ((False, off), (True, on)):
                            into.append(
                                cpu_per_turn(
                                    agent_env,
                                    directory,
                                    live,
                                    args.cpu_turns,
                                    order,
                                    database_url,
                                    args.redis_url,
                                    agent,
                                )
                            )

    print(
        f"\n{args.markers} fragments per run, {args.interval_ms} ms apart, coalescing {args.coalesce_ms or 5.0} ms; "
        f"runs started {args.start_gap_ms:g} ms apart, each waiting {args.subscribe_ms} ms before its first fragment:"
    )
    print(
        "| streams | runs | started by | stamps received | p50 ms | p99 ms | max ms | p99 while starting / after "
        "| a start p50 / max ms | API CPU per delta frame | worker CPU per fragment (whole turn) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for streams, runs, starter, r in rows:
        print(
            f"| {streams} | {runs} | {starter} | {r['samples']:.0f} of {r['expected']:.0f} | {r['p50']:.1f} | "
            f"{r['p99']:.1f} | {r['max']:.1f} | {r['p99_during_starts']:.1f} / {r['p99_after_starts']:.1f} | "
            f"{r['start_p50']:.1f} / {r['start_max']:.1f} | "
            f"{r['api_us_per_frame']:.0f} µs | {r['worker_us_per_delta']:.0f} µs |"
        )
    worst = 0.0
    for agent, (off, on) in cpu.items():
        off_ms, on_ms = statistics.median(off) * 1000, statistics.median(on) * 1000
        worst = max(worst, on_ms / off_ms - 1)
        print(
            f"\nworker CPU per streamed turn ({agent}: {args.cpu_markers} fragments {args.cpu_interval_ms} ms apart, "
            f"{args.cpu_turns} turns a round, median of {args.cpu_repeat} rounds): publishing off {off_ms:.1f} ms "
            f"({', '.join(f'{x * 1000:.1f}' for x in off)}), on {on_ms:.1f} ms ({', '.join(f'{x * 1000:.1f}' for x in on)}): "
            f"{(on_ms / off_ms - 1) * 100:+.1f}%"
        )
    for starter in starters:
        at_100 = [r for s, _, by, r in rows if s == 100 and by == starter]
        if at_100:
            met = all(r["p50"] <= 20 and r["p99"] <= 100 for r in at_100)
            print(
                f"target at 100 streams, started by {starter} (p50 <= 20 ms, p99 <= 100 ms): "
                f"{'met' if met else 'NOT met'} in {sum(r['p50'] <= 20 and r['p99'] <= 100 for r in at_100)} of "
                f"{len(at_100)} rounds"
            )
    if cpu:
        print(
            f"target for publishing (<= +10% worker CPU per turn): {'met' if worst <= 0.10 else 'NOT met'} "
            f"(worst {worst:+.1%})"
        )


if __name__ == "__main__":
    main()
