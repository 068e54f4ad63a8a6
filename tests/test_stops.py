"""Stop strings (``Sampling.stop``): the device automaton (evolm.engine.stops) and the local
engine's two paths. A generation with stop strings must return exactly the text of the same
generation without them, cut after the first stop string (:func:`cut_at_stop`), and stop early.
The server clients are checked against the SGLang stand-in and the real vLLM in their modules."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import AutoConfig, AutoTokenizer

from benchmarks.harness import from_model, with_options
from evolm.engine import stops as stops_module
from evolm.engine.local import LocalEngine
from evolm.engine.sampler import prefixes, row_lengths
from evolm.engine.stops import StopTable, byte_automaton, token_bytes
from evolm.engine.texts import decode_rows
from evolm.errors import ConfigError
from evolm.es import ES
from evolm.lora import LoraLayout, LoraPopulation, LoraSpec
from evolm.sampling import Sampling, cut_at_stop

PROMPTS = ["Solve: 3 + 5 =", "Is the sky blue?", "Name three colours of the rainbow, please."]


def test_cut_at_stop_takes_the_earliest_end() -> None:
    assert cut_at_stop("x </answer> y </answer>", ("</answer>",)) == ("x </answer>", True)
    assert cut_at_stop("abcd", ("cd", "b")) == ("ab", True)  # "b" ends first
    assert cut_at_stop("abcd", ("bcd", "cd")) == ("abcd", True)  # same end: same cut
    assert cut_at_stop("abc", ("x",)) == ("abc", False)
    assert cut_at_stop("abc", ()) == ("abc", False)


def test_bad_stop_strings_name_the_key() -> None:
    for bad in ("</answer>", [""], ["x" * 65], [str(i) for i in range(9)], [3]):
        with pytest.raises(ConfigError, match="stop"):
            Sampling(8, stop=bad)  # type: ignore[arg-type]


def test_byte_automaton_finds_every_first_occurrence() -> None:
    """Overlapping patterns (one a prefix, a suffix or inside another): the automaton reaches
    its absorbing state exactly at the first byte where some pattern has just ended."""
    patterns = ["aab", "ab", "bca", "abcab", "cc"]
    delta, done = byte_automaton(patterns)
    rng = random.Random(0)
    for _ in range(2000):
        text = "".join(rng.choice("abc") for _ in range(rng.randrange(1, 12)))
        state, at = 0, None
        for i, b in enumerate(text.encode()):
            state = delta[state][b]
            if state == done:
                at = i
                break
        ends = [text.find(p) + len(p) - 1 for p in patterns if p in text]
        assert at == (min(ends) if ends else None), text


def test_token_automaton_stops_at_the_first_token_holding_a_stop(tiny_model_dir: str) -> None:
    """Texts tokenized by the tiny model's byte-level BPE (tokens that straddle a stop string,
    multi-byte characters): the table's state is ``done`` at the first token whose prefix
    decodes to a text holding a stop string, never before."""
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    stop = ("</answer>", "ab", "b c", "\n\n", "é!")
    table = StopTable.build(stop, token_bytes(tok, len(tok)) or [], torch.device("cpu"))
    frags = ["</ans", "wer>", "</answer>", "a", "b", " ", "c", "\n", "é", "!", "日本", "<answer>"]
    rng = random.Random(1)
    stopped = 0
    for _ in range(500):
        text = "".join(rng.choice(frags) for _ in range(rng.randrange(1, 20)))
        ids = tok(text, add_special_tokens=False)["input_ids"]
        state, at = torch.tensor(0), None
        for i, t in enumerate(ids):
            state = table.advance(state, torch.tensor(t))
            if int(state) == table.done:
                at = i
                break
        first = next(
            (i for i in range(len(ids)) if cut_at_stop(tok.decode(ids[: i + 1]), stop)[1]), None
        )
        assert at == first, text
        stopped += at is not None
    assert stopped > 100  # the fragments make stops common


@pytest.fixture(scope="module")
def engine(tiny_model_dir: str) -> LocalEngine:
    layout = LoraLayout.from_hf_config(AutoConfig.from_pretrained(tiny_model_dir), LoraSpec(rank=2))
    return LocalEngine(tiny_model_dir, layout, device="cpu")


def population(layout: LoraLayout, members: int) -> LoraPopulation:
    strategy = ES(population_size=members, sigma=0.5)
    state = strategy.init([torch.zeros(s) for s in layout.shapes()], seed=3)
    return LoraPopulation(layout, tuple(strategy.sample(state, strategy.ask(state))))


def stops_in(texts: list[list[str]]) -> tuple[str, ...]:
    """A stop string that some of ``texts`` hold and some do not (so rows of both kinds run
    side by side), and one that none holds."""
    flat = [t for member in texts for t in member]
    words = sorted({w for t in flat for w in t.split()})
    mixed = [w for w in words if 0 < sum(w in t for t in flat) < len(flat)]
    assert mixed, f"no word in some completions but not all: {flat}"
    return (mixed[0], "NEVER-GENERATED")


@pytest.mark.parametrize("path", ["fast", "capped", "hf", "speculative"])
def test_generation_with_stops_is_the_plain_one_cut(engine: LocalEngine, path: str) -> None:
    """Rows of several members, refilled slots (capped), the HF path and verify steps
    (speculative: every step of the stopped generation, in slots for 5 tokens of every row):
    the same texts as a plain generation cut at the first stop string, ``stopped`` where cut,
    fewer tokens."""
    if path == "hf":
        eng = from_model(engine.model, engine.layout, engine.tokenizer, fast=False)
    elif path == "speculative":
        eng = with_options(engine, speculate=4, speculate_rows=1000)
        eng.generate(PROMPTS * 5, population(engine.layout, 2), Sampling(24), seed=0)  # 30 slots
    else:
        eng = engine if path == "fast" else with_options(engine, max_batch_rows=4)
    try:
        pop = population(engine.layout, 2)
        plain = eng.generate(PROMPTS, pop, Sampling(24), seed=0)
        stop = stops_in(plain)
        cut = eng.generate(PROMPTS, pop, Sampling(24, stop=stop), seed=0)
        if path == "speculative":
            assert eng.last_timings["spec_steps"] == eng.last_timings["steps"]
            plain = engine.generate(PROMPTS, pop, Sampling(24), seed=0)  # without verify steps
        pairs = [
            (p, c) for pm, cm in zip(plain, cut, strict=True) for p, c in zip(pm, cm, strict=True)
        ]
        assert [str(c) for _, c in pairs] == [cut_at_stop(p, stop)[0] for p, _ in pairs]
        assert [c.stopped for _, c in pairs] == [cut_at_stop(p, stop)[1] for p, _ in pairs]
        stopped = [(p, c) for p, c in pairs if c.stopped]
        assert stopped and len(stopped) < len(pairs)
        assert all(c.tokens < p.tokens and not c.truncated for p, c in stopped)  # type: ignore[attr-defined]
        # token ids: exactly those that were generated up to the stop
        assert all(engine.tokenizer.decode(c.token_ids).startswith(str(c)) for _, c in stopped)  # type: ignore[attr-defined]
    finally:
        if path == "hf":
            engine.use_layout(engine.layout)  # the fast engine's own wrappers back


def test_rows_stop_early_on_the_device(engine: LocalEngine) -> None:
    """The fast path ends every row at its stop: decode steps fall with the stop strings."""
    pop = population(engine.layout, 2)
    plain = engine.generate(PROMPTS, pop, Sampling(24), seed=0)
    full_steps = engine.last_timings["steps"]
    every = tuple({t[:2] for member in plain for t in member if len(t) >= 2})
    cut = engine.generate(PROMPTS, pop, Sampling(24, stop=every), seed=0)
    assert all(c.stopped for member in cut for c in member)
    assert engine.last_timings["steps"] < full_steps / 2


def test_without_a_byte_level_tokenizer_texts_are_still_cut(
    engine: LocalEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No exact token bytes: no device table, the rows run on, the texts are cut the same."""
    pop = population(engine.layout, 2)
    plain = engine.generate(PROMPTS, pop, Sampling(24), seed=0)
    stop = stops_in(plain)
    want = [[cut_at_stop(t, stop)[0] for t in member] for member in plain]
    monkeypatch.setattr(stops_module, "token_bytes", lambda tokenizer, vocab: None)
    fresh = from_model(engine.model, engine.layout, engine.tokenizer)
    try:
        got = fresh.generate(PROMPTS, pop, Sampling(24, stop=stop), seed=0)
        assert fresh.texts.stop_table(stop) is None
        assert [[str(t) for t in m] for m in got] == want
        ids = [c.token_ids for m in got for c in m if c.stopped]  # type: ignore[attr-defined]
        assert ids and all(cut_at_stop(engine.tokenizer.decode(i), stop)[1] for i in ids)
        assert all(not cut_at_stop(engine.tokenizer.decode(i[:-1]), stop)[1] for i in ids)
    finally:
        engine.use_layout(engine.layout)


