"""``python -m evolm.export <run dir> [--out DIR]``: the run's final adapter merged into its base.

``--checkpoint FILE|latest`` first writes the mean of one of the run's checkpoints as a PEFT
adapter, ``<run dir>/adapter-gen<N>/`` (a run stopped before its end, by SIGTERM or a lease's time
limit, has checkpoints but no ``adapter/``); ``--adapter-only`` stops there. LoRA runs only: a
full-mode checkpoint's mean is the full weights (resume it to its end to write ``model/``).

Loads the base model named in ``<run dir>/adapter/adapter_config.json`` (or ``--base``), applies
the adapter with peft, folds it into the weights (``merge_and_unload``) and writes a plain
transformers checkpoint with the tokenizer to ``DIR`` (default ``<run dir>/merged``), written
beside it and renamed into place, readable as the umask says (:mod:`evolm.files`). Then prints how
to serve the adapter unmerged with peft, SGLang and vLLM.

``DIR`` is replaced whole, so it must be new, empty, or an earlier export (it holds
:data:`MARKER`); the run directory, a folder holding it, and the run's ``adapter/`` and
``checkpoints/`` are refused, before anything is written.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from evolm.errors import ConfigError
from evolm.files import publish_dir, temp_dir_beside

log = logging.getLogger(__name__)

DTYPES = {
    "auto": "auto",
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
VLLM_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's allowed --max-lora-rank values
MARKER = ".evolm-export.json"  # in every export: what --out may replace
RUN_OWNED = ("adapter", "checkpoints")  # folders of a run that an export must not go into


def merged_model(adapter: Path, base: str, dtype: str = "auto") -> Any:
    """``base`` with ``adapter`` folded into its weights by peft (``LoraModel.merge_and_unload``).

    peft's ``LoraModel`` rather than ``PeftModel.from_pretrained``: ``PeftModel.__init__`` (peft
    0.21) reads transformers' deprecated ``is_gradient_checkpointing``, a FutureWarning on every
    export; the merge is the same.
    """
    from peft import LoraConfig, LoraModel, set_peft_model_state_dict
    from peft.utils import load_peft_weights
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=DTYPES[dtype])
    lora = LoraModel(model, {"default": LoraConfig.from_pretrained(str(adapter))}, "default")
    # saved as PeftModel's state (base_model.model.<module>...); LoraModel's is model.<module>...
    weights = {k.removeprefix("base_model."): v for k, v in load_peft_weights(str(adapter)).items()}
    loaded = set_peft_model_state_dict(lora, weights)
    missing = [k for k in loaded.missing_keys if ".lora_" in k]
    if loaded.unexpected_keys or missing:
        raise RuntimeError(
            f"{adapter}: peft did not load the adapter into {base} (unexpected keys "
            f"{loaded.unexpected_keys[:3]}, missing {missing[:3]})"
        )
    return lora.merge_and_unload()


def merge(adapter: Path, out: Path, base: str, dtype: str = "auto") -> Path:
    """Write ``base`` with ``adapter`` merged into its weights, and its tokenizer, to ``out``."""
    from transformers import AutoTokenizer

    merged = merged_model(adapter, base, dtype)
    with temp_dir_beside(out) as tmp:
        merged.save_pretrained(tmp)
        AutoTokenizer.from_pretrained(base).save_pretrained(tmp)
        marker = {"adapter": str(adapter), "base": base, "dtype": dtype}
        (tmp / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        publish_dir(tmp, out)
    return out


def usage(adapter: Path, merged: Path, base: str, config: dict[str, Any], name: str) -> str:
    """How to use the merged model, and the adapter unmerged with peft, SGLang and vLLM."""
    rank, modules = int(config["r"]), " ".join(config["target_modules"])
    vllm_rank = next((r for r in VLLM_RANKS if r >= rank), rank)
    body = json.dumps({"lora_name": name, "lora_path": str(adapter)})
    return f"""\
Merged model: {merged}
  AutoModelForCausalLM.from_pretrained("{merged}")   # a plain checkpoint: any server loads it

