"""Where two greedy runs' answers part, was the reference's choice a near-tie? (issue 37)

Speculative decoding's verify step computes the same model with other GEMM shapes than a plain
decode step, so in bf16 its logits differ from the plain step's by rounding. Greedy output then
changes only where the top two logits are closer than that rounding: the issue asks for >= 99.5%
of rows identical "with any difference only at a near-tie of the reference logits". This reads
two runs' saved eval answers (``samples/<set>/gen-N.jsonl``: the prompt as the model saw it
and the completion; save them all with ``callbacks.samples.count`` >= the eval's size) and, for
each row whose completions differ, takes the first token where they part and scores it with an
outside reference (transformers + peft, the adapter the runs evaluated at that generation):

- ``gap_a`` / ``gap_b``: how far below the reference's top logit each run's token lies (a
  completion that ended there: its best end-of-sequence token; ``ended_a`` / ``ended_b``);
- ``margin_pct``: the percentage of that row's shared-text positions whose top-two margin is
  smaller than ``|logit_a - logit_b|`` (a near-tie is near 0).

Where both runs saved their completions' token ids (``callbacks.samples.token_ids=true``, the
local engine), those are compared; else the completions are tokenized again: a row whose text
does not decode back to itself is listed as ``unscored``, and where neither token is the
reference's top one the re-tokenized ids may differ from the generated ones (it is logged).

    python -m benchmarks.near_ties RUN_A RUN_B MODEL_DIR ADAPTER_DIR [--gen N] [--dtype D]
        [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from evolm.engine.base import eos_ids

log = logging.getLogger("benchmarks.near_ties")


@dataclass(frozen=True)
class Parting:
    """One row whose two completions differ, scored at the first token where they part."""

    set: str  # the eval set ("": the test set)
    row: int
    token: int  # index into the completions' tokens of the first difference
    of_tokens: tuple[int, int]  # each completion's token count
    a: str  # run A's token there ("" where its completion ended: ended_a)
    b: str
    ended_a: bool
    ended_b: bool
    gap_a: float  # top logit - run A's token's logit (the reference's)
    gap_b: float
    rank_a: int  # 0: the reference's own choice
    rank_b: int
    margin_pct: float | None  # see the module's docstring; None when they part at token 0
    prefix_agrees: float | None  # share of the shared tokens that are the reference's argmax


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first index where token lists ``a`` and ``b`` differ (one ending counts); None if
    equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def read_samples(run: Path, gen: int) -> dict[str, list[dict[str, Any]]]:
    """A run's saved eval answers at generation ``gen`` (``gen-<gen>.jsonl``, zero-padded to
    the run's width): the test set's (``""``) and each extra eval set's by name."""
    root = run / "samples"
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: no saved eval answers (a run directory has samples/)")
    found: dict[str, list[dict[str, Any]]] = {}
    for name, d in [("", root)] + [(d.name, d) for d in sorted(root.iterdir()) if d.is_dir()]:
        for f in d.glob("gen-*.jsonl"):
            number = f.stem.removeprefix("gen-")
            if number.isdigit() and int(number) == gen:
                found[name] = [json.loads(line) for line in f.read_text().splitlines()]
    return found


