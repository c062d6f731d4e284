"""A loopback TCP proxy that a test can cut, stall and restore: the database 'going away' for real.

- cut(): open connections are dropped and new ones refused (the database is down).
- stall(): a blackhole. Open connections stop carrying bytes in either direction, and new
  connections are accepted but never answered (a hung database or a dead network path).
- restore(): back to normal. Connections caught in a stall are dropped then, as a failover
  or a network path coming back with its old connections reset would.
"""

from __future__ import annotations

import asyncio
import contextlib


class CuttableProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.StreamWriter] = set()
        self._held: set[asyncio.StreamWriter] = set()
        self._up = True
        self._flowing = asyncio.Event()
        self._flowing.set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    @property
    def stalled(self) -> bool:
        return not self._flowing.is_set()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self._up:
            writer.close()
            return
        if self.stalled:
            # Accept, never answer: the client's connect succeeds and its handshake hangs.
            self._held.add(writer)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._pipes.update((writer, up_writer))

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, asyncio.IncompleteReadError):
                while data := await src.read(65536):
                    await self._flowing.wait()  # a stall holds the bytes here
                    if dst.transport.is_closing():
                        break
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))
        self._pipes.difference_update((writer, up_writer))

    def _drop_all(self) -> None:
        for pipe in [*self._pipes, *self._held]:
            pipe.transport.abort()
        self._pipes.clear()
        self._held.clear()

    def cut(self) -> None:
        """Drop every open connection and refuse new ones until restore()."""
        self._up = False
        self._drop_all()
        self._flowing.set()

    def stall(self) -> None:
        """Blackhole: keep every connection open but carry nothing, and leave new ones unanswered."""
        self._flowing.clear()

    def restore(self) -> None:
        if self.stalled:
            self._drop_all()
            self._flowing.set()
        self._up = True

    async def stop(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
