"""Answering while the client waits: a streamed generation as server-sent events (one per token),
and watching for the client's disconnect, which aborts its sequences in the engine."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any, Callable

from starlette.requests import Request

from scepsy.tracing.emulation.generation import Choice, usage_counts
from scepsy.tracing.emulation.livereplica import LiveReplica, LiveSequence


class Disconnected(Exception):
    """The client went away while its request was in the engine."""


async def wait_all(request: Request, notify: asyncio.Event, done) -> bool:
    """Wait until `done()`; False if the client disconnects first."""
    listener = asyncio.ensure_future(disconnect(request.receive))
    try:
        while not done():
            waiter = asyncio.ensure_future(notify.wait())
            ready, _ = await asyncio.wait({waiter, listener}, return_when=asyncio.FIRST_COMPLETED)
            if waiter not in ready:
                waiter.cancel()
                return False
            notify.clear()
        return True
    finally:
        listener.cancel()


async def disconnect(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class EventStream:
    """A streamed generation (ASGI): one SSE event per token, sent when its iteration ends.

    The client's disconnect is watched all along (also while the request waits in the queue), and
    aborts its sequences in the engine.
    """

    def __init__(self, live: LiveReplica, finish: Callable[[str, Sequence[LiveSequence]], None], choices: list[Choice], notify: asyncio.Event,
                 header: dict, chat: bool, include_usage: bool):
        self.live, self.finish, self.choices, self.notify = live, finish, choices, notify
        self.header, self.chat, self.include_usage = header, chat, include_usage

    def _event(self, choice_fields: list[dict], **extra) -> bytes:
        return b"data: " + json.dumps({**self.header, "choices": choice_fields, **extra}, ensure_ascii=False).encode() + b"\n\n"

    def _token_event(self, choice: Choice, i: int) -> bytes:
        last = i == len(choice.token_texts) - 1
        finish = choice.finish_reason if last else None
        fields: dict[str, Any] = {"index": choice.index}
        if self.chat:
            fields["delta"] = {"content": choice.token_texts[i]}
        else:
            fields["text"] = choice.token_texts[i]
        fields.update({"logprobs": None, "finish_reason": finish})
        if not self.chat or last:
            fields["stop_reason"] = choice.stop_reason if last else None
        return self._event([fields])

    def _pending(self) -> bytes:
        """Events for every token produced since the last call, in choice order."""
        out = []
        for choice in self.choices:
            produced = choice.sequence.generated
            if self.chat and choice.sent == 0 and produced:
                out.append(self._event([{"index": choice.index, "delta": {"role": "assistant", "content": ""},
                                         "logprobs": None, "finish_reason": None}]))
            while choice.sent < produced:
                out.append(self._token_event(choice, choice.sent))
                choice.sent += 1
        return b"".join(out)

    async def _produce(self, send) -> None:
        choices = self.choices
        while True:
            await self.notify.wait()
            self.notify.clear()
            chunk = self._pending()
            if chunk:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            if all(c.sequence.finished for c in choices):
                break
        tail = b""
        if self.include_usage:
            tail += self._event([], usage=usage_counts(choices))
        await send({"type": "http.response.body", "body": tail + b"data: [DONE]\n\n", "more_body": False})
        self.finish(choices[0].finish_reason, [c.sequence for c in choices])

    async def __call__(self, scope, receive, send) -> None:
        headers = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]
        producing = asyncio.ensure_future(self._produce(send))
        listening = asyncio.ensure_future(disconnect(receive))
        try:
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await asyncio.wait({producing, listening}, return_when=asyncio.FIRST_COMPLETED)
        except OSError:
            pass
        finally:
            for task in (producing, listening):
                task.cancel()
            await asyncio.gather(producing, listening, return_exceptions=True)
            for choice in self.choices:
                if not choice.sequence.finished:
                    self.live.abort(choice.sequence)
