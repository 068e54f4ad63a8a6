"""Shared prompt prefixes in prefill (``server.share_prefix``): a member's rows that begin with
the same tokens compute those tokens' K/V once.

An ES generation prefills every training prompt once per member: with worked examples before
each puzzle (issue 36's 0.5B runs: ``task.shots``), 560 prompt tokens a row (3 numbers, two
examples) or 827 (4 numbers, three), of which the first 462 are the same in every row (726
among the 4-number ones), and prefill took 2.55 s of a 5.4 s generation on an H100 (1,200 rows).
Within one prefill batch of the scheduler, each member's first row is a *donor*: prefilled
whole, as without sharing. Every later row of that member whose prompt shares at least
:data:`MIN_SHARED` tokens with one of its donors (the longest match of at most
:data:`MAX_DONORS`) copies the donor's K/V of those tokens into its own slot (shifted: rows are
left-padded to one width, so a shorter prompt starts further right) and prefills only the
positions after them, attending over the copied ones (:meth:`FastModel.prefill
<evolm.engine.fast.model.FastModel.prefill>` with ``past``). A chunk of such rows starts at the
least shared end among its rows; a row's tokens between its own shared end and that start are
computed again, with the same inputs.

The K/V a row reads are those of the same tokens at the same positions under the same adapter:
the same function of the prompt. Only the arithmetic's grouping differs (the donor's prefill
GEMMs, a shorter query block), so the first tokens equal plain prefill's up to a near-tie of
their logits, as speculative decoding's (the CPU tests compare the greedy tokens). Members
never share: each member's LoRA changes every layer's K/V. Donors stay in their slots for the
whole prefill batch, so nothing is held beyond the slots the planner sized. A row that shares
under :data:`DONOR_SHARE` of its tokens becomes a donor too while there is room (it copies what
it shares, and is prefilled before the rows that copy it), so a second kind of prompt (more
worked examples) gets its own.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from torch import Tensor

MIN_SHARED = 16
"""Tokens a row must share with a donor to copy them instead of computing them."""

MAX_DONORS = 4
"""Donors compared per member and prefill batch (a new prefix past them is prefilled whole)."""

DONOR_SHARE = 0.75
"""A row that shares less than this share of its tokens with every donor becomes a donor
itself while there is room (countdown's 4-number prompts, three worked examples, share 56% with
a 3-number one, two examples, and 88% with each other)."""


class Prompts:
    """The rows' prompt tokens on the host, once per generation call (left-padded ``ids``)."""

    def __init__(self, ids: Tensor, mask: Tensor) -> None:
        host, valid = ids.cpu().numpy(), mask.cpu().bool().numpy()
        self.width = host.shape[1]
        self.lengths = valid.sum(1).tolist()
        self.tokens = [row[self.width - n :] for row, n in zip(host, self.lengths, strict=True)]

    def start(self, row: int) -> int:
        """The row's first cache position (left padding before it)."""
        return self.width - self.lengths[row]


@dataclass(frozen=True)
class Shares:
    """Who shares what in one prefill batch (rows in the batch's order): ``donor[i]``, the
    index of row ``i``'s donor in the batch (-1: prefilled whole), ``end[i]``, the cache
    position up to which it copies the donor's K/V (its start + the tokens shared; 0: none),
    and ``depth[i]``: 0 for a row prefilled whole, its donor's + 1 (a donor's slot is complete
    before the rows that copy it are prefilled)."""

    donor: list[int]
    end: list[int]
    depth: list[int]

    def levels(self) -> list[list[int]]:
        """The rows of each depth, in batch order: prefilled one depth after the other."""
        out: list[list[int]] = [[] for _ in range(max(self.depth, default=0) + 1)]
        for i, d in enumerate(self.depth):
            out[d].append(i)
        return out


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """The number of leading tokens ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if differ.size else n


def plan_shares(prompts: Prompts, chosen: list[int], members: list[int] | None) -> Shares:
    """The :class:`Shares` of prefill batch ``chosen`` (row indices; ``members``: each row's
    member, None: one model for all). A row shares at most its length - 1 tokens: its last
    position's logits give its first token."""
    donors: dict[int, list[int]] = {}  # member -> indices into chosen
    donor, end, depth = [-1] * len(chosen), [0] * len(chosen), [0] * len(chosen)
    for i, row in enumerate(chosen):
        mine = donors.setdefault(0 if members is None else members[row], [])
        tokens = prompts.tokens[row]
        best, shared = -1, 0
        for d in mine:
            n = common_prefix(tokens, prompts.tokens[chosen[d]])
            if n > shared:
                best, shared = d, n
        shared = min(shared, len(tokens) - 1)
        if shared >= MIN_SHARED:
            donor[i], end[i], depth[i] = best, prompts.start(row) + shared, depth[best] + 1
        if len(mine) < MAX_DONORS and shared < DONOR_SHARE * len(tokens):
            mine.append(i)  # a new prefix: later rows may copy more of it from this row
    return Shares(donor, end, depth)
