"""Stop strings on the device: a token-level automaton that ends a row the step its text first
holds a stop string, with no host sync and no detokenization while decoding.

The stop strings (:attr:`evolm.sampling.Sampling.stop`) are compiled into an Aho-Corasick
automaton over bytes (its states: the longest prefix of some stop string that the text ends
with; one absorbing state, :attr:`StopTable.done`, once any stop string has appeared). Each
token's bytes are then run through it once per state, giving a table ``[states, vocab]``: a
decode step advances every row's state with one gather, ``state = table[state, token]``, and a
row is done when its state is ``done``. Matching bytes is matching text: for a byte-level BPE
(GPT-2, Qwen, Llama 3, SmolLM2) the decoded text is the UTF-8 decoding of the concatenated token
bytes, and a UTF-8 string occurs in a UTF-8 byte stream exactly where its bytes do.

What the automaton decides is only *when to stop*; the text every engine returns is the decoded
completion cut by :func:`evolm.sampling.cut_at_stop`. A tokenizer whose token bytes are not known
exactly (no byte-level decoder) gets no table: its rows run to their EOS or budget and the text is
still cut, so the result is the same, only without the saving.
"""

from __future__ import annotations

import functools
import json
import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

log = logging.getLogger(__name__)


@functools.cache
def byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet back to bytes: the inverse of ``bytes_to_unicode``."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


def token_bytes(tokenizer: Any, vocab: int) -> list[bytes] | None:
    """The bytes each of the ``vocab`` token ids adds to a decoded text (``skip_special_tokens``:
    special tokens add none; ids past the tokenizer's add none), or None when the tokenizer is
    not byte-level (its bytes per token are not exact)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    decoder = json.loads(backend.to_str()).get("decoder") or {}
    if decoder.get("type") != "ByteLevel":
        return None
    table = byte_decoder()
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    pieces = tokenizer.convert_ids_to_tokens(list(range(min(vocab, len(tokenizer)))))
    out: list[bytes] = []
    for i, piece in enumerate(pieces):
        token = added.get(i)
        if token is not None:
            out.append(b"" if token.special else token.content.encode())
        elif piece is None or any(c not in table for c in piece):
            return None  # not a byte-level piece after all
        else:
            out.append(bytes(table[c] for c in piece))
    return out + [b""] * (vocab - len(out))


def byte_automaton(stops: Sequence[str]) -> tuple[list[list[int]], int]:
    """The Aho-Corasick automaton of ``stops`` over bytes, as a full transition table
    ``delta[state][byte]`` whose last state is absorbing: reached as soon as any stop string
    has occurred (every state whose text ends with one goes there). Returns (delta, done)."""
    goto: list[dict[int, int]] = [{}]
    accept = [False]
    for stop in stops:
        state = 0
        for b in stop.encode():
            if b not in goto[state]:
                goto.append({})
                accept.append(False)
                goto[state][b] = len(goto) - 1
            state = goto[state][b]
        accept[state] = True
    fail = [0] * len(goto)
    delta = [[0] * 256 for _ in goto]
    queue: deque[int] = deque()
    for b in range(256):
        child = goto[0].get(b)
        if child is not None:
            delta[0][b] = child
            queue.append(child)
    while queue:  # breadth first: a state's failure link is settled before its children's
        state = queue.popleft()
        accept[state] = accept[state] or accept[fail[state]]
        for b in range(256):
            child = goto[state].get(b)
            if child is None:
                delta[state][b] = delta[fail[state]][b]
            else:
                fail[child] = delta[fail[state]][b]
                delta[state][b] = child
                queue.append(child)
    done = len(goto)
    table = [[done if accept[t] else t for t in row] for row in delta] + [[done] * 256]
    return table, done


@dataclass(frozen=True)
class StopTable:
    """``table [states, vocab]`` (int64, on the engine's device): a row's state after a token;
    ``done``: the state once a stop string has occurred; rows start in state 0."""

    table: Tensor
    done: int

    @classmethod
    def build(
        cls, stops: Sequence[str], tokens: Sequence[bytes], device: torch.device
    ) -> StopTable:
        """Run every token's bytes through :func:`byte_automaton` from every state (vectorized:
        tokens longest first, step ``j`` advances the tokens longer than ``j``)."""
        delta_rows, done = byte_automaton(stops)
        delta = torch.tensor(delta_rows, dtype=torch.long)
        order = sorted(range(len(tokens)), key=lambda i: -len(tokens[i]))
        width = len(tokens[order[0]]) if tokens else 0
        data = torch.zeros(len(tokens), max(1, width), dtype=torch.uint8)
        lengths = torch.zeros(len(tokens), dtype=torch.long)
        for row, i in enumerate(order):
            if tokens[i]:
                data[row, : len(tokens[i])] = torch.frombuffer(
                    bytearray(tokens[i]), dtype=torch.uint8
                )
            lengths[row] = len(tokens[i])
        longer = [int((lengths > j).sum()) for j in range(width)]  # tokens with a byte j
        cur = torch.arange(len(delta_rows))[:, None].repeat(1, len(tokens))
        for j, n in enumerate(longer):
            cur[:, :n] = delta[cur[:, :n], data[:n, j].long()]
        table = torch.empty_like(cur)
        table[:, torch.tensor(order, dtype=torch.long)] = cur
        return cls(table.to(device), done)

    def advance(self, state: Tensor, token: Tensor) -> Tensor:
        """Each row's state after its ``token``."""
        return self.table[state, token]


def stop_table(
    tokenizer: Any, vocab: int, stops: Sequence[str], device: torch.device
) -> StopTable | None:
    """The :class:`StopTable` of ``stops`` for this tokenizer, or None (no stop strings, or a
    tokenizer that is not byte-level: see the module docstring)."""
    if not stops:
        return None
    tokens = token_bytes(tokenizer, vocab)
    if tokens is None:
        log.info(
            "stop strings %s: the tokenizer is not byte-level, so rows run to their EOS or budget "
            "and the texts are cut after generation (the same texts, without the saving)",
            list(stops),
        )
        return None
    return StopTable.build(stops, tokens, device)
