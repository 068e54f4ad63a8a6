"""Where two greedy runs' answers part, was the reference's choice a near-tie? (issue 37)

Speculative decoding's verify step computes the same model with other GEMM shapes than a plain
decode step, so in bf16 its logits differ from the plain step's by rounding. Greedy output then
changes only where the top two logits are closer than that rounding: the issue asks for >= 99.5%
of rows identical "with any difference only at a near-tie of the reference logits". This reads
two runs' saved eval answers (``samples/<set>/gen-NNN.jsonl``: the prompt as the model saw it
and the completion) and, for each row whose completions differ, takes the first token where
they part and scores it with an outside reference (transformers + peft, the run's adapter):

- ``gap_a`` / ``gap_b``: how far below the reference's top logit each run's token lies there;
- ``margin_pct``: where ``|logit_a - logit_b|`` falls among the top-two margins of every
  position of the same rows' shared text (what a near-tie is, measured on the same model).

The completions are tokenized again (the engine's ids are not saved); a row whose text does not
tokenize back to itself is reported, not scored.

    python -m benchmarks.near_ties RUN_A RUN_B MODEL_DIR ADAPTER_DIR [--gen 0] [--json OUT]
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

log = logging.getLogger("benchmarks.near_ties")


@dataclass(frozen=True)
class Parting:
    """One row whose two completions differ, scored at the first token where they part."""

    set: str
    row: int
    token: int  # index into the completions' tokens of the first difference
    of_tokens: tuple[int, int]  # each completion's token count
    a: str  # run A's token there ("" where its completion ended)
    b: str
    gap_a: float  # top logit - run A's token's logit (the reference's, fp32)
    gap_b: float
    rank_a: int  # 0: the reference's own choice
    rank_b: int
    margin_pct: float  # percentile of |logit_a - logit_b| among the shared text's top-2 margins
    prefix_agrees: float  # share of the shared tokens that are the reference's argmax too


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
    found: dict[str, list[dict[str, Any]]] = {}
    for name, d in [("", root)] + [(d.name, d) for d in sorted(root.iterdir()) if d.is_dir()]:
        for f in d.glob("gen-*.jsonl"):
            if int(f.stem.removeprefix("gen-")) == gen:
                found[name] = [json.loads(line) for line in f.read_text().splitlines()]
    return found


def _ids(tokenizer: Any, text: str) -> list[int] | None:
    """``text``'s tokens, or None where they do not decode back to it."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return ids if tokenizer.decode(ids) == text else None


def _margins(logits: torch.Tensor) -> torch.Tensor:
    """Top-1 minus top-2 logit at each position of ``logits [T, vocab]``."""
    top = logits.topk(2, dim=-1).values
    return top[:, 0] - top[:, 1]


@torch.inference_mode()
def parting(
    model: Any, tokenizer: Any, prompt: str, a: str, b: str, where: tuple[str, int]
) -> tuple[Parting | None, torch.Tensor]:
    """The :class:`Parting` of completions ``a`` and ``b`` of ``prompt`` (None: equal or not
    tokenizable back), and the top-2 margins along their shared tokens."""
    ids_a, ids_b = _ids(tokenizer, a), _ids(tokenizer, b)
    if ids_a is None or ids_b is None:
        log.warning("%s row %d: a completion does not tokenize back to its text", *where)
        return None, torch.empty(0)
    t = first_difference(ids_a, ids_b)
    if t is None:
        return None, torch.empty(0)
    head = list(tokenizer(prompt)["input_ids"])
    ids = torch.tensor([head + ids_a[:t]], device=model.device)
    logits = model(input_ids=ids).logits[0, len(head) - 1 :].float()  # [t + 1, vocab]
    margins = _margins(logits[:t])
    agrees = (logits[:t].argmax(-1).cpu() == torch.tensor(ids_a[:t])).float().mean().item()
    last = logits[t]
    eos = tokenizer.eos_token_id

    def chosen(toks: list[int]) -> int:  # the token there; the end of sequence where it ended
        return toks[t] if t < len(toks) else eos

    ta, tb = chosen(ids_a), chosen(ids_b)
    top = float(last.max())
    order = last.argsort(descending=True)
    pair = abs(float(last[ta] - last[tb]))
    pct = 100.0 * float((margins < pair).float().mean()) if len(margins) else float("nan")
    found = Parting(
        set=where[0],
        row=where[1],
        token=t,
        of_tokens=(len(ids_a), len(ids_b)),
        a=tokenizer.decode([ta]) if t < len(ids_a) else "",
        b=tokenizer.decode([tb]) if t < len(ids_b) else "",
        gap_a=top - float(last[ta]),
        gap_b=top - float(last[tb]),
        rank_a=int((order == ta).nonzero()[0, 0]),
        rank_b=int((order == tb).nonzero()[0, 0]),
        margin_pct=pct,
        prefix_agrees=agrees,
    )
    return found, margins.cpu()


def compare(
    run_a: Path, run_b: Path, model: Any, tokenizer: Any, gen: int = 0
) -> tuple[dict[str, tuple[int, int]], list[Parting]]:
    """Per eval set (``""``: the test set) ``(identical, rows)``, and every differing row's
    :class:`Parting`."""
    sa, sb = read_samples(run_a, gen), read_samples(run_b, gen)
    if set(sa) != set(sb) or not sa:
        raise ValueError(
            f"the runs saved other eval sets at generation {gen}: {sa.keys()} / {sb.keys()}"
        )
    counts, found = {}, []
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
            p, _ = parting(model, tokenizer, prompt, ours, theirs, (name, i))
            if p is not None:
                found.append(p)
        counts[name] = (same, len(rows))
    return counts, found


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
    p = argparse.ArgumentParser(prog="python -m benchmarks.near_ties", description=__doc__)
    p.add_argument("run_a", type=Path)
    p.add_argument("run_b", type=Path)
    p.add_argument("model_dir")
    p.add_argument("adapter", help="the runs' adapter at that generation; '-': the base model")
    p.add_argument("--gen", type=int, default=0, help="the eval's generation (default 0)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--json", type=Path, help="write the counts and partings here")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    adapter = None if args.adapter == "-" else args.adapter
    model, tokenizer = load_reference(args.model_dir, adapter, getattr(torch, args.dtype))
    counts, found = compare(args.run_a, args.run_b, model, tokenizer, args.gen)
    same, rows = (sum(c[i] for c in counts.values()) for i in (0, 1))
    for name, (s, n) in counts.items():
        log.info("%s: %d of %d answers identical", name or "test", s, n)
    log.info("in all: %d of %d (%.2f%%)", same, rows, 100.0 * same / max(rows, 1))
    for f in found:
        log.info(
            "%s row %d, token %d of %s: %r vs %r, below the top by %.4f / %.4f (ranks %d / %d), "
            "their margin at the %.1fth percentile of the shared text's; prefix argmax %.3f",
            f.set or "test", f.row, f.token, f.of_tokens, f.a, f.b, f.gap_a, f.gap_b,
            f.rank_a, f.rank_b, f.margin_pct, f.prefix_agrees,
        )  # fmt: skip
    if args.json:
        out = {"counts": counts, "partings": [asdict(f) for f in found], "dtype": args.dtype}
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
