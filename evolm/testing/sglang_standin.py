"""A STAND-IN for an SGLang server, for tests on machines without a GPU. It is not SGLang.

It follows the HTTP contract of SGLang 0.5.17's dynamic multi-LoRA serving as written down in
SGLang's documentation, and generates with evolm's real :class:`LocalEngine` (CPU, fp32) on
the adapters it loaded from disk (read with :func:`evolm.lora.load_adapter`)::

    python -m evolm.testing.sglang_standin --model-path DIR --port P --enable-lora \
        --max-lora-rank R --lora-target-modules q_proj v_proj --max-loras-per-batch K

Emulated: ``GET /health``, ``/health_generate``, ``/model_info``, ``/server_info`` (and the older
``/get_model_info``, ``/get_server_info``) with the server args; ``/v1/models`` listing adapters;
``POST /load_lora_adapter`` ``{lora_name, lora_path}`` -> ``{success, error_message,
loaded_adapters}``, 400 on a duplicate name, a bad path, a rank above ``--max-lora-rank`` or target
modules that are not served; ``POST /unload_lora_adapter`` (400 for an unknown name);
``POST /update_weights_from_disk`` ``{model_path, flush_cache?, ...}`` (the fields of SGLang's
``UpdateWeightFromDiskReqInput``; others are a 400) -> ``{success, message,
num_paused_requests}``: the safetensors files in ``model_path`` replace the served weights (400
with ``success: false`` and nothing changed when a tensor is not one of the model's or the
folder holds none; ``/model_info`` then reports the new path, as SGLang does);
``POST /generate`` with ``text`` (str or list), ``sampling_params`` (``max_new_tokens``,
``temperature``, ``top_p``, ``sampling_seed``, ``stop`` (a string or a list: generation ends at
the first, which is then trimmed from the text, unless ``no_stop_trim`` is true; its
``finish_reason`` is ``{"type": "stop", "matched": <the string>}``)) and ``lora_path`` (a
loaded adapter NAME or null per prompt) -> ``[{text, meta_info}]``; at most
``--max-loras-per-batch`` distinct adapters (null counts as one) in one request. Stricter than
SGLang: an unknown name in ``lora_path`` is a 400 (real SGLang silently reloads a name it once
loaded from the old path), and too many adapters for the slots is a 400 (real SGLang runs them
in waves).

Not emulated: the OpenAI routes (``/v1/completions``...), ``input_ids``, per-prompt sampling
params and every other sampling field (400), logprobs, streaming, ``n > 1``, ``pinned``,
``--max-loaded-loras`` eviction, ``/flush_cache``, batching across requests (requests run one
at a time), GPU numerics. ``--ignore-adapters`` makes it generate with the base model whatever
the adapters: a broken server, for testing clients' self-tests.
"""

from __future__ import annotations

import argparse
import json
import logging
import threading
import uuid
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from transformers import AutoConfig

from evolm.engine.fast.weights import base_linear
from evolm.engine.local import LocalEngine
from evolm.lora import TARGET_MODULES, LoraLayout, LoraPopulation, LoraSpec, load_adapter
from evolm.sampling import Sampling

log = logging.getLogger("evolm.sglang_standin")
VERSION = "0.5.17 (evolm stand-in)"
SAMPLING_KEYS = {"max_new_tokens", "temperature", "top_p", "sampling_seed", "stop", "no_stop_trim"}


class BadRequest(ValueError):
    """Answered with HTTP 400."""


class UpdateFailed(ValueError):
    """A weight update that failed: HTTP 400 with ``{success: false, message}``."""


UPDATE_KEYS = {  # UpdateWeightFromDiskReqInput's fields (SGLang 0.5.x)
    "model_path",
    "load_format",
    "abort_all_requests",
    "weight_version",
    "is_async",
    "torch_empty_cache",
    "keep_pause",
    "recapture_cuda_graph",
    "token_step",
    "flush_cache",
}


@dataclass(frozen=True)
class Adapter:
    path: str
    rank: int
    alpha: float
    weights: dict[str, tuple[torch.Tensor, torch.Tensor]]  # module path -> (A, B)


