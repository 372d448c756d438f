"""The producer side of the server: preprocessing worker processes, each on a socket of its own
that the event loop reads and writes directly.

In: how many workers, the artifact's reader key (``readers.reader``). Out: ``await
workers.prepare(body, content_type, limits)``: the request's ``Prepared`` from the worker with the
fewest requests in hand, or the ``BadInput`` its reader raised, a ``WorkerError`` (its reader
failed otherwise: one line), or ``WorkerLost`` when that worker died with the request (it is
replaced; the others go on).

Why not ``concurrent.futures.ProcessPoolExecutor``: a request through it crosses three threads of
the server's process (the caller, the executor's manager thread, the call queue's feeder thread),
each a wake-up and a hand-over of the GIL that the model's thread and the event loop need too.
Measured per request on the OCR server at 500 requests/s (2 cores): 0.19 CPU-ms in those two
threads alone, next to 0.26 for the whole event loop. Here a request is one frame written by the
event loop and one read back as protocol data: no thread in between.

Messages are a JSON header and raw bytes (the request's body; the prepared arrays), never a
pickle: a worker decodes bytes from the network, and a decoder that such bytes took over must not
be able to run code in the server through what it sends back. An array travels as its numeric
dtype, shape and bytes; an error as its HTTP status and line, or as one line.

Workers are started with ``spawn``, never ``fork``: a forked child of a process that holds a
runtime's threads can deadlock. Each worker builds its reader before it answers its first
message, so the server is ready only once every worker is warm.
"""
from __future__ import annotations


import asyncio
import dataclasses
import itertools
import json
import multiprocessing
import signal
import socket
import struct

import numpy as np

from pipeline.serve.inputs import BadInput, Limits, Prepared

# a frame: its whole length, its header's length, the header (JSON), then the payload
FRAME = struct.Struct("!QI")


class WorkerLost(Exception):
    """A preprocessing worker died with this request: 500, and the server goes on."""


class WorkerError(Exception):
    """A worker's reader failed on this request other than by refusing it: 500, one line."""


def _serve(sock: socket.socket, key) -> None:
    """A worker's life: answer frames on ``sock`` until the server closes it."""
    # The server stops its workers (it closes their sockets once it has drained): a signal to
    # the whole group (a terminal's Ctrl-C, systemd's stop) must not kill them mid-drain, where
    # the server would start others in their place.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        _answer(sock, key)
    except (BrokenPipeError, ConnectionResetError):
        return  # the server went away (it was killed): nothing to answer, nothing to say


def _answer(sock: socket.socket, key) -> None:
    from pipeline.serve.readers import prepare, reader

    reader(key)  # imports, the task, the tokenizer: before the first request needs them
    sock.sendall(frame({"id": 0, "ok": True}))  # ready
    stream = sock.makefile("rb")
    while True:
        head = stream.read(FRAME.size)
        if len(head) < FRAME.size:
            return  # the server closed the socket: it is stopping
        size, length = FRAME.unpack(head)
        header = json.loads(stream.read(length))
        body = stream.read(size - FRAME.size - length)
        try:
            prepared = prepare(body, header["type"], Limits(*header["limits"]), key)
        except BadInput as e:
            sock.sendall(frame({"id": header["id"], "ok": False, "status": e.status,
                                "line": e.line}))
        except Exception as e:  # noqa: BLE001 - a reader's failure: this request's 500
            sock.sendall(frame({"id": header["id"], "ok": False,
                                "line": f"{type(e).__name__}: {e}"}))
        else:
            sock.sendall(prepared_frame(header["id"], prepared))


def frame(header: dict, *payload: bytes) -> bytes:
    head = json.dumps(header).encode()
    size = FRAME.size + len(head) + sum(len(p) for p in payload)
    return b"".join((FRAME.pack(size, len(head)), head, *payload))


def split(whole: bytes) -> tuple[dict, memoryview]:
    """(header, payload) of one whole frame."""
    _, length = FRAME.unpack_from(whole)
    view = memoryview(whole)
    return json.loads(bytes(view[FRAME.size:FRAME.size + length])), view[FRAME.size + length:]


def prepared_frame(ident: int, p: Prepared) -> bytes:
    arrays = [(name, np.ascontiguousarray(a)) for name, a in p.feeds.items()]
    return frame({"id": ident, "ok": True, "size": p.size, "decode_ms": p.decode_ms,
                  "preprocess_ms": p.preprocess_ms,
                  "geometry": list(p.geometry) if p.geometry else None,
                  "arrays": [[name, a.dtype.str, list(a.shape)] for name, a in arrays]},
                 *(a.tobytes() for _, a in arrays))


