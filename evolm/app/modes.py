"""The strategy factory: what ES moves (``es.mean``), decided once, here.

A :class:`Mode` is the run-level side of a strategy: how its first state is made (or restored
onto this rank's device), what its checkpoint's mean looks like, what writes the final mean,
and what the engine needs before and after the run. :func:`make_mode` is the only code that
asks which one a run uses; everything above (``evolm.app.run``) and below (the loop, which
sees only the strategy's protocol: :class:`evolm.es.ES`) works with either.

- ``es.mean=lora`` (:class:`LoraMode`): the mean is a LoRA adapter over the fixed base
  weights (:class:`evolm.es.ES`); the final adapter is written by :class:`AdapterWriter`.
- ``es.mean=full`` (:class:`FullMode`): the mean is the adapted modules' full weights in fp32
  (:class:`evolm.es.lowrank.FullES`), members are low-rank perturbations served as LoRA
  adapters, the engine's base weights are the mean; the final model is written whole by
  :class:`ModelWriter`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any, Protocol

import torch

from evolm import dist
from evolm.app.build import local_model_dir
from evolm.callbacks import Callback
from evolm.callbacks.adapter import AdapterWriter
from evolm.callbacks.model import ModelWriter
from evolm.engine.base import Engine
from evolm.errors import ConfigError
from evolm.es import ES, ESState
from evolm.es.lowrank import FullES
from evolm.lora import LoraLayout, LoraSpec, es_scales, load_adapter
from evolm.lora.norms import target_weights
from evolm.lora.peft_io import AdapterError

log = logging.getLogger(__name__)


class Mode(Protocol):
    """What a run needs to know about its strategy beyond the ask/tell protocol."""

    strategy: ES
    layout: LoraLayout
    model_path: str
    """The model the engine serves (full mode: its local folder, which every engine reloads)."""

    def describe(self, generations: int) -> str:
        """The run's one-line summary for the log."""
        ...

    def mean_shapes(self) -> list[tuple[int, ...]]:
        """The shapes of the mean's tensors (a checkpoint's must match)."""
        ...

    def start(
        self, engine: Engine, restored: ESState | None, seed: int, scales: list[float], comm: Any
    ) -> ESState:
        """The run's first state (``restored``: a checkpoint's, moved to this rank's device),
        with the engine made ready to serve it."""
        ...

    def writer(self, best: str | None = None) -> Callback:
        """The callback that writes the final mean (first among the callbacks), and with
        ``best`` (``keep_best``) the best evaluation's mean."""
        ...

    def close(self, engine: Engine, multirun: bool) -> None:
        """After the run, before the engine is released (a multirun's next trial shares it)."""
        ...


def make_mode(es: ES, layout: LoraLayout, lora: LoraSpec, model_path: str) -> Mode:
    """The run's mode for the config's ``es`` (its ``mean`` key) and the model's layout; a
    ``lora.init_from`` adapter is read here, before the model loads."""
    if es.mean == "full":
        if lora.init_from is not None:
            raise ConfigError(
                "init_from",
                "starts a LoRA mean; es.mean=full starts from the model's weights",
                "use es.mean=lora, or a model with the adapter merged in (python -m "
                "evolm.export RUN)",
            )
        names = tuple(f"{t.path}.weight" for t in layout.targets)
        strategy = FullES.of(es, rank=layout.rank, lora_scaling=layout.scaling, names=names)
        # the folder, not a hub id: every engine (SGLang too) reloads its weights from files
        return FullMode(strategy, layout, local_model_dir(model_path))
    initial = None
    if lora.init_from is not None:
        try:
            initial = load_adapter(lora.init_from, layout)
        except AdapterError as e:
            raise ConfigError(
                "init_from", str(e), "give an adapter of this model, rank and targets"
            ) from None
    return LoraMode(es, layout, lora, model_path, initial)


def on_device(state: ESState, comm: dist.Comm) -> ESState:
    """A restored ES state whose noise is drawn on this rank's device when the checkpoint's
    noise device is of the same kind (``cuda:0``'s checkpoint resumed on rank 3: ``cuda:3``)."""
    if comm.world_size > 1 and torch.device(state.noise_device).type == comm.device.type:
        state.noise_device = str(comm.device)
    return state