@pytest.mark.parametrize("seed", range(4))
def test_rows_are_cut_at_eos_and_trailing_pads_on_the_device_as_row_by_row(seed: int) -> None:
    """The vectorised cut (only kept ids reach the host) equals the row-by-row reading: the
    tokens up to the first EOS, and that prefix's length without its trailing pads."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 6, (40, 17), generator=g)  # 4, 5 are EOS, 3 the pad: many of each
    tokens[::3, 9:] = 3  # rows stopped by a stop string: pads to the end
    tokens[1] = 0  # no EOS, no pad
    tokens[2] = 3  # nothing but pads
    ends, bodies = row_lengths(tokens, [4, 5], pad_id=3)
    kept = prefixes(tokens, ends)
    assert prefixes(tokens, bodies) == [ids[:n] for ids, n in zip(kept, bodies, strict=True)]
    for row, ids, body in zip(tokens.tolist(), kept, bodies, strict=True):
        cut = next((i for i, t in enumerate(row) if t in (4, 5)), len(row))
        assert ids == row[:cut]
        stripped = row[:cut]
        while stripped and stripped[-1] == 3:
            stripped = stripped[:-1]
        assert body == len(stripped)


@pytest.mark.parametrize("model", ["tiny", "smollm2"])
def test_rows_decode_as_batch_decode_does(
    model: str, request: pytest.FixtureRequest, tiny_model_dir: str
) -> None:
    """The Rust batch decode that completions use gives batch_decode's texts, byte for byte:
    random ids (special ids among them, rows of 0..300 ids), and a tokenizer that cleans up
    spaces after decoding goes through batch_decode itself."""
    path = tiny_model_dir if model == "tiny" else request.getfixturevalue("smollm2_dir")
    tokenizer = AutoTokenizer.from_pretrained(path)
    assert not tokenizer.clean_up_tokenization_spaces  # the fast path is taken
    rng = random.Random(0)
    special = list(tokenizer.all_special_ids)
    rows = [
        [rng.choice(special) if rng.random() < 0.05 else rng.randrange(len(tokenizer))
         for _ in range(rng.randrange(300))]
        for _ in range(64)
    ]  # fmt: skip
    assert decode_rows(tokenizer, rows) == tokenizer.batch_decode(rows, skip_special_tokens=True)
    tokenizer.clean_up_tokenization_spaces = True
    spaced = [tokenizer.encode("a , b . c 's", add_special_tokens=False)]
    expected = tokenizer.batch_decode(spaced, skip_special_tokens=True)
    assert decode_rows(tokenizer, spaced) == expected
