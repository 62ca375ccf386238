"""A TCP proxy on loopback in front of the test PostgreSQL, that a test can cut.

``cut_after(marker)``: the next client request holding ``marker`` is forwarded to the
server, the server's reply is awaited (so the statement has committed) and dropped, and
the connection is closed: the client lost its connection after its statement was sent.
``drop_at(marker)``: the next request holding ``marker`` never reaches the server, and the
proxy goes ``down()``. ``down()`` closes every connection and refuses new ones until
``up()``.
"""

from __future__ import annotations

import socket
import threading
from urllib.parse import urlsplit, urlunsplit


class _Pair:
    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client = client
        self.server = server
        self.cutting = False

    def close(self) -> None:
        for sock in (self.client, self.server):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()


class PgProxy:
    def __init__(self, target_url: str) -> None:
        parts = urlsplit(target_url)
        self._target = (parts.hostname or "127.0.0.1", parts.port or 5432)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        netloc = parts.netloc.rsplit("@", 1)
        auth = netloc[0] + "@" if len(netloc) == 2 else ""
        self.url = urlunsplit((parts.scheme, f"{auth}127.0.0.1:{self.port}", parts.path,
                               parts.query, parts.fragment))
        self._lock = threading.Lock()
        self._pairs: list[_Pair] = []
        self._marker: bytes | None = None
        self._forward = True
        self._down = False
        self.cuts = 0
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def cut_after(self, marker: bytes) -> None:
        with self._lock:
            self._marker, self._forward = marker, True

    def drop_at(self, marker: bytes) -> None:
        with self._lock:
            self._marker, self._forward = marker, False

    def down(self) -> None:
        with self._lock:
            self._down = True
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            pair.close()

    def up(self) -> None:
        with self._lock:
            self._down = False

    def close(self) -> None:
        self._closed = True
        self.down()
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                refuse = self._down
            if refuse:
                client.close()
                continue
            try:
                server = socket.create_connection(self._target, timeout=5)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            pair = _Pair(client, server)
            with self._lock:
                self._pairs.append(pair)
            threading.Thread(target=self._upstream, args=(pair,), daemon=True).start()
            threading.Thread(target=self._downstream, args=(pair,), daemon=True).start()

    def _upstream(self, pair: _Pair) -> None:
        try:
            while data := pair.client.recv(65536):
                with self._lock:
                    hit = self._marker is not None and self._marker in data
                    if hit:
                        self._marker = None
                        pair.cutting = True
                    forward = self._forward or not hit
                if not forward:
                    self.cuts += 1
                    self.down()
                    break
                pair.server.sendall(data)
        except OSError:
            pass
        pair.close()

    def _downstream(self, pair: _Pair) -> None:
        try:
            while data := pair.server.recv(65536):
                if pair.cutting:
                    self.cuts += 1
                    break  # the reply is dropped: the client never learns the outcome
                pair.client.sendall(data)
        except OSError:
            pass
        pair.close()
