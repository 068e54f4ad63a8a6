"""``server=vllm``: a vLLM OpenAI server with runtime LoRA loading.

Launch: ``python -m vllm.entrypoints.openai.api_server --model M --enable-lora --max-lora-rank R
--max-loras K --max-model-len L --dtype D`` with ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``
(``vllm serve`` fails in the CPU package). Adapters: ``/v1/load_lora_adapter`` and
``/v1/unload_lora_adapter``. Generation: one ``/v1/completions`` request per member holding all
prompts (``prompt: [...]``, ``model: <adapter name>``; the base model by its served name), the
requests sent in parallel threads. Greedy is ``temperature: 0``; every member gets the same
``seed`` (common random numbers when sampling).
"""

from __future__ import annotations

from typing import Any

from evolm.engine.base import Completion
from evolm.errors import ConfigError
from evolm.lora.layout import LoraLayout
from evolm.sampling import Sampling, cut_at_stop
from evolm.server.options import RemoteOptions
from evolm.server.remote import Call, RemoteEngine, ServerError

VLLM_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


LAUNCH_MODULE = "vllm.entrypoints.openai.api_server"


def vllm_max_lora_rank(rank: int, max_lora_rank: int | None) -> int:
    """vLLM's ``--max-lora-rank``: the given one, checked, or the smallest valid >= ``rank``."""
    if max_lora_rank is None:
        fits = [r for r in VLLM_RANKS if r >= rank]
        if not fits:
            raise ConfigError(
                "max_lora_rank", f"lora.rank={rank} exceeds vLLM's largest rank 512", "lower it"
            )
        return fits[0]
    if max_lora_rank not in VLLM_RANKS:
        raise ConfigError(
            "max_lora_rank",
            f"vLLM accepts only {list(VLLM_RANKS)}, got {max_lora_rank}",
            "pick one of them, or null for the smallest that fits lora.rank",
        )
    if max_lora_rank < rank:
        raise ConfigError(
            "max_lora_rank",
            f"{max_lora_rank} is below lora.rank={rank}",
            "raise it (or null for the smallest valid rank >= lora.rank)",
        )
    return max_lora_rank


class VLLMEngine(RemoteEngine):
    """Evaluates populations on a vLLM server (launched, or attached with ``url``).

    Args:
        model_path, layout: completed by the composition root.
        options: launch or attach, timeouts, retries (:class:`~evolm.server.options.RemoteOptions`;
            ``None``: launch ``vllm.entrypoints.openai.api_server`` with the defaults), e.g.
            ``python=.venv-vllm/bin/python``.
        max_lora_rank: ``--max-lora-rank`` (``None``: the smallest valid rank >= lora.rank).
        max_loras: ``--max-loras``, adapters in one batch (more members queue).
        max_model_len: ``--max-model-len``.
        dtype: ``--dtype`` (``float32`` for outputs equal to the local engine's).
    """

    kind = "vllm"

    def __init__(
        self,
        model_path: str,
        layout: LoraLayout,
        options: RemoteOptions | None = None,
        max_lora_rank: int | None = None,
        max_loras: int = 8,
        max_model_len: int = 4096,
        dtype: str = "auto",
    ) -> None:
        self.max_lora_rank = vllm_max_lora_rank(layout.rank, max_lora_rank)
        if max_loras < 1:
            raise ConfigError("max_loras", f"must be >= 1, got {max_loras}", "e.g. 8")
        self.max_loras, self.max_model_len, self.dtype = max_loras, max_model_len, dtype
        self.served_model = model_path
        super().__init__(model_path, layout, options or RemoteOptions(LAUNCH_MODULE))

    def launch_args(self, host: str, port: int) -> list[str]:
        return [
            *("--model", self.model_path, "--host", host, "--port", str(port), "--enable-lora"),
            *("--max-lora-rank", str(self.max_lora_rank), "--max-loras", str(self.max_loras)),
            *("--max-model-len", str(self.max_model_len), "--dtype", self.dtype),
        ]

    def launch_env(self) -> dict[str, str]:
        return {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}

    def check_server(self) -> None:
        """Find the served base model's name (adapters are listed with a ``parent``)."""
        try:
            models = self.server.request("GET", "/v1/models").json()["data"]
        except (ServerError, KeyError, ValueError) as e:
            raise ConfigError(
                "url", f"{self.url} is not a vLLM OpenAI server ({e})", "point server.url at one"
            ) from None
        base = [m["id"] for m in models if m.get("parent") is None]
        if not base:
            raise ConfigError("url", f"{self.url} serves no base model", "check server.url")
        self.served_model = base[0]

    def load(self, name: str, path: str) -> None:
        try:
            self.server.request(
                "POST", "/v1/load_lora_adapter", {"lora_name": name, "lora_path": path}
            )
        except ServerError as e:
            raise self._explain(e) from e

    def unload(self, name: str) -> None:
        self.server.request(
            "POST", "/v1/unload_lora_adapter", {"lora_name": name}, attempts=1, timeout=60
        )

    def _explain(self, e: ServerError) -> Exception:
        """Turn a failed adapter load into an error that names the server flag to change."""
        body = e.body.lower()
        restart = f"restart the vLLM server at {self.url} (launchers/vllm_server.sh sets it)"
        if e.status == 404 and "lora" not in body:
            return ConfigError(
                "url",
                "the server has no runtime LoRA loading (/v1/load_lora_adapter is 404)",
                f"{restart} with env VLLM_ALLOW_RUNTIME_LORA_UPDATING=True",
            )
        if "enable-lora" in body or "lora is not enabled" in body:
            return ConfigError(
                "url", "the server has LoRA disabled", f"{restart} with --enable-lora"
            )
        if "max_lora_rank" in body or "max-lora-rank" in body:
            return ConfigError(
                "max_lora_rank",
                f"the server's --max-lora-rank is below lora.rank={self.layout.rank} ({e.body})",
                f"{restart} with --max-lora-rank {vllm_max_lora_rank(self.layout.rank, None)}",
            )
        return e

    def build_calls(
        self, texts: list[str], names: list[str | None], sampling: Sampling, seed: int
    ) -> list[Call]:
        """One ``/v1/completions`` per adapter (the OpenAI API takes one ``model`` a request)
        with its rows' prompts; the calls run concurrently and the server batches them."""
        body = {
            "max_tokens": sampling.max_new_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "seed": seed,
        }
        if sampling.stop:  # kept in the text, then cut as every engine cuts
            body |= {"stop": list(sampling.stop), "include_stop_str_in_output": True}
        calls = []
        for name in dict.fromkeys(names):
            rows = tuple(i for i, n in enumerate(names) if n == name)
            payload = {"model": name or self.served_model, "prompt": [texts[i] for i in rows]}
            calls.append(Call("/v1/completions", {**payload, **body}, rows))
        return calls

    def parse(self, answer: Any, call: Call) -> list[str]:
        stop = tuple(call.payload.get("stop") or ())
        choices = sorted(answer["choices"], key=lambda c: c["index"])
        return [vllm_completion(c, stop) for c in choices]


def vllm_completion(choice: dict[str, Any], stop: tuple[str, ...] = ()) -> Completion:
    """One ``/v1/completions`` choice: its text (cut after its first stop string, as every
    engine's: :func:`~evolm.sampling.cut_at_stop`) and whether it stopped at the budget
    (``finish_reason: length``); vLLM gives no per-choice token count."""
    reason = choice.get("finish_reason")
    text, stopped = cut_at_stop(choice["text"], stop)
    truncated = None if reason is None else reason == "length" and not stopped
    return Completion(text, truncated=truncated, stopped=stopped if stop else None)