def _ids(tokenizer: Any, text: str) -> list[int] | None:
    """``text``'s tokens, or None where they do not decode back to it."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return ids if tokenizer.decode(ids) == text else None


@torch.inference_mode()
def parting(
    model: Any,
    tokenizer: Any,
    prompt: str,
    a: str,
    b: str,
    where: tuple[str, int],
    ids: tuple[list[int], list[int]] | None = None,
) -> Parting | None:
    """The :class:`Parting` of completions ``a`` and ``b`` of ``prompt`` (equal: None), by
    their generated token ``ids`` where given, else their texts tokenized again (then a
    ValueError where one does not tokenize back to its text)."""
    ids_a, ids_b = ids if ids is not None else (_ids(tokenizer, a), _ids(tokenizer, b))
    if ids_a is None or ids_b is None:
        raise ValueError("a completion does not tokenize back to its text")
    t = first_difference(ids_a, ids_b)
    if t is None:
        return None
    head = list(tokenizer(prompt)["input_ids"])
    if not head:
        raise ValueError("an empty prompt")
    ids = torch.tensor([head + ids_a[:t]], device=model.device)
    # the distributions after the prompt's last token and after each shared one: row j
    # predicts completion token j (row t: where the two part)
    logits = model(input_ids=ids, logits_to_keep=t + 1).logits[0].float()
    last, shared = logits[t], logits[:t]
    order = last.argsort(descending=True)
    eos = eos_ids(model, tokenizer)

    def chosen(toks: list[int]) -> tuple[int, bool]:  # the token there, or the best EOS
        if t < len(toks):
            return toks[t], False
        if not eos:
            raise ValueError("a completion ended, and the model names no end-of-sequence id")
        return max(eos, key=lambda e: float(last[e])), True

    (ta, ended_a), (tb, ended_b) = chosen(ids_a), chosen(ids_b)
    top = float(last.max())
    pair = abs(float(last[ta] - last[tb]))
    top2 = shared.topk(2, dim=-1).values
    margins = top2[:, 0] - top2[:, 1]
    target = torch.tensor([ids_a[:t]], device=shared.device)[0]
    found = Parting(
        set=where[0],
        row=where[1],
        token=t,
        of_tokens=(len(ids_a), len(ids_b)),
        a="" if ended_a else tokenizer.decode([ta]),
        b="" if ended_b else tokenizer.decode([tb]),
        ended_a=ended_a,
        ended_b=ended_b,
        gap_a=top - float(last[ta]),
        gap_b=top - float(last[tb]),
        rank_a=int((order == ta).nonzero()[0, 0]),
        rank_b=int((order == tb).nonzero()[0, 0]),
        margin_pct=100.0 * float((margins < pair).float().mean()) if t else None,
        prefix_agrees=float((shared.argmax(-1) == target).float().mean()) if t else None,
    )
    if min(found.rank_a, found.rank_b) > 0:
        log.warning(
            "%s row %d: neither token is the reference's top one (the re-tokenized ids may not "
            "be the generated ones)", where[0] or "test", where[1],
        )  # fmt: skip
    return found


def compare(
    run_a: Path, run_b: Path, model: Any, tokenizer: Any, gen: int = 0
) -> tuple[dict[str, tuple[int, int]], list[Parting], list[tuple[str, int]]]:
    """Per eval set (``""``: the test set) ``(identical, rows)``, every differing row's
    :class:`Parting`, and the differing rows that could not be scored ``(set, row)``."""
    sa, sb = read_samples(run_a, gen), read_samples(run_b, gen)
    if set(sa) != set(sb) or not sa:
        names = sorted(sa), sorted(sb)
        raise ValueError(f"the runs saved other eval sets at generation {gen}: {names}")
    counts: dict[str, tuple[int, int]] = {}
    found: list[Parting] = []
    unscored: list[tuple[str, int]] = []
    for name, rows in sa.items():
        other = sb[name]
        if [r["prompt"] for r in rows] != [r["prompt"] for r in other]:
            raise ValueError(f"eval set {name or 'test'!r}: the runs' prompts differ")
        same = 0
        for i, (x, y) in enumerate(zip(rows, other, strict=True)):
            if x["completion"] == y["completion"]:
                same += 1
                continue
            prompt, ours, theirs = x["prompt"], x["completion"], y["completion"]
            saved = "token_ids" in x and "token_ids" in y  # the engine's own ids
            ids = (x["token_ids"], y["token_ids"]) if saved else None
            try:
                p = parting(model, tokenizer, prompt, ours, theirs, (name, i), ids)
            except ValueError as e:
                log.warning("%s row %d: not scored: %s", name or "test", i, e)
                unscored.append((name, i))
                continue
            if p is not None:  # None: two texts that tokenize alike (cannot happen)
                found.append(p)
        counts[name] = (same, len(rows))
    return counts, found, unscored


def load_reference(model_dir: str, adapter: str | None, dtype: torch.dtype) -> tuple[Any, Any]:
    """transformers + peft: the model (with ``adapter``, None: the base) and its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device)
    if adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter)
    return model.eval(), AutoTokenizer.from_pretrained(model_dir)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.near_ties",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("run_a", type=Path, help="one run's directory (with samples/): run A")
    p.add_argument("run_b", type=Path, help="the other run's directory: run B")
    p.add_argument(
        "model_dir", help="the model's transformers directory (evolm's converted one: "
        "$EVOLM_CACHE_DIR/models/<name>-<hash>, as the run's log names it)",
    )  # fmt: skip
    p.add_argument(
        "adapter", help="the PEFT adapter the runs evaluated at --gen (the start: lora.init_from; "
        "the last eval: the run's adapter/); '-': the base model",
    )  # fmt: skip
    p.add_argument("--gen", type=int, default=0, help="the eval's generation (default 0)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--json", type=Path, help="write the counts and partings here")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    adapter = None if args.adapter == "-" else args.adapter
    model, tokenizer = load_reference(args.model_dir, adapter, getattr(torch, args.dtype))
    counts, found, unscored = compare(args.run_a, args.run_b, model, tokenizer, args.gen)
    same, rows = (sum(c[i] for c in counts.values()) for i in (0, 1))
    for name, (s, n) in counts.items():
        log.info("%s: %d of %d answers identical", name or "test", s, n)
    log.info("in all: %d of %d (%.2f%%)", same, rows, 100.0 * same / max(rows, 1))
    for f in found:
        log.info(
            "%s row %d, token %d of %s: %r vs %r, below the top by %.4f / %.4f (ranks %d / %d); "
            "their margin under %s%% of the shared text's, its argmax the shared token at %s",
            f.set or "test", f.row, f.token, f.of_tokens, f.a, f.b, f.gap_a, f.gap_b,
            f.rank_a, f.rank_b, _pct(f.margin_pct), _pct(f.prefix_agrees, 100.0),
        )  # fmt: skip
    if args.json:
        out = {
            "run_a": str(args.run_a),
            "run_b": str(args.run_b),
            "model": args.model_dir,
            "adapter": args.adapter,
            "gen": args.gen,
            "dtype": args.dtype,
            "counts": counts,
            "partings": [asdict(f) for f in found],
            "unscored": unscored,
        }
        args.json.write_text(json.dumps(out, indent=1))
    return 0


def _pct(x: float | None, scale: float = 1.0) -> str:
    return "-" if x is None else f"{scale * x:.1f}"


if __name__ == "__main__":
    raise SystemExit(main())