The adapter unmerged: {adapter} (base {base}, rank {rank})
  peft:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained("{base}"), "{adapter}")
  SGLang (requests name it: "lora_path": "{name}"):
    python -m sglang.launch_server --model-path {base} --enable-lora --lora-paths {name}={adapter}
    # or into a running server started with --enable-lora --max-lora-rank {rank} \\
    #   --lora-target-modules {modules}:
    curl -X POST http://127.0.0.1:30000/load_lora_adapter -H 'Content-Type: application/json' \\
      -d '{body}'
  vLLM (requests name it: "model": "{name}"):
    vllm serve {base} --enable-lora --max-lora-rank {vllm_rank} --lora-modules {name}={adapter}
    # or into a running server (VLLM_ALLOW_RUNTIME_LORA_UPDATING=True, --enable-lora):
    curl -X POST http://127.0.0.1:8000/v1/load_lora_adapter -H 'Content-Type: application/json' \\
      -d '{body}'
"""


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m evolm.export",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("run_dir", type=Path, help="an evolm run directory (holds adapter/)")
    parser.add_argument("--out", type=Path, help="where the merged model goes (<run dir>/merged)")
    parser.add_argument("--base", help="the base model (default: the adapter's base_model)")
    parser.add_argument(
        "--dtype",
        choices=sorted(DTYPES),
        default="auto",
        help="dtype of the merged weights (auto: the base checkpoint's)",
    )
    parser.add_argument("--name", default="evolm", help="the adapter's name on a server")
    parser.add_argument(
        "--checkpoint",
        help="a checkpoint of the run (a path, a file name in <run dir>/checkpoints, or latest): "
        "its mean is written as <run dir>/adapter-gen<N>/ and exported instead of adapter/",
    )
    parser.add_argument(
        "--adapter-only", action="store_true", help="with --checkpoint: write the adapter only"
    )
    args = parser.parse_args(argv)
    if args.adapter_only and args.checkpoint is None:
        parser.error("--adapter-only needs --checkpoint (adapter/ exists already)")
    if args.checkpoint is not None:
        return args
    if (args.run_dir / "model" / "config.json").is_file():
        parser.error(
            f"{args.run_dir} is an es.mean=full run: {args.run_dir / 'model'} is already a plain "
            "transformers model (config, tokenizer, safetensors); load or serve it as it is"
        )
    if not (args.run_dir / "adapter" / "adapter_config.json").is_file():
        parser.error(
            f"{args.run_dir}/adapter/adapter_config.json does not exist: a finished run "
            "(or one resumed to its end) has it"
        )
    return args


def check_out(run_dir: Path, out: Path) -> None:
    """Refuse an ``--out`` whose replacement would delete what the export did not write: the run
    directory or a folder holding it, the run's own folders, a file, or a non-empty folder that
    is not an earlier export; a :class:`ConfigError` naming ``--out``."""
    run_dir, out = run_dir.resolve(), out.resolve()
    new = f"a new or empty folder, e.g. the default {run_dir / 'merged'}"
    if run_dir.is_relative_to(out):
        what = "is the run directory" if out == run_dir else f"holds the run directory {run_dir}"
        problem = f"{out} {what}: the export replaces --out whole and would delete the run"
        raise ConfigError("--out", problem, f"choose {new}")
    for owned in RUN_OWNED:
        if out.is_relative_to(run_dir / owned):
            problem = f"{out} is inside the run's {owned}/, which the run replaces"
            raise ConfigError("--out", problem, f"choose {new}")
    if not out.exists() and not out.is_symlink():
        return
    if not out.is_dir():
        raise ConfigError("--out", f"{out} is a file, not a folder", f"choose {new}")
    if not any(out.iterdir()) or (out / MARKER).is_file():
        return
    if out == run_dir / "merged" and (out / "config.json").is_file():
        return  # the default target, exported before exports carried MARKER
    raise ConfigError(
        "--out",
        f"{out} already holds files and is not an earlier export (it has no {MARKER}): "
        "the export replaces --out whole and would delete them",
        f"choose {new}, or move those files away first",
    )


REDO = "resume the run to its end (python -m evolm resume=<run dir>) to write it again"


def check_adapter(adapter: Path) -> dict[str, Any]:
    """The adapter's ``adapter_config.json``, after checking that it and
    ``adapter_model.safetensors`` are readable (:mod:`evolm.lora.peft_io` names a damaged file)
    and every weight is finite; else a :class:`ConfigError` naming the file."""
    from evolm.lora.peft_io import AdapterError, read_adapter_config, read_adapter_weights

    try:
        config = read_adapter_config(adapter)
        tensors = read_adapter_weights(adapter)
    except AdapterError as e:
        raise ConfigError("adapter", str(e), REDO) from None
    if "base_model_name_or_path" not in config:
        raise ConfigError("adapter", f"{adapter} lacks base_model_name_or_path", REDO)
    bad = sorted(k for k, t in tensors.items() if not bool(torch.isfinite(t).all()))
    if bad:
        raise ConfigError(
            str(adapter / "adapter_model.safetensors"),
            f"holds NaN or inf in {len(bad)} of {len(tensors)} tensors (e.g. {bad[0]}): the run "
            "diverged",
            "train again with a smaller es.alpha or es.sigma",
        )
    return config


def find_checkpoint(run_dir: Path, which: str) -> Path:
    """``which`` as a file: ``latest`` (the newest in ``<run dir>/checkpoints``), a file name
    there, or a path; a :class:`ConfigError` naming ``--checkpoint`` if there is none."""
    from evolm.checkpoint import checkpoints

    folder = run_dir / "checkpoints"
    if which == "latest":
        found = checkpoints(folder)
        if not found:
            raise ConfigError("--checkpoint", f"{folder} holds no checkpoint", "train first")
        return found[-1][1]
    path = Path(which) if Path(which).is_file() else folder / which
    if not path.is_file():
        raise ConfigError(
            "--checkpoint", f"{which} is neither a file nor in {folder}", "name one, or latest"
        )
    return path


def adapter_from_checkpoint(run_dir: Path, which: str, base: str | None) -> Path:
    """Write the mean of the run's checkpoint ``which`` (:func:`find_checkpoint`) as the PEFT
    adapter ``<run dir>/adapter-gen<N>/``, the files a finished run writes to ``adapter/``. The
    LoRA spec is the checkpoint's own record of the run; the layout comes from the config of
    ``base`` (default: the run's ``model.name``): no weights load. A checkpoint whose tensors do
    not fit that layout (a full-mode run's, another model's) is one :class:`ConfigError`."""
    from transformers import AutoConfig

    from evolm.checkpoint import CheckpointError, check_shapes, load_checkpoint
    from evolm.lora import LoraLayout, LoraSpec
    from evolm.lora.peft_io import save_adapter

    path = find_checkpoint(run_dir, which)
    try:
        ck = load_checkpoint(path)
    except CheckpointError as e:
        raise ConfigError("--checkpoint", f"{path}: {e}", "choose another checkpoint") from None
    run = ck.run
    base = base or str(run.get("model.name") or "")
    try:
        hf = AutoConfig.from_pretrained(base)
    except (OSError, ValueError) as e:
        raise ConfigError(
            "--base",
            f"no transformers config at {base!r} ({type(e).__name__})",
            "pass --base with the base model's folder (a GGUF model's: its converted folder "
            "in EVOLM_CACHE_DIR/models)",
        ) from None
    names = ("rank", "alpha", "target_modules", "target_layers")
    spec = LoraSpec(**{n: run[f"lora.{n}"] for n in names if run.get(f"lora.{n}") is not None})
    layout = LoraLayout.from_hf_config(hf, spec)
    try:
        check_shapes(ck, layout.shapes())
    except ConfigError as e:
        raise ConfigError(
            "--checkpoint", e.problem, "a LoRA run's checkpoint with its base model's --base"
        ) from None
    out = run_dir / f"adapter-gen{ck.generation:06d}"
    save_adapter(out, layout, ck.es["mean"], base_model=base)
    log.info("the mean of %s (generation %d): %s", path, ck.generation, out)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    adapter = args.run_dir.resolve() / "adapter"
    out = (args.out or args.run_dir / "merged").resolve()
    try:  # a damaged adapter or a bad --out: one message, before the base model loads
        if args.checkpoint is not None:
            adapter = adapter_from_checkpoint(args.run_dir.resolve(), args.checkpoint, args.base)
            if args.adapter_only:
                return 0
        config = check_adapter(adapter)
        check_out(args.run_dir, out)
    except ConfigError as e:
        log.error("cannot export %s: %s", args.run_dir, e)
        return 2
    base = args.base or config["base_model_name_or_path"]
    log.info("merging %s into %s", adapter, base)
    merge(adapter, out, base, args.dtype)
    print(usage(adapter, out, base, config, args.name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
