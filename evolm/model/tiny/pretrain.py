"""A short, deterministic language-model warm-up for the tiny model.

Random weights only ever repeat one token, so a random tiny model never stops and every LoRA
perturbation looks alike to a reward. A few hundred AdamW steps on the built-in corpus (1-3 lines
per document, each ended by ``<|im_end|>``) give a model that writes text of varied length and
then stops: a miniature of a verbose instruct model, which is what ES fine-tuning starts from.
"""

from __future__ import annotations

import logging
import math
import random
import time

import torch
from tokenizers import Tokenizer
from torch import nn

from evolm.model.tiny.corpus import WORDS, build_corpus
from evolm.model.tiny.eta import Eta, duration, step_work
from evolm.model.tiny.warmup import NoWarmup, WarmupData, answer_documents

VERBOSE_SHARE = 0.6
VERBOSE = (
    "That is a good question. Let me think about it step by step before I give the answer.",
    "Here is a detailed explanation, with every step written out so that it is easy to follow.",
    "Let me explain this carefully, because the answer depends on a few simple facts.",
)

COUNTDOWN_BATCH = 16
COUNTDOWN_SEQ_LEN = 192  # the paper prompt is ~137 tokens, a worked answer ~30-45
SHORT_SEQ_LEN = 80  # the short prompt is ~30 tokens
SHORT_BATCH = 32
SHORT_SEED_OFFSET = 7919
FULL_PROMPT_EVERY = 3  # every 3rd countdown step uses the task's full prompt, the rest the short

logger = logging.getLogger(__name__)


def documents(tok: Tokenizer, end_id: int, count: int, seq_len: int, seed: int) -> torch.Tensor:
    """``count`` token rows of ``seq_len + 1`` (-100 padded): a question, then either a terse
    answer or one of a few fixed verbose sentences, then the end token."""
    rng = random.Random(seed)
    lines = [line for line in build_corpus(0) if line.strip() and "\n" not in line]
    questions = [line for line in lines if line.rstrip().endswith(("?", "=", ":"))]
    terse = [w.capitalize() + "." for w in WORDS[:40]] + [f"{n}." for n in range(20)]
    rows = torch.full((count, seq_len + 1), -100, dtype=torch.long)
    for i in range(count):
        answer = rng.choice(VERBOSE) if rng.random() < VERBOSE_SHARE else rng.choice(terse)
        ids = ([*tok.encode(f"{rng.choice(questions)} {answer}").ids, end_id])[: seq_len + 1]
        rows[i, : len(ids)] = torch.tensor(ids)
    return rows


