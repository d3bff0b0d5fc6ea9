"""A TCP proxy that delays every chunk it forwards, each way: latency without ``netem``.

    python -m tests.fleet.delay_proxy --listen 127.0.0.1:16432 --to 10.88.0.2:6432 --delay-ms 200

Run inside a host's namespace (the fleet runs it in a worker's), it stands for a slow link to
the service at ``--to``: each chunk read from either side is written to the other ``--delay-ms``
later, in order. The delay can be changed while it runs by writing a number of milliseconds to
the file named by ``--delay-file`` (read every 0.2 s): that is how a test makes a database
answer slower than a lease, then fast again.

With ``--to-netns NAME`` the proxy listens in the namespace it was started in and connects to
``--to`` from inside the network namespace ``NAME`` (``/run/netns/NAME``): the test process,
which stays in the machine's namespace, reaches a service on a fleet host that way (RabbitMQ
speaks TCP only; PostgreSQL and Redis are reached through their Unix sockets).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import os
import time
from pathlib import Path


class Delay:
    def __init__(self, ms: float, path: Path | None) -> None:
        self.seconds = ms / 1000
        self.path = path

    async def follow(self) -> None:
        while self.path is not None:
            with contextlib.suppress(OSError, ValueError):
                self.seconds = float(self.path.read_text().strip() or 0) / 1000
            await asyncio.sleep(0.2)


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: Delay) -> None:
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def send() -> None:
        while True:
            due, chunk = await queue.get()
            if not chunk:
                break
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            writer.write(chunk)
            await writer.drain()
        with contextlib.suppress(OSError):
            writer.close()

    sender = asyncio.create_task(send())
    try:
        while chunk := await reader.read(65536):
            queue.put_nowait((time.monotonic() + delay.seconds, chunk))
    except OSError:
        pass
    queue.put_nowait((0.0, b""))
    with contextlib.suppress(OSError):
        await sender


CLONE_NEWNET = 0x40000000


def enter_netns(name: str) -> None:
    """Make every socket this process opens from now on belong to network namespace ``name``
    (setns(2); sockets opened before, such as the listener, stay where they are)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {name} failed")
    finally:
        os.close(fd)


async def serve(listen: str, target: str, delay: Delay, *, to_netns: str | None = None) -> None:
    to_host, to_port = target.rsplit(":", 1)

    async def handle(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            server_reader, server_writer = await asyncio.open_connection(to_host, int(to_port))
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(pipe(client_reader, server_writer, delay), pipe(server_reader, client_writer, delay))

    host, port = listen.rsplit(":", 1)
    server = await asyncio.start_server(handle, host, int(port))
    if to_netns:
        enter_netns(to_netns)  # one thread: asyncio connects from this one
    asyncio.get_running_loop().create_task(delay.follow())
    print(f"delay proxy {listen} -> {target} ready", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", required=True)
    parser.add_argument("--to", required=True)
    parser.add_argument("--delay-ms", type=float, default=0.0)
    parser.add_argument("--delay-file", type=Path)
    parser.add_argument("--to-netns", help="connect to --to from inside this network namespace")
    args = parser.parse_args()
    asyncio.run(serve(args.listen, args.to, Delay(args.delay_ms, args.delay_file), to_netns=args.to_netns))


if __name__ == "__main__":
    main()
