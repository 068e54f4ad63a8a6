"""``server=sglang``: an SGLang server with dynamic LoRA loading (GPU only).

Launch: ``python -m sglang.launch_server --model-path M --host H --port P --enable-lora
--max-lora-rank R --lora-target-modules ... --max-loras-per-batch K`` (+ the attention and
sampling backends that the FA3-less GPU bundle needs, + ``extra_args``). Adapters:
``/load_lora_adapter`` ``{lora_name, lora_path}`` and ``/unload_lora_adapter``. Generation: ONE
``/generate`` with ``text: [...]`` and ``lora_path: [name per prompt]`` (``null`` = base) per
``K - 1`` members (the base model keeps one of the K slots), sent one after another.

At start the server's arguments (``/server_info``, or ``/get_server_info`` before 0.5.x) must fit
the config: ``max_lora_rank >= lora.rank``, lora target modules ⊆ the server's, and at least
``server.max_loras_per_batch`` slots; each failure names the server flag to change.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from evolm.engine.base import Completion, Engine
from evolm.errors import ConfigError
from evolm.lora.layout import LoraLayout
from evolm.sampling import Sampling, cut_at_stop
from evolm.server.options import RemoteOptions
from evolm.server.remote import Call, RemoteEngine, ServerError

log = logging.getLogger(__name__)

LAUNCH_MODULE = "sglang.launch_server"
EVOLM_BASE = re.compile(r"evolm-\d+/[^/]+/base-\d{6}$")
"""The folders ``update_base_weights`` writes (``<stage root>/base-NNNNNN``)."""

DTYPES = {
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "half": torch.float16,
    "float32": torch.float32,
    "float": torch.float32,
}


class SGLangEngine(RemoteEngine):
    """Evaluates populations on an SGLang server (launched, or attached with ``url``).

    Args:
        options: launch or attach, timeouts, retries (:class:`~evolm.server.options.RemoteOptions`;
            ``None``: launch ``sglang.launch_server`` with the defaults).
            ``evolm.testing.sglang_standin`` as its ``launch_module`` runs the CPU stand-in that
            enforces SGLang's HTTP contract (tests).
        max_lora_rank: ``--max-lora-rank`` (``None``: lora.rank). Fixed for the server's life:
            for a sweep over ranks, launch with the largest.
        lora_target_modules: ``--lora-target-modules`` (``None``: lora.target_modules).
        max_loras_per_batch: ``--max-loras-per-batch``, adapter slots; the base model takes one,
            so N adapters (the members, and the mean with ``train_mean=true``) run in one
            request with >= N + 1, else in waves.
        dtype: ``--dtype``.
        attention_backend, sampling_backend: ``--attention-backend``/``--sampling-backend``
            (``None``: SGLang's default); the GPU bundle without FA3 needs triton / pytorch.
    """

    kind = "sglang"
    concurrent_calls = False  # the waves of one generation share the server's slots

    def __init__(
        self,
        model_path: str,
        layout: LoraLayout,
        options: RemoteOptions | None = None,
        max_lora_rank: int | None = None,
        lora_target_modules: Sequence[str] | None = None,
        max_loras_per_batch: int = 8,
        dtype: str = "auto",
        attention_backend: str | None = "triton",
        sampling_backend: str | None = "pytorch",
    ) -> None:
        self.max_lora_rank = layout.rank if max_lora_rank is None else max_lora_rank
        self.lora_target_modules = list(lora_target_modules or layout.target_modules)
        self.max_loras_per_batch = max_loras_per_batch
        self.dtype, self.backends = dtype, (attention_backend, sampling_backend)
        self.slots = max_loras_per_batch
        self.layout, self._warned = layout, False
        self._check_fit(self.max_lora_rank, self.lora_target_modules, max_loras_per_batch)
        super().__init__(model_path, layout, options or RemoteOptions(LAUNCH_MODULE))

    def adapter_dtype(self) -> torch.dtype:
        """The server's dtype (``--dtype``, or the model's own for ``auto``): SGLang casts
        adapters to it on load, so fp32 files would only double the bytes written and read."""
        name = self.dtype
        if name == "auto":
            try:
                cfg = json.loads((Path(self.model_path) / "config.json").read_text())
                name = str(cfg.get("torch_dtype") or cfg.get("dtype") or "float32")
            except (OSError, ValueError):
                name = "float32"
        return DTYPES.get(name, torch.float32)

    def _check_fit(
        self, rank: int, modules: Sequence[str], slots: int, server: str | None = None
    ) -> None:
        """ConfigError naming the flag if a server with these args cannot serve the config.

        ``server=None`` checks the launch config; else the URL of the running server.
        """

        def fail(key: str, flag: str, have: object, problem: str, hint: str) -> None:
            if server is None:
                raise ConfigError(key, f"server.{key}={have}: {problem}", f"set it {hint}")
            raise ConfigError(
                key,
                f"the SGLang server at {server} runs {flag} {have}: {problem}",
                f"restart it with {flag} {hint} (launchers/sglang_server.sh), or attach to another",
            )

        need_rank, need_modules = self.layout.rank, self.layout.target_modules
        if rank < need_rank:
            fail(
                "max_lora_rank",
                "--max-lora-rank",
                rank,
                f"below lora.rank={need_rank}",
                f">= {need_rank}",
            )
        missing = sorted(set(need_modules) - set(modules))
        if missing and "all" not in modules:
            fail(
                "lora_target_modules",
                "--lora-target-modules",
                list(modules),
                f"lacks {missing} of lora.target_modules",
                f"including {' '.join(need_modules)}",
            )
        need_slots = max(2, self.max_loras_per_batch)
        if slots < need_slots:
            fail(
                "max_loras_per_batch",
                "--max-loras-per-batch",
                slots,
                "too few adapter slots (the base model takes one; server.max_loras_per_batch="
                f"{self.max_loras_per_batch} asked for)",
                f">= {need_slots} (es.population_size + 1, + 1 more with train_mean=true, runs "
                "a generation in one batch; fewer: server.max_loras_per_batch=<slots>, in waves)",
            )

    def launch_args(self, host: str, port: int) -> list[str]:
        args = [
            *("--model-path", self.model_path, "--host", host, "--port", str(port)),
            *("--enable-lora", "--max-lora-rank", str(self.max_lora_rank)),
            *("--lora-target-modules", *self.lora_target_modules),
            *("--max-loras-per-batch", str(self.max_loras_per_batch), "--dtype", self.dtype),
        ]
        for flag, value in zip(
            ("--attention-backend", "--sampling-backend"), self.backends, strict=True
        ):
            if value is not None:
                args += [flag, value]
        return args

    def server_args(self) -> dict[str, Any]:
        """The server's launch arguments (``/server_info``; ``/get_server_info`` on older ones)."""
        try:
            return self.server.request("GET", "/server_info").json()
        except ServerError as e:
            if e.status != 404:
                raise
        try:
            return self.server.request("GET", "/get_server_info").json()
        except ServerError as e:
            raise ConfigError(
                "url", f"{self.url} is not an SGLang server ({e})", "point server.url at one"
            ) from None

    def check_server(self) -> None:
        info = self.server_args()
        if not info.get("enable_lora") and not info.get("lora_paths"):
            raise ConfigError(
                "url",
                f"the SGLang server at {self.url} has LoRA disabled",
                "restart it with --enable-lora (launchers/sglang_server.sh)",
            )
        rank = int(info.get("max_lora_rank") or 0)
        modules = list(info.get("lora_target_modules") or [])
        slots = int(info.get("max_loras_per_batch") or 0)
        self._check_fit(rank, modules, slots, server=self.url)
        self._check_base(info.get("model_path"))
        self.slots = slots

    def _check_base(self, served: object) -> None:
        """A ConfigError if the server serves weights an ``es.mean=full`` run loaded into it
        (``model_path``, which SGLang sets to the folder ``/update_weights_from_disk`` last
        loaded, is one of evolm's ``base-NNNNNN`` folders): a run that died, or a kept-alive
        server, would otherwise silently evaluate every member on that run's ES mean."""
        if not isinstance(served, str) or served == self.model_path:
            return
        if not EVOLM_BASE.search(served.rstrip("/")):
            if Path(served).is_dir() and Path(served).resolve() != Path(self.model_path).resolve():
                log.warning(
                    "the SGLang server at %s serves %s, not the model %s: members are evaluated "
                    "on the server's weights",
                    *(self.url, served, self.model_path),
                )
            return
        raise ConfigError(
            "url",
            f"the SGLang server at {self.url} serves the weights an es.mean=full run loaded "
            f"into it from {served}, not the model {self.model_path}",
            f"restart that server, or load the original weights back: curl -X POST "
            f"{self.url}/update_weights_from_disk -H 'Content-Type: application/json' "
            f'-d \'{{"model_path": "{self.model_path}"}}\'',
        )

    base_version = 0  # the base weights sent with update_base_weights (0: the launch model's)
    base_path: Path | None = None  # the folder the server serves them from (None: launch model)

    def update_base_weights(self, named: Mapping[str, torch.Tensor]) -> None:
        """``es.mean=full``: write the model with ``named`` swapped in (:meth:`write_base`) and
        have the server load it (:meth:`load_base`). Once the server answers success the
        previous folder is deleted; a failed update deletes the new one (the server keeps
        serving the previous weights, as SGLang rolls back)."""
        path = self.write_base(named)
        try:
            previous = self.load_base(path)
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)
            raise
        remove_base(previous, keep=path)

    def write_base(self, named: Mapping[str, torch.Tensor]) -> Path:
        """A new folder beside the staged adapters (``base-NNNNNN``) holding the model with
        ``named`` swapped in: a plain model directory in the base's dtype
        (:mod:`evolm.model.full`), which any server of this model can load."""
        from evolm.model.full import save_model

        self._local_model_dir()
        self.base_version += 1
        path = self.stage.root / f"base-{self.base_version:06d}"
        try:
            save_model(path, self.model_path, named)
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)
            raise
        return path

    def load_base(self, path: Path | None) -> Path | None:
        """Have the server serve the weights in ``path`` (None: the launch model's own folder)
        with ``POST /update_weights_from_disk`` (``model_path``; ``flush_cache``: the prefix
        cache holds the old weights' KV); a launched server that is down is restarted (at most
        ``restarts`` times) and sent it again. Deletes nothing: returns the folder the server
        served before (None: the launch model), which the caller may delete."""
        target = self._local_model_dir() if path is None else path
        what = "reloading the base weights" if path is not None else "restoring the base weights"
        self.with_restarts(what, lambda: self._send_base(target))
        previous, self.base_path = self.base_path, path
        return previous

    def restore_base_weights(self) -> None:
        """Point the server back at the launch model's own folder (``POST
        /update_weights_from_disk`` with ``model_path``: the model's directory): the cheap way to
        leave a kept-alive or attached server serving the original weights after a full run (no
        model copy is written). Nothing to do when no update was sent."""
        if self.base_path is None:
            return
        remove_base(self.load_base(None))

    def close(self) -> None:
        """A server that outlives the engine (attached, or ``keep_alive``) that serves weights
        sent by ``update_base_weights`` is first pointed back at the model's own folder (those
        folders are deleted now), so the next run that attaches evaluates on the model."""
        process = self.process
        outlives = process is None or (self.keep_alive and process.alive())
        if not self._closed and self.base_path is not None and outlives:
            try:
                self._send_base(self._local_model_dir())
                previous, self.base_path = self.base_path, None
                remove_base(previous)
            except (RuntimeError, ConfigError) as e:  # ServerDown is a RuntimeError
                log.warning(
                    "the SGLang server at %s still serves the weights from %s (%s). Restart it, "
                    "or POST /update_weights_from_disk with model_path=%s",
                    *(self.url, self.base_path, e, self.model_path),
                )
        super().close()

    def _local_model_dir(self) -> Path:
        if not Path(self.model_path).is_dir():
            raise ConfigError(
                "model",
                f"es.mean=full with server=sglang writes the base model's folder with new "
                f"weights, and {self.model_path!r} is not a folder",
                "point the model at a local folder (model.cache_dir)",
            )
        return Path(self.model_path)

    def _send_base(self, path: Path) -> None:
        try:
            answer = self.server.request(
                "POST", "/update_weights_from_disk", {"model_path": str(path), "flush_cache": True}
            ).json()
        except ServerError as e:
            raise RuntimeError(f"SGLang could not load the base weights from {path}: {e}") from e
        if not (isinstance(answer, dict) and answer.get("success")):
            raise RuntimeError(f"SGLang did not load the base weights from {path}: {answer}")

    def _restart(self, reason: str, what: str = "re-running the generation") -> None:
        super()._restart(reason, what)
        if self.base_path is not None:  # a relaunched server starts from the launch model again
            self._send_base(self.base_path)

    def load(self, name: str, path: str) -> None:
        try:
            self.server.request(
                "POST", "/load_lora_adapter", {"lora_name": name, "lora_path": path}
            )
        except ServerError as e:
            raise RuntimeError(f"SGLang could not load adapter {name} from {path}: {e}") from e

    def unload(self, name: str) -> None:
        self.server.request(
            "POST", "/unload_lora_adapter", {"lora_name": name}, attempts=1, timeout=60
        )

    def build_calls(
        self, texts: list[str], names: list[str | None], sampling: Sampling, seed: int
    ) -> list[Call]:
        """One ``/generate`` for all rows while the server's adapter slots hold their members
        (``max_loras_per_batch`` - 1, one left for the base model), else one per wave of that
        many members, sent one after another (the waves share the slots)."""
        params: dict[str, Any] = {
            "max_new_tokens": sampling.max_new_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
        }
        if sampling.temperature > 0:
            params["sampling_seed"] = seed
        if sampling.stop:  # kept in the text (no_stop_trim), then cut as every engine cuts
            params |= {"stop": list(sampling.stop), "no_stop_trim": True}
        per = self.slots - 1
        distinct = list(dict.fromkeys(names))  # adapters in first-row order
        if len(distinct) > per and not self._warned:
            self._warned = True
            log.warning(
                "%d members need %d adapter slots; the server has %d: running %d waves. "
                "Restart it with --max-loras-per-batch %d for one batch",
                *(len(distinct), len(distinct) + 1, self.slots, -(-len(distinct) // per)),
                len(distinct) + 1,
            )
        wave = {name: k // per for k, name in enumerate(distinct)}
        calls = []
        for w in range(-(-len(distinct) // per)):
            rows = tuple(i for i, name in enumerate(names) if wave[name] == w)
            payload = {
                "text": [texts[i] for i in rows],
                "lora_path": [names[i] for i in rows],
                "sampling_params": params,
            }
            calls.append(Call("/generate", payload, rows))
        return calls

    def parse(self, answer: Any, call: Call) -> list[str]:
        stop = tuple(call.payload["sampling_params"].get("stop") or ())
        return [sglang_completion(row, stop) for row in answer]


def remove_base(folder: Path | None, keep: Path | None = None) -> None:
    """Delete a base-weights folder :meth:`SGLangEngine.write_base` wrote (None, or ``keep``:
    nothing)."""
    if folder is not None and folder != keep:
        shutil.rmtree(folder, ignore_errors=True)


def sglang_completion(row: dict[str, Any], stop: tuple[str, ...] = ()) -> Completion:
    """One ``/generate`` answer row: its text (cut after its first stop string, as every
    engine's: :func:`~evolm.sampling.cut_at_stop`), with its ``meta_info``'s token count and
    finish reason (``length``: cut at the budget) where the server gives them."""
    meta = row.get("meta_info") or {}
    reason = meta.get("finish_reason")
    kind = reason.get("type") if isinstance(reason, dict) else None
    tokens = meta.get("completion_tokens")
    text, stopped = cut_at_stop(row["text"], stop)
    return Completion(
        text,
        tokens=tokens if isinstance(tokens, int) else None,
        truncated=None if kind is None else kind == "length" and not stopped,
        stopped=stopped if stop else None,
    )


def sglang_servers(
    model_path: str, layout: LoraLayout, options: RemoteOptions | None = None, **common: Any
) -> Engine:
    """``server=sglang``: one :class:`SGLangEngine`, or a :class:`~evolm.server.fleet.Fleet`
    of them, one server per GPU, when ``options.url`` or ``options.cuda_devices`` is a list.

    ``url=[u1, u2]`` attaches to those servers; ``cuda_devices=[0, 1]`` launches one server per
    entry, each seeing that GPU alone (``CUDA_VISIBLE_DEVICES``; a fixed ``port`` p gives
    p, p+1, ...). ``common``: the keywords of :class:`SGLangEngine` (its signature is the
    config schema, :mod:`evolm.config`), the same for each server, as is every other option.
    """
    options = options or RemoteOptions(LAUNCH_MODULE)
    url, cuda_devices, port = options.url, options.cuda_devices, options.port
    urls = None if url is None or isinstance(url, str) else [str(u) for u in url]
    gpus = None if cuda_devices is None or isinstance(cuda_devices, str | int) else cuda_devices
    if urls is not None and gpus is not None:
        raise ConfigError(
            "cuda_devices",
            "a list of GPUs to launch servers on, and a list of URLs to attach to",
            "give one: server.url=[http://h:30000,http://h:30001] or server.cuda_devices=[0,1]",
        )
    if urls is None and gpus is None:
        return SGLangEngine(model_path, layout, options, **common)
    if not (urls or gpus):
        raise ConfigError("url", "an empty list of servers", "name at least one URL or GPU")
    from evolm.server.fleet import Fleet, start_all

    def attach(u: str) -> Callable[[], Engine]:
        one = options.replace(url=u, port=None)
        return lambda: SGLangEngine(model_path, layout, one, **common)

    def launch(i: int, gpu: str) -> Callable[[], Engine]:
        at = None if port is None else port + i
        one = options.replace(url=None, port=at, cuda_devices=gpu)
        return lambda: SGLangEngine(model_path, layout, one, **common)

    if urls is not None:
        makers = [attach(u) for u in urls]
    else:
        makers = [launch(i, str(g)) for i, g in enumerate(gpus or [])]
    return Fleet(start_all(makers))