def qa_loss(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy over rows of ``seq_len + 1`` tokens padded with -100."""
    inputs = batch[:, :-1].clamp(min=0)
    mask = batch[:, :-1] >= 0
    logits = model(input_ids=inputs, attention_mask=mask.long()).logits
    return nn.functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())


def answer_loss(model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over the labelled positions only: the LM head (half the compute of this
    model, with its 2,048-token vocabulary) runs only where ``labels != -100``. Rows are right
    padded, so causal attention needs no mask."""
    hidden = model.model(input_ids=inputs).last_hidden_state
    keep = labels != -100
    return nn.functional.cross_entropy(model.lm_head(hidden[keep]), labels[keep])


def is_countdown_step(step: int, share: float) -> bool:
    """Whether warm-up ``step`` trains on countdown documents: ``share`` of all steps, spread
    evenly (step ``s`` is one when ``floor((s + 1) * share) > floor(s * share)``)."""
    return math.floor((step + 1) * share) > math.floor(step * share)


def schedule(plan: list[bool]) -> list[str]:
    """The kind of every step: the short countdown steps first (copying the numbers forms only
    in a block of them, not interleaved with other text), then the question/answer steps with
    every ``FULL_PROMPT_EVERY``-th countdown step on the full prompt spread among them."""
    n_count = sum(plan)
    n_full = (n_count + FULL_PROMPT_EVERY - 1) // FULL_PROMPT_EVERY
    n_short = n_count - n_full
    # the first n_short countdown slots become the opening block; the rest keep their places
    kinds = ["short"] * n_short
    skipped = 0
    for countdown in plan:
        if countdown and skipped < n_short:
            skipped += 1
            continue
        kinds.append("full" if countdown else "qa")
    return kinds


def pretrain(
    model: nn.Module,
    tok: Tokenizer,
    end_id: int,
    steps: int,
    seed: int,
    countdown_share: float = 0.0,
    countdown_untagged: float = 0.0,
    warmup: WarmupData | None = None,
    batch_size: int = 16,
    seq_len: int = 64,
    countdown_batch_size: int = COUNTDOWN_BATCH,
    countdown_seq_len: int = COUNTDOWN_SEQ_LEN,
    lr: float = 3e-3,
) -> float:
    """Train ``model`` in place for ``steps`` AdamW steps; returns the final loss.

    A ``countdown_share`` of the steps (spread evenly) train on the ``warmup`` data's documents
    (:mod:`evolm.model.tiny.warmup`; the countdown task's, passed in from above), the others on the
    question/answer documents; a ``countdown_untagged`` share of the countdown answers leave
    out the ``<answer>`` block.
    """
    if steps == 0:
        return float("nan")
    plan = [is_countdown_step(s, countdown_share) for s in range(steps)]
    n_count = sum(plan)
    if n_count and warmup is None:
        raise ValueError(
            f"countdown_share={countdown_share} needs the warm-up data: pass warmup= (the "
            "countdown task's, evolm.task.countdown.warmup.CountdownWarmup)"
        )
    start = time.perf_counter()
    logger.info(
        "tiny model warm-up: %d steps (%d on countdown); preparing their documents", steps, n_count
    )
    pairs = NoWarmup() if warmup is None else warmup
    data = documents(tok, end_id, (steps - n_count) * batch_size, seq_len, seed)
    n_full = (n_count + FULL_PROMPT_EVERY - 1) // FULL_PROMPT_EVERY
    batches = {
        "qa": (data, data, batch_size),  # rows of seq_len + 1, -100 padded: see qa_loss
        "full": (
            *answer_documents(
                tok,
                end_id,
                pairs,
                n_full * countdown_batch_size,
                countdown_seq_len,
                seed,
                untagged=countdown_untagged,
            ),
            countdown_batch_size,
        ),
        "short": (
            *answer_documents(
                tok,
                end_id,
                pairs,
                (n_count - n_full) * SHORT_BATCH,
                SHORT_SEQ_LEN,
                seed + SHORT_SEED_OFFSET,  # other puzzles than the full-prompt documents'
                short=True,
                untagged=countdown_untagged,
            ),
            SHORT_BATCH,
        ),
    }
    model.train()
    kinds = schedule(plan)
    n_short = kinds.count("short")
    loss = torch.tensor(float("nan"))
    used = dict.fromkeys(batches, 0)
    done, report_every = 0, max(1, steps // 10)  # a log line every 10% of the steps
    seq = {"qa": seq_len, "full": countdown_seq_len, "short": SHORT_SEQ_LEN}
    eta = Eta(kinds, {k: step_work(batches[k][2], seq[k]) for k in batches})
    # two phases, each with its own one-cycle schedule: the short countdown block, then the rest
    for phase in (kinds[:n_short], kinds[n_short:]):
        if not phase:
            continue
        # fused: its square root is the CPU's own (ATen's vectorized one); the unfused step's
        # torch.sqrt goes to MKL's vector math, which rounds differently on Intel and AMD
        opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, fused=True)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=len(phase))
        for kind in phase:
            began = time.perf_counter()
            inputs, labels, size = batches[kind]
            k = used[kind]
            used[kind] += 1
            x, y = inputs[k * size : (k + 1) * size], labels[k * size : (k + 1) * size]
            loss = qa_loss(model, x) if kind == "qa" else answer_loss(model, x, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            done += 1
            eta.step(kind, time.perf_counter() - began)
            if done % report_every == 0 and done < steps:
                logger.info(
                    "tiny model warm-up: step %d/%d, loss %.3f, %s so far, about %s left",
                    *(done, steps, loss.item(), duration(time.perf_counter() - start)),
                    duration(eta.seconds_left()),
                )
    model.eval()
    logger.info(
        "tiny model warm-up: %d steps (%d on countdown), final loss %.3f, %s",
        steps,
        n_count,
        loss.item(),
        duration(time.perf_counter() - start),
    )
    return loss.item()
