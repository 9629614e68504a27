"""The OpenAI API's shapes, checked: a request body becomes :class:`Params` or an :class:`ApiError` in OpenAI's
error shape (``{"error": {"message", "type", "param", "code"}}``), and the stop rules of a text are one
:class:`StopText` that a streamed and a whole answer share, so the two always agree.
"""
from __future__ import annotations

import math
import secrets
from dataclasses import dataclass

from ..poems import encode_prompt, unk_ids
from ..tokenizer import UnknownCharacterError

MAX_N = 8            # choices a request may ask for
MAX_STOPS = 4        # stop strings, as OpenAI
MAX_LOGPROBS = 20
SEED_MAX = 2**63 - 1


class ApiError(Exception):
    """A request the server refuses, with its HTTP status and OpenAI's error body."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error",
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.code = status, message, param, kind, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


@dataclass
class Params:
    """One completion request, checked: what to feed, how many tokens and choices, how to choose and stop."""
    prompt_ids: list[int]
    max_tokens: int
    temperature: float
    top_p: float | None
    top_k: int | None
    seed: int
    stop: tuple[str, ...]
    stop_token_ids: tuple[int, ...]
    banned: tuple[int, ...]
    n: int
    logprobs: int            # top log-probabilities a token (0: none)
    stream: bool
    include_usage: bool


def bad(param: str, message: str) -> ApiError:
    return ApiError(400, f"{param}: {message}", param)


def number(body: dict, name: str, default, low: float, high: float, allowed: str):
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not low <= value <= high:
        raise bad(name, f"must be {allowed}, got {value!r:.40}")
    return value


def whole(body: dict, name: str, default, low: int, high: int, allowed: str):
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise bad(name, f"must be {allowed}, got {value!r:.40}")
    return value


def flag(body: dict, name: str, default: bool = False) -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad(name, f"must be true or false, got {value!r:.40}")
    return value


def prompt_of(body: dict, tokenizer, chat: bool) -> list[int]:
    """The token ids to feed: the poem separator and the text (a completion's ``prompt``, or a chat's last user
    message), or a completion's list of token ids as they are."""
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise bad("messages", "must be a non-empty list of {\"role\", \"content\"} objects")
        users = [m for m in messages if m.get("role") == "user"]
        if not users:
            raise bad("messages", "must hold a message with role \"user\": its content is the poem's start")
        text, name = users[-1].get("content"), "messages"
    else:
        text, name = body.get("prompt", ""), "prompt"
        if isinstance(text, list) and len(text) == 1 and isinstance(text[0], str):
            text = text[0]
        if isinstance(text, list) and text and all(isinstance(t, int) and not isinstance(t, bool) for t in text):
            if not all(0 <= t < tokenizer.vocab_size for t in text):
                raise bad("prompt", f"token ids must be in [0, {tokenizer.vocab_size}), got {text!r:.60}")
            return list(text)
    if not isinstance(text, str):
        raise bad(name, f"must be a string (the start of a poem), got {type(text).__name__}")
    try:
        return encode_prompt(tokenizer, text)
    except UnknownCharacterError as err:
        raise bad(name, str(err)) from None
    except ValueError as err:
        raise bad(name, str(err)) from None


