"""Token ids <-> texts for the local engine, shared by both of its paths: the model's EOS and pad
ids, completions from new tokens (cut at the EOS and the stop strings) and the stop strings'
device automata (:mod:`evolm.engine.stops`)."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

import torch

from evolm.engine.base import Completion, eos_ids
from evolm.engine.sampler import prefixes, row_lengths
from evolm.engine.stops import StopTable, stop_table
from evolm.sampling import cut_at_stop

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


def decode_rows(tokenizer: PreTrainedTokenizerBase, rows: list[list[int]]) -> list[str]:
    """``tokenizer.batch_decode(rows, skip_special_tokens=True)``, through the Rust tokenizer's
    parallel batch decode where that gives the same texts (a fast tokenizer that does not clean
    up spaces after decoding): transformers decodes one row at a time in Python, 3.1 s for
    6,000 rows of ~700 tokens where the batch decode takes 0.8 s on 2 cores (less with more)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or getattr(tokenizer, "clean_up_tokenization_spaces", True):
        return tokenizer.batch_decode(rows, skip_special_tokens=True)
    return backend.decode_batch(rows, skip_special_tokens=True)


class Texts:
    """The tokenizer's side of a loaded model (``tokenizer`` None: token ids only, no texts).

    ``eos_ids``: the generation config's EOS ids and the tokenizer's; ``pad_id``: the tokenizer's
    pad id, else the first EOS id."""

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None) -> None:
        self.tokenizer = tokenizer
        self.device = model.device
        self.vocab = model.get_output_embeddings().weight.shape[0]
        self.eos_ids = eos_ids(model, tokenizer)
        pad = None if tokenizer is None else tokenizer.pad_token_id
        self.pad_id: int = pad if pad is not None else (self.eos_ids[0] if self.eos_ids else 0)
        self._special_ids = set() if tokenizer is None else set(tokenizer.all_special_ids)
        self._stop_tables: dict[tuple[str, ...], StopTable | None] = {}

    def encode(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-padded ``(input_ids, attention_mask)`` of ``prompts``."""
        assert self.tokenizer is not None, "texts need a tokenizer"
        enc = self.tokenizer(prompts, return_tensors="pt", padding=True)
        return enc["input_ids"], enc["attention_mask"]

    def completions(self, tokens: torch.Tensor, stop: tuple[str, ...] = ()) -> list[str]:
        """The texts of new tokens ``[rows, steps]`` (each row up to its first EOS, then cut
        after its first stop string: :func:`~evolm.sampling.cut_at_stop`), as
        :class:`Completion` s: a row without an EOS or stop string ran out of budget
        (truncated)."""
        assert self.tokenizer is not None, "texts need a tokenizer"
        ends, bodies = row_lengths(tokens, self.eos_ids, self.pad_id)
        special = self.pad_id in self._special_ids  # trailing pads decode to nothing
        heads = prefixes(tokens, bodies if special else ends)
        texts = decode_rows(self.tokenizer, heads)
        steps = tokens.shape[1]
        exact = self.stop_table(stop) is not None  # rows ended at the stop: nothing to search
        out: list[str] = []
        for row, (text, ids) in enumerate(zip(texts, heads, strict=True)):
            cut, stopped = cut_at_stop(text, stop)
            if stopped:  # after the stop, the row holds pad ids
                ids = ids[: bodies[row]]
                ids = ids if exact else self._stop_prefix(ids, stop)
            elif len(ids) < ends[row]:  # pads the model wrote itself: they are its tokens
                ids = tokens[row, : ends[row]].tolist()
            truncated = not stopped and len(ids) == steps
            out.append(Completion(cut, truncated=truncated, token_ids=ids, stopped=stopped))
        return out

    def _stop_prefix(self, ids: list[int], stop: tuple[str, ...]) -> list[int]:
        """The shortest prefix of ``ids`` (a row that ran on past its stop string, without its
        trailing pads) whose text holds a stop string: the tokens that were generated, found by
        bisection (a decode per step)."""
        assert self.tokenizer is not None
        lo, hi = 1, len(ids)  # the shortest prefix length with a stop string is in [lo, hi]
        if cut_at_stop(self.tokenizer.decode(ids[:-1], skip_special_tokens=True), stop)[1]:
            while lo < hi:
                mid = (lo + hi) // 2
                text = self.tokenizer.decode(ids[:mid], skip_special_tokens=True)
                lo, hi = (lo, mid) if cut_at_stop(text, stop)[1] else (mid + 1, hi)
        return ids[:hi]

    def stop_table(self, stop: tuple[str, ...]) -> StopTable | None:
        """The device automaton of the stop strings ``stop`` (:mod:`evolm.engine.stops`), built
        once per set of strings; None without stop strings or a byte-level tokenizer."""
        if stop not in self._stop_tables:
            table = None
            if self.tokenizer is not None:
                table = stop_table(self.tokenizer, self.vocab, stop, self.device)
            self._stop_tables[stop] = table
        return self._stop_tables[stop]


class RowDecoder:
    """Completions of one generation's rows, decoded while the engine still runs: pass
    :meth:`retired` as the scheduler's ``retired`` callback, then take :meth:`finish`.

    Rows are decoded on one worker thread, in batches of at least ``batch`` rows, as they finish:
    the Rust tokenizer's batch decode releases the GIL, and the engine's thread mostly waits on
    the device. Only the rows that finish last are left for :meth:`finish`. Each row's
    completion depends on its own tokens and the tensor's width alone, so the result equals
    :meth:`Texts.completions` of the whole tensor (tested)."""

    def __init__(self, texts: Texts, rows: int, stop: tuple[str, ...], batch: int) -> None:
        self.texts, self.rows, self.stop, self.batch = texts, rows, stop, max(1, batch)
        self._pending: list[int] = []
        self._parts: list[tuple[list[int], Future[list[Completion]]]] = []
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="evolm-detokenize")
        self.early = 0  # rows sent to the worker before the engine returned

    def retired(self, rows: list[int], tokens: torch.Tensor) -> None:
        """Rows ``rows`` of ``tokens`` are final: decode them once ``batch`` are waiting."""
        self._pending += rows
        if len(self._pending) >= self.batch:
            self.early += len(self._pending)
            self._submit(tokens)

    def finish(self, tokens: torch.Tensor) -> list[Completion]:
        """Every row's completion, in row order (``tokens``: the engine's returned tensor)."""
        try:
            self._submit(tokens)
            out: list[Completion | None] = [None] * self.rows
            for rows, part in self._parts:
                for row, completion in zip(rows, part.result(), strict=True):
                    out[row] = completion
        finally:
            self.close()
        missing = [row for row, c in enumerate(out) if c is None]
        if missing:
            raise RuntimeError(f"rows the engine never retired: {missing[:8]}")
        return out  # type: ignore[return-value]

    def close(self) -> None:
        """Stop the worker (after an error, too); idempotent."""
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _submit(self, tokens: torch.Tensor) -> None:
        if not self._pending:
            return
        rows, self._pending = self._pending, []
        index = torch.tensor(rows, dtype=torch.long, device=tokens.device)
        part = tokens.index_select(0, index).cpu()  # on this thread: ordered after the steps
        self._parts.append((rows, self._pool.submit(self.texts.completions, part, self.stop)))
