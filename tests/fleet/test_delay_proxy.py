"""The fleet's delaying TCP proxy forwards every byte, both ways, in order (no namespaces needed)."""

from __future__ import annotations

import socket
import sys
import threading
from pathlib import Path

from tests.support.processes import ManagedProcess, free_port, subprocess_env


def _echo_server() -> tuple[socket.socket, int]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                while data := conn.recv(65536):
                    conn.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    return server, int(server.getsockname()[1])


def test_every_byte_crosses_the_proxy_both_ways_in_order(tmp_path: Path) -> None:
    server, port = _echo_server()
    listen = free_port()
    delay_file = tmp_path / "delay"
    delay_file.write_text("20")
    argv = [sys.executable, "-m", "tests.fleet.delay_proxy", "--listen", f"127.0.0.1:{listen}",
            "--to", f"127.0.0.1:{port}", "--delay-file", str(delay_file)]  # fmt: skip
    with ManagedProcess("delay-proxy", argv, env=subprocess_env(), log_path=tmp_path / "proxy.log") as proxy:
        proxy.start()
        proxy.wait_for_log("ready", timeout=30)
        payload = bytes(range(256)) * 4096  # 1 MiB, in many chunks
        with socket.create_connection(("127.0.0.1", listen), timeout=30) as client:
            sender = threading.Thread(target=client.sendall, args=(payload,))
            sender.start()
            received = bytearray()
            while len(received) < len(payload):
                chunk = client.recv(65536)
                assert chunk, "the proxy closed the connection early"
                received += chunk
            sender.join()
        assert bytes(received) == payload
    server.close()