@dataclass
class LoraMode:
    """``es.mean=lora``: ES over a LoRA adapter (:class:`evolm.es.ES`)."""

    strategy: ES
    layout: LoraLayout
    lora: LoraSpec
    model_path: str
    initial: list[torch.Tensor] | None = None  # lora.init_from's tensors (fp32, layout order)

    def describe(self, generations: int) -> str:
        layout = self.layout
        start = "" if self.lora.init_from is None else f", from {self.lora.init_from}"
        return (
            f"ES over {layout.numel()} LoRA parameters ({len(layout.targets)} targets, rank "
            f"{layout.rank}{start}), population {self.strategy.population_size}, "
            f"{generations} generations"
        )

    def mean_shapes(self) -> list[tuple[int, ...]]:
        return self.layout.shapes()

    def start(
        self,
        engine: Engine,
        restored: ESState | None,
        seed: int,
        scales: list[float],
        comm: dist.Comm,
    ) -> ESState:
        """The initial mean is drawn on this rank's device (the GPU when there is one: the CPU
        and CUDA generators differ, so a GPU run's noise differs from a CPU run's)."""
        if restored is not None:
            return on_device(restored, comm)
        drawn = self.initial or self.layout.init_mean(self.lora, scales, seed)
        mean = [m.to(comm.device) for m in drawn]
        # es.sigma is in lora.sigma_units
        return self.strategy.init(mean, seed, es_scales(self.lora, scales))

    def writer(self, best: str | None = None) -> Callback:
        return AdapterWriter(best=best)

    def close(self, engine: Engine, multirun: bool) -> None:
        """Nothing: the engine's base weights never moved."""


@dataclass
class FullMode:
    """``es.mean=full``: ES over the adapted modules' full weights (:class:`FullES`), members
    served as LoRA adapters of ``layout``'s rank, the engine's base weights the mean."""

    strategy: FullES
    layout: LoraLayout
    model_path: str

    def describe(self, generations: int) -> str:
        return (
            f"ES over the full weights of {len(self.layout.targets)} modules (es.mean=full; "
            f"members of rank {self.layout.rank}), population "
            f"{self.strategy.population_size}, {generations} generations"
        )

    def mean_shapes(self) -> list[tuple[int, ...]]:
        return [(t.out_features, t.in_features) for t in self.layout.targets]

    def base_weights(self, device: torch.device) -> list[torch.Tensor]:
        """The adapted modules' weights as the model's files hold them (their dtype:
        ``FullES.init`` makes the one fp32 master copy), on ``device``, read from the
        safetensors files (no model load)."""
        return [w.to(device) for w in target_weights(self.model_path, self.layout)]

    def start(
        self,
        engine: Engine,
        restored: ESState | None,
        seed: int,
        scales: list[float],
        comm: dist.Comm,
    ) -> ESState:
        """The master from the model's files (or the checkpoint's, with Adam's moments, on this
        rank's device); members are cast once to the local engine's dtype; the engine serves
        the master from the start."""
        dtype = getattr(engine, "dtype", None)
        if isinstance(dtype, torch.dtype) and dtype != torch.float32:
            self.strategy = replace(self.strategy, member_dtype=dtype)
        if restored is not None:
            state = on_device(restored, comm)
            state.mean = [m.to(comm.device) for m in state.mean]
            if state.opt:
                moved = {k: [x.to(comm.device) for x in state.opt[k]] for k in "mv"}
                state.opt = {**state.opt, **moved}
        else:  # one noise scale per module: the A factor's of the LoRA layout's pairs
            state = self.strategy.init(self.base_weights(comm.device), seed, scales[::2])
        engine.update_base_weights(self.strategy.named(state))  # a resumed run's master
        return state

    def writer(self, best: str | None = None) -> Callback:
        return ModelWriter(self.model_path, self.strategy.names, best=best)

    def close(self, engine: Engine, multirun: bool) -> None:
        """In a multirun, the next trial meets the base weights again (a server that outlives
        its engine, attached or kept alive, is pointed back by the engine's ``close()``)."""
        if not multirun:
            return
        try:
            back = getattr(engine, "restore_base_weights", None)
            if back is not None:  # a server: back to the model's folder, no copy written
                back()
            else:
                original = self.base_weights(torch.device("cpu"))
                engine.update_base_weights(dict(zip(self.strategy.names, original, strict=True)))
        except Exception as e:  # the run's own outcome (or error) stays what is reported
            log.warning(
                "could not put the base weights back on the engine (%s): a server that "
                "outlives this run still serves the ES mean; restart it",
                e,
            )
