"""``python -m baselines.compare``: ES and GRPO from the same model, on the same puzzles, for the
same GPU time, evaluated alike at the same training-time marks; one figure, one table.

    python -m baselines.compare model=qwen2.5-coder-0.5b-instruct task=countdown budget_minutes=20

Its own keys: ``budget_minutes`` (training time per method, evaluations and start-up excluded),
``eval_every_minutes`` (default: a tenth of the budget), ``out`` (default
``outputs/compare/<date>_<time>``), ``methods`` (``es,grpo``; one of them to rerun it alone),
``devices`` and ``report_only=true`` (redraw from ``out``). ``grpo.<key>=...`` go to GRPO
(:mod:`baselines.grpo_settings`); every other argument is an evolm override given to both runs
(``task.*``, ``lora.*``, ``seed``, ``server.*``; ``es.*`` matter to ES alone). The runs are
``python -m evolm`` into ``<out>/es`` and ``python -m baselines.grpo`` into ``<out>/grpo``,
their logs ``<out>/<method>.log``. By default they go one after the other on the same device;
``devices=0,1`` runs them side by side, one GPU each (``CUDA_VISIBLE_DEVICES``, in the order of
``methods``): the same wall-clock on two GPUs of one kind instead of twice it on one.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path

from omegaconf import DictConfig

from baselines.grpo_settings import PREFIX, parse_settings
from baselines.report import Run, write_report
from baselines.runconfig import compose_run
from evolm.errors import ConfigError

log = logging.getLogger("baselines.compare")
METHODS = ("es", "grpo")
STEP_CAP = 1_000_000  # generations / steps: the time budget ends the runs, not this
ES_EXTRA = [
    "logger=none",
    "trusted_targets=[evolm.*,baselines.*]",
    "+callbacks.peak_memory._target_=baselines.memory.PeakMemory",
]


@dataclass(frozen=True)
class CompareSettings:
    budget_minutes: float = 20.0
    eval_every_minutes: float | None = None
    out: str | None = None
    methods: str = "es,grpo"
    devices: str | None = None
    report_only: bool = False

    def __post_init__(self) -> None:
        if not self.budget_minutes > 0:
            raise ConfigError(
                "budget_minutes", f"must be > 0, got {self.budget_minutes}", "e.g. 20"
            )
        if self.eval_every_minutes is not None and not self.eval_every_minutes > 0:
            raise ConfigError("eval_every_minutes", "must be > 0", "e.g. 2")
        unknown = set(self.chosen) - set(METHODS)
        if unknown or not self.chosen:
            raise ConfigError(
                "methods", f"unknown: {sorted(unknown)}", f"a subset of {','.join(METHODS)}"
            )
        if self.devices is not None:
            ids = self.device_ids
            if len(ids) != len(self.chosen) or not all(i.isdigit() for i in ids):
                raise ConfigError(
                    "devices",
                    f"{self.devices!r}: one GPU index per method of methods={self.methods}",
                    "e.g. devices=0,1 (or leave it out: one after the other on one device)",
                )

    @property
    def device_ids(self) -> list[str]:
        return [] if self.devices is None else self.devices.split(",")

    @property
    def chosen(self) -> list[str]:
        return [m for m in self.methods.split(",") if m]

    @property
    def budget_s(self) -> float:
        return self.budget_minutes * 60

    @property
    def eval_every_s(self) -> float:
        return (
            self.budget_s / 10 if self.eval_every_minutes is None else self.eval_every_minutes * 60
        )

    def out_dir(self) -> Path:
        return Path(self.out or time.strftime("outputs/compare/%Y-%m-%d_%H-%M-%S"))


def split_args(argv: Sequence[str]) -> tuple[CompareSettings, list[str], list[str]]:
    """``(compare settings, grpo.* overrides, evolm overrides)``."""
    own = {f.name: f for f in fields(CompareSettings)}
    values: dict[str, object] = {}
    grpo, evolm = [], []
    for arg in argv:
        key, _, value = arg.partition("=")
        if key in own:
            values[key] = _value(key, str(own[key].type), value)
        elif arg.startswith(PREFIX):
            grpo.append(arg)
        else:
            evolm.append(arg)
    return CompareSettings(**values), grpo, evolm  # type: ignore[arg-type]


def _value(key: str, kind: str, value: str) -> object:
    """``value`` as the ``kind`` of ``key``, or ConfigError."""
    try:
        if "bool" in kind:
            if value.lower() not in ("true", "false"):
                raise ValueError(value)
            return value.lower() == "true"
        return float(value) if "float" in kind else value
    except ValueError:
        raise ConfigError(key, f"{value!r} is not a {kind}", f"e.g. {key}=2") from None


def commands(
    settings: CompareSettings, grpo: list[str], evolm: list[str], out: Path
) -> dict[str, list[str]]:
    """The command line of each method's run."""
    shared = [*evolm, f"time_budget_s={settings.budget_s}", f"eval_every_s={settings.eval_every_s}"]
    if not any(a.startswith("generations=") for a in evolm):
        shared.append(f"generations={STEP_CAP}")
    python = sys.executable
    return {
        "es": [python, "-m", "evolm", *shared, *ES_EXTRA, f"hydra.run.dir={out / 'es'}"],
        "grpo": [python, "-m", "baselines.grpo", *shared, *grpo, f"output_dir={out / 'grpo'}"],
    }


