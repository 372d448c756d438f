"""The producer side of the server: preprocessing worker processes, each on a socket of its own
that the event loop reads and writes directly.

In: how many workers, the artifact's reader key (``readers.reader``). Out: ``await
workers.prepare(body, content_type, limits)``: the request's ``Prepared`` from the least busy
worker, or the ``BadInput`` its reader raised, or ``WorkerLost`` when that worker died with the
request (it is replaced; the others go on).

Why not ``concurrent.futures.ProcessPoolExecutor``: a request through it crosses three threads of
the server's process (the caller, the executor's manager thread, the call queue's feeder thread),
each a wake-up and a hand-over of the GIL that the model's thread and the event loop need too.
Measured per request on the OCR server at 500 requests/s (2 cores): 0.19 CPU-ms in those two
threads alone, next to 0.26 for the whole event loop. Here a request is one framed pickle written
by the event loop and one read back as protocol data: no thread in between.

Workers are started with ``spawn``, never ``fork``: a forked child of a process that holds a
runtime's threads can deadlock. Each worker builds its reader before it answers its first
message, so the server is ready only once every worker is warm.
"""
from __future__ import annotations

import asyncio
import itertools
import multiprocessing
import pickle
import socket
import struct

from pipeline.serve.inputs import Limits, Prepared

FRAME = struct.Struct("!Q")  # each message: its length, then the pickle


class WorkerLost(Exception):
    """A preprocessing worker died with this request: 500, and the server goes on."""


def _serve(sock: socket.socket, key) -> None:
    """A worker's life: answer frames on ``sock`` until the server closes it."""
    from pipeline.serve.readers import prepare, reader

    reader(key)  # imports, the task, the tokenizer: before the first request needs them
    sock.sendall(_frame((0, True, None)))  # ready
    stream = sock.makefile("rb")
    while True:
        head = stream.read(FRAME.size)
        if len(head) < FRAME.size:
            return  # the server closed the socket: it is stopping
        ident, body, content_type, limits = pickle.loads(stream.read(FRAME.unpack(head)[0]))
        try:
            answer = (ident, True, prepare(body, content_type, limits, key))
        except Exception as e:  # noqa: BLE001 - BadInput, or a reader's failure: the server's
            answer = (ident, False, _portable(e))
        sock.sendall(_frame(answer))


def _portable(error: Exception) -> Exception:
    """``error`` if the server can unpickle it, else a RuntimeError with its line: an exception
    the server could not rebuild would end the link, and every request on this worker with it."""
    try:
        pickle.loads(pickle.dumps(error, protocol=pickle.HIGHEST_PROTOCOL))
        return error
    except Exception:  # noqa: BLE001 - any failure to round-trip
        return RuntimeError(f"{type(error).__name__}: {error}")


def _frame(message) -> bytes:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return FRAME.pack(len(data)) + data


class _Link(asyncio.Protocol):
    """The event loop's end of one worker's socket: frames in, futures resolved."""

    def __init__(self, process, on_lost):
        self.process, self.on_lost = process, on_lost
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.waiting: dict[int, asyncio.Future] = {}
        self.ready: asyncio.Future = asyncio.get_running_loop().create_future()
        self.alive = True

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while len(self.buffer) >= FRAME.size:
            size = FRAME.unpack_from(self.buffer)[0]
            if len(self.buffer) < FRAME.size + size:
                return
            ident, ok, value = pickle.loads(self.buffer[FRAME.size:FRAME.size + size])
            del self.buffer[:FRAME.size + size]
            future = self.ready if ident == 0 else self.waiting.pop(ident, None)
            if future is not None and not future.done():
                if ok:
                    future.set_result(value)
                else:
                    future.set_exception(value)

    def connection_lost(self, exc) -> None:
        self.alive = False
        lost = WorkerLost("a preprocessing worker died while decoding this request; it was "
                          "restarted, retry")
        for future in [self.ready, *self.waiting.values()]:
            if not future.done():
                future.set_exception(lost)
        self.waiting.clear()
        self.on_lost(self)

    def send(self, ident: int, message: tuple) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        self.waiting[ident] = future
        self.transport.write(_frame((ident, *message)))
        return future


class Workers:
    """``count`` worker processes serving the reader ``key``; a dead one is replaced."""

    def __init__(self, count: int, key, on_restart=None):
        self.count, self.key, self.on_restart = count, key, on_restart
        self.links: list[_Link] = []
        self.ids = itertools.count(1)
        self.stopping = False
        self.starting: set[asyncio.Task] = set()

    async def start(self) -> None:
        links = await asyncio.gather(*(self._spawn() for _ in range(self.count)))
        self.links.extend(links)

    async def _spawn(self) -> _Link:
        loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair()
        process = multiprocessing.get_context("spawn").Process(
            target=_serve, args=(theirs, self.key), daemon=True, name="pipeline-serve-worker")
        await asyncio.to_thread(process.start)
        theirs.close()
        _, link = await loop.connect_accepted_socket(lambda: _Link(process, self._lost), ours)
        await link.ready
        return link

    def _lost(self, link: _Link) -> None:
        if link in self.links:
            self.links.remove(link)
        # reap the dead process off the loop; then, unless stopping, a fresh one takes its place
        task = asyncio.ensure_future(self._replace(link))
        self.starting.add(task)
        task.add_done_callback(self.starting.discard)

    async def _replace(self, link: _Link) -> None:
        await asyncio.to_thread(link.process.join, 10)
        if self.stopping:
            return
        if self.on_restart is not None:
            self.on_restart()
        self.links.append(await self._spawn())

    async def prepare(self, body: bytes, content_type: str, limits: Limits) -> Prepared:
        while not self.links:  # every worker died at once: wait for a replacement
            if self.stopping or not self.starting:
                raise WorkerLost("no preprocessing worker is running")
            await asyncio.wait(set(self.starting))
        link = min(self.links, key=lambda w: len(w.waiting))
        return await link.send(next(self.ids), (body, content_type, limits))

    async def stop(self) -> None:
        """Close every socket (a worker ends at its end of file) and wait for the processes."""
        self.stopping = True
        links, self.links = list(self.links), []
        for link in links:
            link.transport.close()
        for task in list(self.starting):
            task.cancel()
        await asyncio.to_thread(lambda: [link.process.join(30) for link in links])