def params_of(body, tokenizer, block_size: int, chat: bool = False) -> Params:
    """A completion (``chat=False``) or chat completion body, checked; :class:`ApiError` names the bad parameter."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    prompt_ids = prompt_of(body, tokenizer, chat)
    room = block_size - len(prompt_ids)
    if room < 1:
        raise bad("prompt" if not chat else "messages",
                  f"the prompt takes {len(prompt_ids)} tokens; the model's block holds {block_size}")
    tokens_name = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = whole(body, tokens_name, room if chat else min(16, room), 1, room,
                       f"an int in [1, {room}] ({len(prompt_ids)} prompt tokens in a block of {block_size})")
    temperature = float(number(body, "temperature", 1.0, 0, 2, "a number in [0, 2]"))
    top_p = float(number(body, "top_p", 1.0, 0, 1, "a number in (0, 1]"))
    if top_p == 0:
        raise bad("top_p", "must be a number in (0, 1], got 0")
    top_k = whole(body, "top_k", -1, -1, tokenizer.vocab_size, f"an int in [1, {tokenizer.vocab_size}], or -1 for none")
    seed = whole(body, "seed", None, 0, SEED_MAX, f"an int in [0, {SEED_MAX}]")
    stop = body.get("stop")
    stop = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or len(stop) > MAX_STOPS or not all(isinstance(s, str) and s for s in stop):
        raise bad("stop", f"must be a non-empty string or a list of at most {MAX_STOPS}, got {body.get('stop')!r:.60}")
    n = whole(body, "n", 1, 1, MAX_N, f"an int in [1, {MAX_N}]")
    if chat:
        logprobs = whole(body, "top_logprobs", 0, 0, MAX_LOGPROBS, f"an int in [0, {MAX_LOGPROBS}]")
        logprobs = max(logprobs, 1) if flag(body, "logprobs") else 0
    else:
        logprobs = whole(body, "logprobs", 0, 0, MAX_LOGPROBS, f"an int in [0, {MAX_LOGPROBS}]")
    stream = flag(body, "stream")
    options = body.get("stream_options")
    if options is not None and (not stream or not isinstance(options, dict)):
        raise bad("stream_options", "is allowed only with \"stream\": true, as an object such as "
                                    "{\"include_usage\": true}")
    include_usage = flag(options or {}, "include_usage")
    banned = set(unk_ids(tokenizer))   # text for people never shows <unk>
    bias = body.get("logit_bias") or {}
    if not isinstance(bias, dict):
        raise bad("logit_bias", f"must be an object {{token id: -100}}, got {bias!r:.60}")
    for key, value in bias.items():
        if not str(key).isdigit() or not int(key) < tokenizer.vocab_size:
            raise bad("logit_bias", f"keys must be token ids in [0, {tokenizer.vocab_size}), got {key!r:.20}")
        if value != -100 or isinstance(value, bool):
            raise bad("logit_bias", f"only -100 (never write this token) is supported, got {value!r:.20} for {key}")
        banned.add(int(key))
    if len(banned) >= tokenizer.vocab_size - 1:
        raise bad("logit_bias", "must leave tokens to write")
    ends = () if flag(body, "ignore_eos") else (tokenizer.eos_id,)  # the poem separator ends the answer
    return Params(prompt_ids, max_tokens, temperature, None if top_p == 1 else top_p, None if top_k in (-1, 0) else top_k,
                  secrets.randbits(63) if seed is None else seed, tuple(stop), ends, tuple(sorted(banned)), n, logprobs,
                  stream, include_usage)


class StopText:
    """The text of one choice as its tokens arrive: a stop token writes no text, and a stop string ends the text
    just before it. Text that may still turn into a stop string is held back, so that what is streamed is
    exactly what a whole answer returns."""

    def __init__(self, tokenizer, stop: tuple[str, ...], stop_token_ids: tuple[int, ...]):
        from ..tokenizer import TextStream

        self.stream, self.stop, self.stop_token_ids = TextStream(tokenizer), stop, stop_token_ids
        self.held, self.stopped = "", False
        self.hold = max((len(s) for s in stop), default=1) - 1

    def push(self, token: int) -> str:
        """The text that can be shown after ``token`` ("" while held back or after a stop)."""
        if self.stopped:
            return ""
        if token in self.stop_token_ids:
            return self.finish()
        return self.release(self.held + self.stream.push(token))

    def finish(self) -> str:
        """The rest of the text once the tokens end."""
        if self.stopped:
            return ""
        out = self.release(self.held + self.stream.close(), final=True)
        self.stopped = True
        return out

    def release(self, text: str, final: bool = False) -> str:
        hits = [i for i in (text.find(s) for s in self.stop) if i >= 0]
        if hits:
            self.stopped, self.held = True, ""
            return text[: min(hits)]
        keep = 0 if final else min(self.hold, len(text))
        self.held = text[len(text) - keep:] if keep else ""
        return text[: len(text) - keep]