def run_methods(commands: dict[str, list[str]], out: Path, devices: Sequence[str]) -> None:
    """Run the methods' commands: one after the other, or side by side with ``devices`` (one
    ``CUDA_VISIBLE_DEVICES`` each, in order); a method that fails is an error quoting its log."""
    if not devices:
        for name, command in commands.items():
            _wait(name, _start(name, command, out, None), out)
        return
    started = {
        name: _start(name, command, out, device)
        for (name, command), device in zip(commands.items(), devices, strict=True)
    }
    for name, process in started.items():
        _wait(name, process, out)


def _start(
    name: str, command: list[str], out: Path, device: str | None
) -> tuple[subprocess.Popen[bytes], float]:
    log_file = out / f"{name}.log"
    on = "" if device is None else f" on GPU {device}"
    log.info("%s%s: %s (log: %s)", name.upper(), on, " ".join(command[1:]), log_file)
    env = None if device is None else {**os.environ, "CUDA_VISIBLE_DEVICES": device}
    with open(log_file, "w") as f:
        process = subprocess.Popen(command, stdout=f, stderr=subprocess.STDOUT, env=env)
    return process, time.perf_counter()


def _wait(name: str, started: tuple[subprocess.Popen[bytes], float], out: Path) -> None:
    process, start = started
    code = process.wait()
    log_file = out / f"{name}.log"
    if code != 0:
        tail = "\n".join(log_file.read_text(errors="replace").splitlines()[-20:])
        raise RuntimeError(f"{name} exited {code}; the end of {log_file}:\n{tail}")
    log.info(
        "%s finished in %.0fs (wall, start-up and evaluations included)",
        name.upper(),
        time.perf_counter() - start,
    )


def title(cfg: DictConfig | None, evolm: Sequence[str], settings: CompareSettings) -> str:
    """``<model>, <task>: ES vs GRPO, <budget> min of training each``, the model and task
    named from the composed config (an ``experiment=`` sets them too)."""
    if cfg is None:  # not composable here: what the command line names
        chosen = dict(a.split("=", 1) for a in evolm if a.split("=", 1)[0] in ("model", "task"))
        model, task = chosen.get("model", "tiny"), chosen.get("task", "conciseness")
    else:
        target = str(cfg.model.get("_target_", "model"))
        model = cfg.model.get("name") or cfg.model.get("name_or_path") or _short(target)
        task = _short(str(cfg.task.get("_target_", "task")))
    return f"{model}, {task}: ES vs GRPO, {settings.budget_minutes:g} min of training each"


def _short(target: str) -> str:
    """A class path as a short name: ``evolm.model.TinyModel`` -> ``tiny``."""
    return target.rsplit(".", 1)[-1].removesuffix("Model").lower()


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO, format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"
    )
    try:
        settings, grpo, evolm = split_args(list(sys.argv[1:] if argv is None else argv))
        cfg = None
        if not settings.report_only:  # a misspelt key fails now, not after the ES run
            parse_settings(grpo)
            cfg = compose_run([*evolm, f"time_budget_s={settings.budget_s}"])
    except ConfigError as e:
        log.error("bad configuration: %s", e)
        return 2
    if cfg is None:
        try:
            cfg = compose_run(evolm)
        except ConfigError:
            cfg = None
    out = settings.out_dir()
    out.mkdir(parents=True, exist_ok=True)
    if not settings.report_only:
        every = commands(settings, grpo, evolm, out)
        run_methods({m: every[m] for m in settings.chosen}, out, settings.device_ids)
    runs = [Run.load(m, out / m) for m in METHODS if (out / m / "results.jsonl").is_file()]
    paths = write_report(runs, out, title(cfg, evolm, settings))
    log.info("figure %s, table %s", paths["figure"], paths["table"])
    log.info("\n%s", paths["table"].read_text())
    for run in runs:
        if run.summary().get("shortcut"):
            log.warning(
                "%s: THIS RUN IS LEARNING A SHORTCUT: its held-out accuracy rose without the "
                "skill evolm's health monitor asks of a rise (accuracy lift, or accuracy beyond "
                "templates); read its answers (%s/samples)",
                run.name.upper(),
                run.run_dir,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
