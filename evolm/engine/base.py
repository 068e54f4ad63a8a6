"""The Engine protocol: evaluate a whole population of LoRA adapters in one go.

Every engine, in-process (:mod:`evolm.engine.local`) or a client of a remote server
(:mod:`evolm.server`), subclasses :class:`Engine`: the required methods (``format_chat``,
``generate_rows``, ``close``) have no default, the optional hooks (:attr:`Engine.last_timings`,
:meth:`Engine.use_layout`) have no-op ones, so callers use them without probing
(:meth:`Engine.kl_to_base` too: None where unsupported; :meth:`Engine.update_base_weights`,
for ``es.mean=full``, raises a ConfigError where unsupported).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from torch import Tensor

from evolm.errors import ConfigError
from evolm.lora.layout import LoraLayout, LoraPopulation
from evolm.sampling import Sampling

Row = tuple[int, int]
"""One generation row: ``(member, prompt)`` indices into a population and its prompts."""


@dataclass(frozen=True)
class TextRequest:
    """The ``(member, prompt)`` pairs ``rows`` of ``prompts``, adapted by ``adapters`` (None:
    the base model), decoded with ``sampling`` from ``seed``: one :meth:`Engine.generate_rows`
    call."""

    prompts: Sequence[str]
    adapters: LoraPopulation | None
    rows: Sequence[Row]
    sampling: Sampling
    seed: int


class Completion(str):
    """A completion's text, plus what its engine knows of how it was generated.

    It is a ``str`` (tasks score it as text); an engine that knows more returns these instead
    of plain strings: the local engine (``token_ids`` too) and SGLang. None where the engine
    does not say (vLLM's ``tokens``; any plain ``str``: read them with :func:`completion_info`).
    """

    tokens: int | None
    """New tokens generated, the EOS not counted."""
    truncated: bool | None
    """Whether generation stopped at the token budget (``max_new_tokens``) before an EOS."""
    token_ids: tuple[int, ...] | None
    """The generated token ids (EOS not included)."""
    stopped: bool | None
    """Whether it ended at a stop string (:attr:`Sampling.stop`) rather than an EOS or the
    budget: then no EOS was generated."""

    def __new__(
        cls,
        text: str,
        tokens: int | None = None,
        truncated: bool | None = None,
        token_ids: Sequence[int] | None = None,
        stopped: bool | None = None,
    ) -> Completion:
        self = super().__new__(cls, text)
        self.token_ids = None if token_ids is None else tuple(token_ids)
        self.tokens = len(self.token_ids) if tokens is None and token_ids is not None else tokens
        self.truncated = truncated
        self.stopped = stopped
        return self

    def __reduce__(self) -> tuple[Any, ...]:  # pickled (a distributed gather) with its fields
        args = (str(self), self.tokens, self.truncated, self.token_ids, self.stopped)
        return (Completion, args)


def eos_ids(model: Any, tokenizer: Any | None) -> list[int]:
    """The ids generation ends on: a transformers ``model``'s generation config's EOS ids and
    the ``tokenizer``'s (None: the model's alone), sorted."""
    config = model.generation_config.eos_token_id
    ids = {*([config] if isinstance(config, int) else list(config or []))}
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return sorted(ids)


def group_rows(rows: Sequence[Row]) -> dict[tuple[int, ...], list[int]]:
    """``(member, prompt)`` rows as {prompts: the members that answer exactly those prompts}:
    one batch per key (a contiguous or strided shard of the rows gives one to three keys)."""
    wanted: dict[int, list[int]] = defaultdict(list)
    for member, prompt in rows:
        wanted[member].append(prompt)
    groups: dict[tuple[int, ...], list[int]] = defaultdict(list)
    for member, chosen in wanted.items():
        groups[tuple(sorted(set(chosen)))].append(member)
    return groups


def completion_info(text: str) -> tuple[int | None, bool | None]:
    """``(tokens, truncated)`` of a completion: None each for a plain ``str``."""
    return getattr(text, "tokens", None), getattr(text, "truncated", None)


class Engine(Protocol):
    """Generates completions for (member, prompt) rows of a population.

    The one required generation method is :meth:`generate_rows`; :meth:`generate` (every
    member x every prompt, ``out[m][p]``) is defined once here, as one call of it.
    ``adapters=None`` means the base model alone (one "member").
    """

    layout: LoraLayout

    def format_chat(self, messages: Sequence[Mapping[str, str]]) -> str:
        """Render chat messages with the model's chat template, ending in the assistant header."""
        ...

    def generate_rows(self, request: TextRequest) -> list[str]:
        """Completions of the ``(member, prompt)`` pairs ``request.rows``, in their order,
        whatever members they mix (``adapters=None``: member 0 is the base model): a process's
        shard of a population's rows, or all of them."""
        ...

    def close(self) -> None: ...

    def generate(
        self, prompts: Sequence[str], adapters: LoraPopulation | None, sampling: Sampling, seed: int
    ) -> list[list[str]]:
        """``out[m][p]``: member ``m``'s completion (text only) of ``prompts[p]``, every member x
        every prompt as one :meth:`generate_rows` (rows member-major)."""
        members, n = (1 if adapters is None else len(adapters)), len(prompts)
        rows = [(m, p) for m in range(members) for p in range(n)]
        texts = self.generate_rows(TextRequest(prompts, adapters, rows, sampling, seed))
        return [texts[m * n : (m + 1) * n] for m in range(members)]

    # -- optional hooks (no-op defaults) ----------------------------------------------------
    def check_rows(self, prompts: Sequence[str], rows: int, sampling: Sampling) -> None:
        """Raise the :class:`~evolm.errors.ConfigError` that a call of ``rows`` rows over
        ``prompts`` would raise for lack of memory, before any such call: a run checks its
        generations' calls before its start eval (fewer rows), so a cap that cannot hold them
        stops it there, not one eval later. Engines that plan no memory of their own (servers
        do theirs): nothing."""

    @property
    def last_timings(self) -> Mapping[str, float]:
        """Seconds (or counts) of the last ``generate``'s phases, logged as ``time/engine_*``."""
        return {}

    def kl_to_base(
        self, prompts: Sequence[str], completions: Sequence[str], adapter: LoraPopulation
    ) -> list[list[float]] | None:
        """Per completion of ``prompts[i]``, the KL(adapted || base) of each next-token
        distribution that produced it (teacher-forced, temperature 1), adapted by the one
        member of ``adapter``; None where the engine cannot score (servers)."""
        return None

    def update_base_weights(self, named: Mapping[str, Tensor]) -> None:
        """Replace the served base weights named in ``named`` (parameter names, e.g.
        ``model.layers.0.self_attn.q_proj.weight``; fp32 tensors, cast to the engine's dtype)
        in place: ``es.mean=full`` calls it after every update. Engines that cannot raise a
        ConfigError naming ``es.mean`` (this default)."""
        raise ConfigError(
            "es.mean",
            f"full needs an engine that can replace its base weights; {type(self).__name__} cannot",
            "use es.mean=lora, or server=local (or server=sglang) with es.mean=full",
        )

    def use_layout(self, layout: LoraLayout) -> None:
        """Serve adapters of ``layout`` from now on (a sweep trial reusing this engine with
        another rank or targets; see :mod:`evolm.app.pool`). Raise a ConfigError naming the
        ``server`` key to change when the engine cannot."""
        self.layout = layout


def chat_prompt(tokenizer: Any, messages: Sequence[Mapping[str, str]]) -> str:
    """Chat messages rendered with the tokenizer's chat template, ending in the assistant
    header: what every engine's ``format_chat`` returns."""
    return tokenizer.apply_chat_template(
        [dict(m) for m in messages], tokenize=False, add_generation_prompt=True
    )