class Standin:
    """The server state: one LocalEngine over all served target modules, the loaded adapters."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.hf_config = AutoConfig.from_pretrained(args.model_path)
        modules = args.lora_target_modules or []
        self.modules = list(TARGET_MODULES) if "all" in modules else list(modules)
        self.engines: dict[tuple[int, float], LocalEngine] = {}  # by the adapters' (r, alpha)
        self.launch_path = args.model_path  # /update_weights_from_disk changes args.model_path
        self.weights: dict[str, torch.Tensor] = {}  # the last /update_weights_from_disk
        rank = args.max_lora_rank or 1
        self.base = self._engine(rank, float(rank))  # loads the model before serving
        self.adapters: dict[str, Adapter] = {}
        self.lock = threading.Lock()  # guards ``adapters``
        self.engine_lock = threading.Lock()  # one generation at a time

    def server_args(self) -> dict[str, Any]:
        a = self.args
        return {
            **{"model_path": a.model_path, "tokenizer_path": a.model_path, "host": a.host},
            **{"port": a.port, "dtype": a.dtype, "enable_lora": a.enable_lora},
            **{"max_lora_rank": a.max_lora_rank, "lora_target_modules": a.lora_target_modules},
            **{"max_loras_per_batch": a.max_loras_per_batch, "max_loaded_loras": None},
            **{"lora_paths": None, "lora_backend": "csgmv"},
            **{"attention_backend": a.attention_backend, "sampling_backend": a.sampling_backend},
            "version": VERSION,
        }

    def load(self, name: str, path: str) -> None:
        if not self.args.enable_lora:
            raise BadRequest("LoRA is not enabled: start the server with --enable-lora")
        if not name or not path:
            raise BadRequest("lora_name and lora_path are required")
        with self.lock:
            if name in self.adapters:
                raise BadRequest(f"The LoRA adapter {name!r} is already loaded")
        config_file = Path(path) / "adapter_config.json"
        if not config_file.is_file():
            raise BadRequest(f"no adapter_config.json under lora_path {path!r}")
        config = json.loads(config_file.read_text())
        if config.get("peft_type") != "LORA":
            raise BadRequest(f"{path}: peft_type must be LORA, got {config.get('peft_type')}")
        rank, alpha = int(config["r"]), float(config.get("lora_alpha") or config["r"])
        if rank > self.args.max_lora_rank:
            raise BadRequest(f"LoRA rank {rank} exceeds --max-lora-rank {self.args.max_lora_rank}")
        modules = list(config["target_modules"])
        unserved = sorted(set(modules) - set(self.modules))
        if unserved:
            raise BadRequest(f"target modules {unserved} are not in --lora-target-modules")
        try:
            spec = LoraSpec(rank, alpha, modules, config.get("layers_to_transform"))
            layout = LoraLayout.from_hf_config(self.hf_config, spec)
            tensors = load_adapter(path, layout)
        except (OSError, ValueError) as e:
            raise BadRequest(f"cannot read adapter {path}: {e}") from None
        weights = {t.path: (a, b) for t, a, b in layout.pairs(tensors)}
        with self.lock:
            if name in self.adapters:
                raise BadRequest(f"The LoRA adapter {name!r} is already loaded")
            self.adapters[name] = Adapter(path, rank, alpha, weights)
        log.info("loaded adapter %s (r=%d) from %s", name, rank, path)

    def update_weights_from_disk(self, body: dict[str, Any]) -> str:
        """``POST /update_weights_from_disk``: replace the served weights by those of the
        safetensors files in ``model_path`` (every tensor must be one of the model's, of its
        shape: else nothing changes and the error is returned, as SGLang rolls back)."""
        unknown = sorted(set(body) - UPDATE_KEYS)
        if unknown:
            raise BadRequest(f"unexpected fields {unknown} (valid: {sorted(UPDATE_KEYS)})")
        path = body.get("model_path")
        if not isinstance(path, str) or not path:
            raise BadRequest("model_path is required")
        files = sorted(Path(path).glob("*.safetensors")) if Path(path).is_dir() else []
        if not files:
            raise UpdateFailed(f"Failed to get weights iterator: no *.safetensors in {path}")
        state: dict[str, torch.Tensor] = {}
        for file in files:
            state |= load_file(str(file))
        with self.engine_lock:
            engines = list(self.engines.values())
            for key, value in state.items():  # check all first: a failed update changes nothing
                param = served_param(engines[0].model, key)
                if param is None or tuple(param.shape) != tuple(value.shape):
                    raise UpdateFailed(
                        f"Failed to update weights: {key} {tuple(value.shape)} is not a weight of "
                        "the served model. Rolling back to original weights."
                    )
            for engine in engines:
                load_served(engine.model, state)
            self.weights = state
            self.args.model_path = path
        log.info("loaded %d weights from %s", len(state), path)
        return "Succeeded to update model weights."

    def unload(self, name: str) -> None:
        with self.lock:
            if self.adapters.pop(name, None) is None:
                raise BadRequest(f"LoRA adapter {name!r} is not loaded")

    def loaded(self) -> dict[str, str]:
        with self.lock:
            return {n: a.path for n, a in self.adapters.items()}

    def generate(self, body: dict[str, Any]) -> list[str]:
        texts, names, sampling, seed = self._parse_generate(body)
        with self.lock:
            unknown = sorted({n for n in names if n is not None and n not in self.adapters})
            if unknown:
                raise BadRequest(f"lora_path names adapters that are not loaded: {unknown}")
            adapters = {n: self.adapters[n] for n in names if n is not None}
        groups: dict[str | None, list[int]] = {}
        for i, name in enumerate(names):
            groups.setdefault(name, []).append(i)
        if len(groups) > self.args.max_loras_per_batch:
            raise BadRequest(
                f"{len(groups)} distinct adapters (null = base counts as one) in one request "
                f"exceed --max-loras-per-batch {self.args.max_loras_per_batch}"
            )
        prompts = {n: [texts[i] for i in rows] for n, rows in groups.items()}
        first = next(iter(prompts.values()))
        same = all(p == first for p in prompts.values())  # members x one prompt list
        out = [""] * len(texts)
        for batch in [list(groups)] if same else [[n] for n in groups]:
            results = self._run(prompts[batch[0]], [adapters.get(n) for n in batch], sampling, seed)
            for name, member in zip(batch, results, strict=True):
                for row, text in zip(groups[name], member, strict=True):
                    out[row] = text
        return out

    def _parse_generate(
        self, body: dict[str, Any]
    ) -> tuple[list[str], list[str | None], Sampling, int]:
        text = body.get("text")
        if "input_ids" in body or text is None:
            raise BadRequest("the stand-in needs `text` (input_ids are not emulated)")
        texts = [text] if isinstance(text, str) else list(text)
        lora = body.get("lora_path")
        names = list(lora) if isinstance(lora, list) else [lora] * len(texts)
        if len(names) != len(texts) or not all(n is None or isinstance(n, str) for n in names):
            raise BadRequest("lora_path must be a name, null, or a list of those, one per text")
        params = body.get("sampling_params") or {}
        if not isinstance(params, dict) or set(params) - SAMPLING_KEYS:
            raise BadRequest(f"sampling_params: the stand-in emulates only {sorted(SAMPLING_KEYS)}")
        stop = params.get("stop") or ()
        try:
            sampling = Sampling(
                int(params.get("max_new_tokens", 128)),
                float(params.get("temperature", 1.0)),
                float(params.get("top_p", 1.0)),
                stop=(stop,) if isinstance(stop, str) else tuple(stop),
            )
        except ValueError as e:
            raise BadRequest(f"sampling_params: {e}") from None
        return texts, names, sampling, int(params.get("sampling_seed") or 0)

    def _engine(self, rank: int, alpha: float) -> LocalEngine:
        """A LocalEngine whose layout is the served modules at this rank and alpha: adapters
        that share it run as they are, bit for bit like evolm's own engine."""
        if (rank, alpha) not in self.engines:
            spec = LoraSpec(rank, alpha, self.modules or ["q_proj"])
            layout = LoraLayout.from_hf_config(self.hf_config, spec)
            model = self.launch_path
            engine = LocalEngine(model, layout, device="cpu", dtype="float32")
            if self.weights:  # weights updated since launch
                load_served(engine.model, self.weights)
            self.engines[rank, alpha] = engine
        return self.engines[rank, alpha]

    def _run(
        self, prompts: list[str], adapters: list[Adapter | None], sampling: Sampling, seed: int
    ) -> list[list[str]]:
        """``LocalEngine.generate`` over these adapters (None: the base model) in one batch."""
        with self.engine_lock:
            if self.args.ignore_adapters or all(a is None for a in adapters):
                return self.base.generate(prompts, None, sampling, seed) * len(adapters)
            population = self._population(adapters)
            return population[0].generate(prompts, population[1], sampling, seed)

    def _population(self, adapters: list[Adapter | None]) -> tuple[LocalEngine, LoraPopulation]:
        """Stack adapters in the served layout (zeros where one lacks a module, or is the base).
        Adapters that share (r, alpha) run as they are; mixed ones are zero-padded to the largest
        rank with their ``alpha / r`` folded into B."""
        real = [a for a in adapters if a is not None]
        shapes = {(a.rank, a.alpha) for a in real}
        rank, alpha = shapes.pop() if len(shapes) == 1 else (max(a.rank for a in real), 0.0)
        engine = self._engine(rank, alpha or float(rank))
        tensors: list[torch.Tensor] = []
        for t in engine.layout.targets:
            As, Bs = [], []
            for a in adapters:
                A, B = torch.zeros(rank, t.in_features), torch.zeros(t.out_features, rank)
                if a is not None and t.path in a.weights:
                    A[: a.rank], B[:, : a.rank] = a.weights[t.path]
                    if not alpha:
                        B *= a.alpha / a.rank
                As.append(A)
                Bs.append(B)
            tensors += [torch.stack(As), torch.stack(Bs)]
        return engine, LoraPopulation(engine.layout, tuple(tensors))


