"""A Redis server of a test's own: a spare port, a temporary directory, its own config.

For tests that restart a server or need a configuration the machine's Redis does not
have; the machine's service is never touched.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from ports import spare_port

__all__ = ["RedisServer"]


class RedisServer:
    """``redis-server`` on 127.0.0.1 with ``options`` (e.g. ``["--appendonly", "yes"]``)."""

    def __init__(self, directory: Path, options: list[str]) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server is not installed (scripts/services installs it)")
        self.port = spare_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._command = [
            binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(directory),
            *options,
        ]
        self._process: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        self._process = subprocess.Popen(
            self._command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        give_up = time.monotonic() + 20
        while time.monotonic() < give_up:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as conn:
                    conn.sendall(b"PING\r\n")
                    if conn.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            if self._process.poll() is not None:
                pytest.fail(f"redis-server exited with {self._process.returncode}")
            time.sleep(0.05)  # polling for the server to accept connections, bounded above
        pytest.fail("redis-server did not answer within 20 s")

    def stop(self, *, save: bool = False) -> None:
        """Shut the server down (``SHUTDOWN NOSAVE`` unless ``save``) and wait for it."""
        if self._process is None:
            return
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as conn:
            conn.sendall(b"SHUTDOWN SAVE\r\n" if save else b"SHUTDOWN NOSAVE\r\n")
        self._process.wait(20)
        self._process = None

    def close(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait(20)
            self._process = None