def answer(header: dict, payload: memoryview):
    """What a worker's frame says: a ``Prepared``, or the exception to raise for the request."""
    if not header["ok"]:
        if "status" in header:
            return BadInput(int(header["status"]), str(header["line"]))
        return WorkerError(str(header["line"]))
    feeds, at = {}, 0
    for name, dtype, shape in header["arrays"]:
        kind = np.dtype(dtype)
        if kind.kind not in "biuf":  # numbers only: never an object array
            return WorkerError(f"a preprocessing worker sent an array of dtype {dtype}")
        count = int(np.prod(shape, dtype=np.int64))
        # a copy: writeable, as the reader made it (an array over the frame's bytes is not)
        feeds[name] = np.frombuffer(payload, kind, count, at).reshape(shape).copy()
        at += count * kind.itemsize
    geometry = header.get("geometry")
    return Prepared(feeds, int(header["size"]), float(header["decode_ms"]),
                    float(header["preprocess_ms"]),
                    tuple(float(v) for v in geometry) if geometry else None)


class _Link(asyncio.Protocol):
    """The event loop's end of one worker's socket: frames in, futures resolved."""

    def __init__(self, process, on_lost):
        self.process, self.on_lost = process, on_lost
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.waiting: dict[int, asyncio.Future] = {}
        self.ready: asyncio.Future = asyncio.get_running_loop().create_future()
        self.started = False  # it said it was ready (one that dies before is not replaced here)

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while len(self.buffer) >= FRAME.size:
            size = FRAME.unpack_from(self.buffer)[0]
            if len(self.buffer) < size:
                return
            header, payload = split(bytes(self.buffer[:size]))
            del self.buffer[:size]
            ident = header["id"]
            future = self.ready if ident == 0 else self.waiting.pop(ident, None)
            if future is None or future.done():
                continue
            self.started = True
            value = answer(header, payload) if ident else None
            if isinstance(value, Exception):
                future.set_exception(value)
            else:
                future.set_result(value)

    def connection_lost(self, exc) -> None:
        lost = WorkerLost("a preprocessing worker died while decoding this request; it was "
                          "restarted, retry")
        for future in [self.ready, *self.waiting.values()]:
            if not future.done():
                future.set_exception(lost)
        self.waiting.clear()
        self.on_lost(self)

    def send(self, ident: int, body: bytes, content_type: str, limits: Limits) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        self.waiting[ident] = future
        self.transport.write(frame({"id": ident, "type": content_type,
                                     "limits": dataclasses.astuple(limits)}, body))
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
        # reap the dead process off the loop; then, unless stopping, a fresh one takes its place.
        # One that died before it was ready is its starter's to handle (_spawn raised there).
        task = asyncio.ensure_future(self._replace(link) if link.started else
                                     asyncio.to_thread(link.process.join, 10))
        self.starting.add(task)
        task.add_done_callback(self.starting.discard)

    async def _replace(self, link: _Link, tries: int = 3) -> None:
        await asyncio.to_thread(link.process.join, 10)
        if self.stopping:
            return
        # a few tries (a replacement may itself be killed while it starts), never forever: a
        # worker that cannot start fails the same way every time. Each try is a worker started.
        for _ in range(tries):
            if self.on_restart is not None:
                self.on_restart()
            try:
                self.links.append(await self._spawn())
                return
            except Exception as e:  # noqa: BLE001 - the server goes on with the workers it has
                if self.stopping:
                    return
                failed = f"{type(e).__name__}: {e}"
        print(f"serve: a preprocessing worker could not be restarted ({tries} tries): {failed}",
              flush=True)

    async def prepare(self, body: bytes, content_type: str, limits: Limits) -> Prepared:
        while not self.links:  # every worker died at once: wait for a replacement
            if self.stopping or not self.starting:
                raise WorkerLost("no preprocessing worker is running")
            await asyncio.wait(set(self.starting))
        link = min(self.links, key=lambda w: len(w.waiting))
        return await link.send(next(self.ids), body, content_type, limits)

    async def stop(self) -> None:
        """Close every socket (a worker ends at its end of file) and wait for the processes."""
        self.stopping = True
        links, self.links = list(self.links), []
        for link in links:
            link.transport.close()
        for task in list(self.starting):
            task.cancel()
        await asyncio.to_thread(lambda: [link.process.join(30) for link in links])