def served_param(model: torch.nn.Module, key: str) -> torch.Tensor | None:
    """The served model's parameter named ``key`` in the checkpoint's naming (through the LoRA
    wrappers); None if it has none."""
    path, _, leaf = key.rpartition(".")
    try:
        module = base_linear(model.get_submodule(path))
    except AttributeError:
        return None
    param = getattr(module, leaf, None)
    return param if isinstance(param, torch.Tensor) else None


@torch.no_grad()
def load_served(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    for key, value in state.items():
        param = served_param(model, key)
        assert param is not None, key
        param.data.copy_(value)


def matched_stop(text: str, stop: tuple[str, ...]) -> str | None:
    """The stop string of ``stop`` a local-engine :class:`Completion` ended at (it ends the
    text), or None."""
    if not getattr(text, "stopped", False):
        return None
    return max((s for s in stop if text.endswith(s)), key=len, default=None)


def stop_trimmed(text: str, stop: tuple[str, ...], trim: bool) -> str:
    """SGLang's default (``no_stop_trim`` false): the matched stop string is not returned."""
    matched = matched_stop(text, stop)
    return text[: -len(matched)] if trim and matched else str(text)


def meta_info(text: str, stop: tuple[str, ...] = ()) -> dict[str, Any]:
    """What SGLang's ``/generate`` says of a completion: an id, its token count and why it
    stopped (``length``: the budget; ``stop`` with the ``matched`` stop string), from the local
    engine's :class:`Completion`."""
    tokens, truncated = getattr(text, "tokens", None), getattr(text, "truncated", None)
    info: dict[str, Any] = {"id": uuid.uuid4().hex}
    if tokens is not None:
        info["completion_tokens"] = tokens
    if truncated is not None:
        kind = "length" if truncated else "stop"
        info["finish_reason"] = {"type": kind, **({"length": tokens} if truncated else {})}
        matched = matched_stop(text, stop)
        if matched is not None:
            info["finish_reason"]["matched"] = matched
    return info


class Handler(BaseHTTPRequestHandler):
    standin: Standin  # set on the subclass made in ``serve``
    protocol_version = "HTTP/1.1"  # keep-alive: clients reuse connections

    def do_GET(self) -> None:
        s, path = self.standin, self.path.split("?")[0]
        if path in ("/health", "/health_generate"):
            self._send(HTTPStatus.OK, None)
        elif path in ("/model_info", "/get_model_info"):
            model = s.args.model_path
            info = {"model_path": model, "tokenizer_path": model, "is_generation": True}
            self._send(HTTPStatus.OK, info)
        elif path in ("/server_info", "/get_server_info"):
            self._send(HTTPStatus.OK, s.server_args())
        elif path == "/v1/models":
            base = {"id": s.args.model_path, "object": "model", "root": s.args.model_path}
            cards = [
                {"id": n, "object": "model", "root": p, "parent": base["id"]}
                for n, p in s.loaded().items()
            ]
            self._send(HTTPStatus.OK, {"object": "list", "data": [base, *cards]})
        else:
            self._send(HTTPStatus.NOT_FOUND, {"detail": "Not Found"})

    def do_POST(self) -> None:
        s, path = self.standin, self.path.split("?")[0]
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or "{}")
            if path == "/generate":
                texts = s.generate(body)
                params = body.get("sampling_params") or {}
                trim = not params.get("no_stop_trim", False)
                stop = params.get("stop") or ()
                stop = (stop,) if isinstance(stop, str) else tuple(stop)
                out = [
                    {"text": stop_trimmed(t, stop, trim), "meta_info": meta_info(t, stop)}
                    for t in texts
                ]
                single = isinstance(body.get("text"), str)
                self._send(HTTPStatus.OK, out[0] if single else out)
            elif path in ("/load_lora_adapter", "/unload_lora_adapter"):
                self._adapter_op(path, body)
            elif path == "/update_weights_from_disk":
                try:
                    message = s.update_weights_from_disk(body)
                except UpdateFailed as e:
                    answer = {"success": False, "message": str(e), "num_paused_requests": 0}
                    self._send(HTTPStatus.BAD_REQUEST, answer)
                    return
                answer = {"success": True, "message": message, "num_paused_requests": 0}
                self._send(HTTPStatus.OK, answer)
            else:
                self._send(HTTPStatus.NOT_FOUND, {"detail": "Not Found"})
        except (BadRequest, json.JSONDecodeError, TypeError, KeyError) as e:
            error = {"object": "error", "message": str(e), "type": "BadRequest", "code": 400}
            self._send(HTTPStatus.BAD_REQUEST, error)

    def _adapter_op(self, path: str, body: dict[str, Any]) -> None:
        s = self.standin
        try:
            if path == "/load_lora_adapter":
                s.load(str(body.get("lora_name") or ""), str(body.get("lora_path") or ""))
            else:
                s.unload(str(body.get("lora_name") or ""))
        except BadRequest as e:
            answer = {"success": False, "error_message": str(e), "loaded_adapters": s.loaded()}
            self._send(HTTPStatus.BAD_REQUEST, answer)
            return
        answer = {"success": True, "error_message": None, "loaded_adapters": s.loaded()}
        self._send(HTTPStatus.OK, answer)

    def _send(self, status: HTTPStatus, payload: Any) -> None:
        data = b"" if payload is None else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)


class StandinServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # clients load a population's adapters at once (default 5)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="SGLang stand-in (CPU, evolm LocalEngine)")
    p.add_argument("--model-path", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--enable-lora", action="store_true")
    p.add_argument("--max-lora-rank", type=int)
    p.add_argument("--lora-target-modules", nargs="+")
    p.add_argument("--max-loras-per-batch", type=int, default=8)
    p.add_argument("--dtype", default="auto", help="accepted; the stand-in always runs float32")
    p.add_argument("--attention-backend")
    p.add_argument("--sampling-backend")
    p.add_argument("--ignore-adapters", action="store_true", help="a broken server: base only")
    args = p.parse_args(argv)
    if args.enable_lora and (args.max_lora_rank is None or not args.lora_target_modules):
        p.error(
            "--enable-lora without --lora-paths needs --max-lora-rank and --lora-target-modules"
        )
    return args


def serve(args: argparse.Namespace) -> None:
    """Load the model, then answer HTTP until killed (the port opens once the model is ready)."""
    handler = type("BoundHandler", (Handler,), {"standin": Standin(args)})
    server = StandinServer((args.host, args.port), handler)
    log.info("SGLang stand-in serving %s on http://%s:%d", args.model_path, args.host, args.port)
    try:
        server.serve_forever()
    finally:
        server.server_close()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    serve(parse_args())
