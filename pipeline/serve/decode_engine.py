"""Sequences decoded together: onnxruntime-genai's ``Engine`` behind an iterator per sequence.

In: an ``og.Model`` loaded with ``engine.static_batching.max_batch_size`` (``overlay``). Out:
``EngineLoop.generate(prompt, new_tokens)``, an iterator of token ids as each is chosen, the same
greedy tokens ``pipeline.measure.decode.greedy`` gives (up to ``new_tokens``, ending early at the
model's end token), so the server streams either the same way.

Why: with one generator per sequence, every sequence reads the model's weights once per step,
and four streams share the tokens per second one stream gets. The Engine runs up to
``max_batch_size`` sequences as one batch, reading the weights once per step for all of them.
Its static batches are formed from the requests waiting when a batch starts, and a request that
arrives while a batch runs waits for it to finish (the static Engine does not add rows to a
running batch; its paged, dynamic mode needs a model built for a paged KV cache, which the
builder's graphs are not). Every Engine call is made on the one thread that created it, as
onnxruntime-genai requires: the loop below owns it, and callers talk to it through queues.
"""
from __future__ import annotations

import json
import queue
import threading
import time
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class _Add:  # a sequence to start: its tokens go to ``out``
    ticket: object
    prompt: list
    new_tokens: int
    out: queue.SimpleQueue


@dataclass(frozen=True)
class _Cancel:  # its reader is gone
    ticket: object


_STOP = object()  # the server is stopping


def overlay(max_batch: int, max_seq_len: int) -> str:
    """The config overlay an Engine model is loaded with: static batches of ``max_batch``, a KV
    buffer of ``max_seq_len`` positions per row (allocated for the whole batch), greedy, no
    session-wide minimum length (the Engine refuses one)."""
    return json.dumps({"engine": {"static_batching": {"max_batch_size": int(max_batch)}},
                       "search": {"max_length": int(max_seq_len), "min_length": 0,
                                  "num_beams": 1, "do_sample": False}})


class EngineLoop:
    """One thread owning one ``og.Engine``: requests in through ``inbox``, tokens out through
    each sequence's own queue; ``None`` ends a sequence, an exception fails it."""

    def __init__(self, model, max_batch: int, gather_s: float = 0.0, events: int = 256):
        self.model, self.max_batch, self.gather_s, self.events = model, max_batch, gather_s, events
        self.failed: BaseException | None = None  # the engine broke: every sequence fails now
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="decode-engine", daemon=True)
        self.thread.start()

    def generate(self, prompt, new_tokens: int):
        out: queue.SimpleQueue = queue.SimpleQueue()
        ticket = object()
        self.inbox.put(_Add(ticket, list(prompt), int(new_tokens), out))
        try:
            while True:
                item = out.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:  # finished, or abandoned by its reader: the engine lets the row go
            self.inbox.put(_Cancel(ticket))

    def stop(self) -> None:
        self.inbox.put(_STOP)

    def _run(self) -> None:
        import onnxruntime_genai as og

        try:
            engine = og.Engine(self.model)
            buffer = engine.create_event_buffer(self.events)
        except Exception as e:  # noqa: BLE001 - a model the Engine cannot run: every request
            # (the warm-up's first) is answered with why, and the server's start fails on it
            self.failed = RuntimeError(f"onnxruntime-genai's Engine cannot run this model "
                                       f"(--decode-batch): {type(e).__name__}: {e}")
            while True:
                cmd = self.inbox.get()
                if cmd is _STOP:
                    return
                if isinstance(cmd, _Add):
                    cmd.out.put(self.failed)
        live: dict = {}     # og.Request -> (ticket, out queue, turn id)
        tickets: dict = {}  # ticket -> og.Request
        while True:
            # wait for work when the engine has none, else take what has come and run a step;
            # a batch about to start waits up to gather_s for company (requests sent together
            # arrive a few ms apart, and a static batch admits no one once it runs)
            idle = not engine.has_pending_requests()
            deadline = None
            while True:
                try:
                    if idle and deadline is None:
                        cmd = self.inbox.get()
                        deadline = time.monotonic() + self.gather_s
                    elif idle and len(live) < self.max_batch:
                        cmd = self.inbox.get(timeout=max(0.0, deadline - time.monotonic()))
                    else:
                        cmd = self.inbox.get(block=False)
                except queue.Empty:
                    break
                if cmd is _STOP:
                    self._fail(live, tickets, RuntimeError("the server is stopping"))
                    return
                if isinstance(cmd, _Add):
                    if self.failed is not None:
                        cmd.out.put(self.failed)
                        continue
                    try:
                        request = engine.create_request()
                        options = og.TurnOptions(request)
                        options.set_max_generated_tokens(cmd.new_tokens)
                        turn = request.begin_turn(np.asarray(cmd.prompt, dtype=np.int32),
                                                  options)
                    except Exception as e:  # noqa: BLE001 - the one sequence fails, not the loop
                        cmd.out.put(e)
                        continue
                    live[request] = (cmd.ticket, cmd.out, turn)
                    tickets[cmd.ticket] = request
                elif isinstance(cmd, _Cancel):  # a reader gone before its sequence ended
                    request = tickets.pop(cmd.ticket, None)
                    if request in live:
                        ticket, _, turn = live[request]
                        live[request] = (ticket, None, turn)  # its tokens go nowhere now
                        try:
                            request.cancel_turn(turn)
                        except Exception:  # noqa: BLE001 - it ends at its length anyway
                            pass
            if self.failed is not None or not engine.has_pending_requests():
                continue
            try:
                events = engine.run(buffer)
            except Exception as e:  # noqa: BLE001 - every sequence fails with it, now and later
                self.failed = RuntimeError(f"the decode engine failed: {type(e).__name__}: {e}")
                self._fail(live, tickets, self.failed)
                continue
            for k in range(len(events)):
                self._deliver(events[k], live, tickets, og)

    @staticmethod
    def _fail(live: dict, tickets: dict, error: BaseException) -> None:
        for _, out, _ in live.values():
            if out is not None:
                out.put(error)
        live.clear()
        tickets.clear()

    @staticmethod
    def _deliver(event, live: dict, tickets: dict, og) -> None:
        state = live.get(event.request)
        if state is None:  # a cancelled sequence's last events
            return
        ticket, out, _ = state
        flags = int(event.flags)
        failed = flags & int(og.EngineEventFlags.FAILED)
        if not failed and not flags & int(og.EngineEventFlags.TURN_FINISHED):
            if out is not None and flags & int(og.EngineEventFlags.TOKEN):
                out.put(int(event.token))
            return
        if out is not None:
            if flags & int(og.EngineEventFlags.TOKEN):
                out.put(int(event.token))
            out.put(RuntimeError(f"generation failed ({event.error_code})") if failed else None)
        live.pop(event.request, None)
        tickets.pop(ticket, None)
        event.request.close()
