"""kvlib: how a small GPT writes Tang poems one token at a time, and why the KV cache makes it fast."""
from .model import GPT, GPTConfig, KVCache

__all__ = ["GPT", "GPTConfig", "KVCache"]
