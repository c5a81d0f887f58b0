"""Sending one planned stream at its target times, and the ground truth of what was sent: a
request's Truth, stamped on the perf_counter clock right after each piece was handed to the
transport."""

from __future__ import annotations

import asyncio
import statistics
import time
from array import array
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from simulator.server import Responder
from simulator.wire import ABORT, ANSWER, END, FRAME, Step

# A timer may fire up to this early (uvloop timers have 1 ms resolution); earlier, it re-arms.
EARLY_S = 0.0002
_clock = time.perf_counter


@dataclass
class Truth:
    """What the server did for one request, on the perf_counter clock (seconds)."""

    id: str
    provider: str
    model: str
    http_version: str
    received_at: float
    status: int = 200
    stream: bool = False
    headers_sent_at: float | None = None
    first_token_at: float | None = None
    first_answer_token_at: float | None = None
    last_token_at: float | None = None
    end_at: float | None = None
    output_tokens: int = 0  # billed (as usage reports them), so far
    reasoning_tokens: int = 0  # billed reasoning, shown or hidden
    streamed_tokens: int = 0  # sent to the client (a whole body: the tokens it shows)
    hidden_tokens: int = 0  # billed but never sent (hidden reasoning, unsummarized thinking)
    input_tokens: int = 0
    cached_tokens: int = 0
    cache_creation_tokens: int = 0
    service_tier: str | None = None
    server_ms: float | None = None  # the provider's own time, as its response reports it
    correct: bool | None = None
    faults: list[str] = field(default_factory=list)
    # The request's settings as its model profile read them (Responses: store, obfuscation;
    # Gemini: chunk_tokens; Bedrock: latency).
    options: dict[str, Any] = field(default_factory=dict)
    planned_ttft_ms: float | None = None
    planned_tokens_per_s: float | None = None
    token_times: array[float] = field(default_factory=lambda: array("d"))
    send_lags_ms: array[float] = field(default_factory=lambda: array("d"))

    def to_json(self) -> dict[str, Any]:
        data = {k: v for k, v in self.__dict__.items() if not isinstance(v, array)}
        data["token_times"] = self.token_times.tolist()
        lags = self.send_lags_ms
        data["send_lag_p50_ms"] = statistics.median(lags) if lags else None
        data["send_lag_max_ms"] = max(lags) if lags else None
        return data


class Player:
    """Sends one stream's steps at their target times, driven by loop timers.

    Callbacks rather than a coroutine per token: at 25k tokens/s an `await asyncio.sleep` per
    token (a future, a task step) costs more than the send itself.
    """

    def __init__(
        self,
        responder: Responder,
        steps: Iterator[Step],
        truth: Truth,
        lags: deque[float],
        hidden_before: list[int] | None = None,
        final: tuple[int, int, int] | None = None,
    ) -> None:
        self.responder = responder
        self.steps = steps
        self.truth = truth
        self.lags = lags
        # Billed tokens generated unseen before each sent token, and the totals (output,
        # reasoning, hidden) to record when the stream completes.
        self.hidden_before = hidden_before
        self.final = final
        self.last_sent = 0.0
        self.loop = asyncio.get_running_loop()
        self.done: asyncio.Future[None] = self.loop.create_future()
        self.step: Step | None = None
        self.handle: asyncio.TimerHandle | asyncio.Handle | None = None
        responder.on_close(self._closed)

    def start(self) -> None:
        self.handle = self.loop.call_soon(self._run)

    def _closed(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
        self._finish()

    def _finish(self) -> None:
        if not self.done.done():
            self.done.set_result(None)

    def _run(self) -> None:
        self.handle = None
        responder, truth, steps = self.responder, self.truth, self.steps
        write = responder.write
        while not responder.closed:
            step = self.step
            if step is None:
                step = self.step = next(steps, None)
                if step is None:
                    return self._end()
            at, data, kind = step
            if at is not None:
                wait = at - _clock()
                if wait > EARLY_S:
                    self.handle = self.loop.call_later(wait, self._run)
                    return None
            self.step = None
            if kind == FRAME:
                write(data)
                continue
            if kind >= END:
                if kind == END:
                    return self._end()
                if kind == ABORT:
                    truth.end_at = _clock()
                    responder.abort()
                return None  # STALL: send nothing more; done when the client leaves
            # A token step without bytes came in the previous step's chunk (a chunk of many
            # tokens, Gemini): it arrived when that chunk did.
            sent = write(data) if data else self.last_sent
            self.last_sent = sent
            if at is not None:
                lag_ms = (sent - at) * 1000.0
                self.lags.append(lag_ms)
                truth.send_lags_ms.append(lag_ms)
            truth.token_times.append(sent)
            if truth.first_token_at is None:
                truth.first_token_at = sent
            if kind == ANSWER:
                if truth.first_answer_token_at is None:
                    truth.first_answer_token_at = sent
            else:
                truth.reasoning_tokens += 1
            truth.last_token_at = sent
            truth.output_tokens += 1
            if self.hidden_before is not None:
                hidden = self.hidden_before[truth.streamed_tokens]
                truth.hidden_tokens += hidden
                truth.reasoning_tokens += hidden
                truth.output_tokens += hidden
            truth.streamed_tokens += 1
        return None

    def _end(self) -> None:
        if self.final is not None:
            truth = self.truth
            truth.output_tokens, truth.reasoning_tokens, truth.hidden_tokens = self.final
        # Stamped just before the last bytes are handed over (Responder.end), like every other
        # stamp: a stamp taken after could come later than the client saw them arrive.
        self.truth.end_at = self.responder.end()
        self._finish()
