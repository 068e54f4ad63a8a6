"""Optuna sweeps (``hparams_search=es_optuna``): real sweeps of the tiny model in subprocesses,
then the pieces (pooled engine, layout swaps, the rank check, resume seeds) in-process."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import optuna
import pytest
import torch
import yaml
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from mlflow import MlflowClient
from omegaconf import OmegaConf, read_write
from optuna.trial import TrialState

from evolm.app import pool
from evolm.engine.local import LocalEngine
from evolm.errors import ConfigError
from evolm.lora import LoraLayout, LoraSpec
from evolm.lora.layout import LoraPopulation
from evolm.sampling import Sampling
from evolm.server.remote import RemoteEngine
from evolm.sweep.callback import _finite, check_rank_cover, check_sweep_objectives, search_space
from evolm.sweep.parent_run import KEY_TAG, Best
from evolm.sweep.study import pareto, resume_seed
from tests.helpers import CONF, compose_config, run_cli

TINY_BUDGET = ["generations=2", "es.population_size=4", "task.max_new_tokens=8", "eval_every=1"]


def sweep(
    tmp: Path, name: str, *args: str, trials: int = 3, search: str = "es_optuna"
) -> tuple[Path, str]:
    """``python -m evolm -m hparams_search=<search>`` with its study and MLflow store in ``tmp``
    (and the working directory too: nothing lands in the repository)."""
    sweep_dir = tmp / name
    proc = run_cli(
        [
            "-m",
            f"hparams_search={search}",
            f"hydra.sweeper.storage=sqlite:///{tmp}/optuna.db",
            "hydra.sweeper.study_name=test",
            f"hydra.sweeper.n_trials={trials}",
            f"hydra.sweep.dir={sweep_dir}",
            *TINY_BUDGET,
            *args,
        ],
        timeout=300,
        cwd=tmp,
        env={"MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/mlflow.db"},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return sweep_dir, proc.stdout + proc.stderr


def study(tmp: Path) -> optuna.Study:
    return optuna.load_study(study_name="test", storage=f"sqlite:///{tmp}/optuna.db")


def mlflow_runs(tmp: Path) -> tuple[Any, list[Any]]:
    """The sweep's parent run and its children."""
    client = MlflowClient(f"sqlite:///{tmp}/mlflow.db")
    exp = client.get_experiment_by_name("evolm")
    runs = client.search_runs([exp.experiment_id])
    [parent] = [r for r in runs if KEY_TAG in r.data.tags]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(children) == len(runs) - 1, "every other run is a child of the parent"
    return parent, children


def model_loads(sweep_dir: Path) -> int:
    """``loaded ... on cpu`` lines of the engine in the trials' logs."""
    logs = "".join(p.read_text() for p in sweep_dir.glob("*/*.log"))
    return len(re.findall(r"evolm\.engine\.local\]\[INFO\] - loaded .* on cpu", logs))


@pytest.mark.slow
def test_sweep_runs_resumes_and_tracks(tmp_path: Path) -> None:
    sweep_dir, out = sweep(tmp_path, "first")
    trials = study(tmp_path).trials
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 3
    params = {tuple(sorted(t.params.items())) for t in trials}
    assert len(params) == 3, "three distinct sampled points"
    assert set(trials[0].params) == {"es.sigma", "es.alpha", "lora.init_scale", "lora.rank"}
    # One model for the whole sweep, however the rank changes between trials.
    assert "LocalEngine.loads=1" in out
    assert model_loads(sweep_dir) == 1
    assert len(list(sweep_dir.glob("*/adapter/adapter_model.safetensors"))) == 3

    parent, children = mlflow_runs(tmp_path)
    assert len(children) == 3
    assert parent.data.tags["search_space.lora.rank"] == "choice(1, 2, 4, 8)"
    best = study(tmp_path).best_trial
    assert parent.data.metrics["best_value"] == pytest.approx(best.value)
    assert parent.data.metrics["best/es.sigma"] == pytest.approx(best.params["es.sigma"])
    assert parent.data.metrics["trials_complete"] == 3

    # The same command again adds trials to the same study, with new parameters, and its
    # runs to the same parent.
    sweep(tmp_path, "second")
    trials = study(tmp_path).trials
    assert len(trials) == 6 and all(t.state is TrialState.COMPLETE for t in trials)
    assert len({tuple(sorted(t.params.items())) for t in trials}) == 6
    parent2, children = mlflow_runs(tmp_path)
    assert parent2.info.run_id == parent.info.run_id and len(children) == 6
    assert parent2.data.metrics["trials_complete"] == 6


@pytest.mark.slow
def test_failed_trial_is_recorded_and_the_sweep_goes_on(tmp_path: Path) -> None:
    """lora.rank in {0, 2}: rank 0 is a ConfigError in its trial only. With seed=1 the
    sampler draws ranks 0, 2, 0 (optuna 5.0's seeded TPE start-up draws)."""
    sweep_dir, out = sweep(tmp_path, "fail", "seed=1", "lora.rank=choice(0,2)", "logger=none")
    trials = study(tmp_path).trials
    assert [t.params["lora.rank"] for t in trials] == [0, 2, 0]
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.COMPLETE, TrialState.FAIL]
    assert "lora.rank: must be >= 1, got 0" in out
    assert (sweep_dir / "optimization_results.yaml").is_file(), "the sweep finished"


@pytest.mark.slow  # make test-all
def test_a_sweep_whose_trials_all_fail_ends_with_evolms_message(tmp_path: Path) -> None:
    """No trial completes (rank 0 fails before any model loads): evolm's message and exit 1,
    not Optuna's ``ValueError: Record does not exist.``; no Hydra execution-whitelist warning."""
    proc = run_cli(
        [
            "-m",
            "hparams_search=es_optuna",
            f"hydra.sweeper.storage=sqlite:///{tmp_path}/optuna.db",
            "hydra.sweeper.study_name=test",
            "hydra.sweeper.n_trials=2",
            f"hydra.sweep.dir={tmp_path}/sweep",
            "lora.rank=0",
            "logger=none",
        ],
        timeout=120,
        cwd=tmp_path,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert "all 2 trials of this sweep failed (first error: lora.rank: must be >= 1" in out
    assert "Record does not exist" not in out and "Traceback" not in out
    assert "_execution_whitelist_" not in out  # Hydra trusts the sweep callback (evolm.__main__)
    assert [t.state for t in study(tmp_path).trials] == [TrialState.FAIL] * 2


def sweep_command(tmp: Path, *args: str) -> list[str]:
    return [
        "-m",
        "hparams_search=es_optuna",
        f"hydra.sweeper.storage=sqlite:///{tmp}/optuna.db",
        "hydra.sweeper.study_name=test",
        "hydra.sweeper.n_trials=2",
        f"hydra.sweep.dir={tmp}/sweep",
        "logger=none",
        *args,
    ]


def test_a_misspelt_key_in_a_sweep_is_one_error_before_the_sweep_starts(tmp_path: Path) -> None:
    """Issue 40 item 3: a sweep expression's key or value, in an overlay's
    ``hydra.sweeper.params`` or on the command line, is composed with the values it gives the
    trials by the check ``python -m evolm`` runs before Hydra (exit 2, one message: no study, no
    trial); before: Hydra's own error, from the first trial, its trials left RUNNING in the
    study. In process: the CLI's exit 2 for a ConfigError is tests/test_bad_starts.py's."""
    from evolm.preflight.compose_check import check_command_line

    overlay = tmp_path / "conf" / "hparams_search"
    overlay.mkdir(parents=True)
    params = "  sweeper:\n    params:\n      es.sigmaa: tag(log, interval(0.0005, 0.05))\n"
    (overlay / "typo.yaml").write_text(
        "# @package _global_\ndefaults:\n  - es_optuna\nhydra:\n" + params
    )
    with pytest.raises(ConfigError) as raised:
        check_command_line(
            ["-m", "--config-dir", str(tmp_path / "conf"), "hparams_search=typo"], CONF
        )
    assert str(raised.value).startswith(
        "es.sigmaa: no such key in es (in the sweep 'es.sigmaa=tag(log, interval(0.0005, 0.05))' "
        "of hydra.sweeper.params). Fix: did you mean es.sigma?"
    )
    for sweep_arg, problem in {
        "es.sigmaa=choice(0.01,0.02)": "es.sigmaa: no such key in es (in the sweep",
        "lora.rank=choice(2,two)": "lora.rank: Value 'two' of type 'str' could not be converted",
        "task=choice(conciseness,countdwn)": "task: no option 'countdwn'; available:",
    }.items():
        with pytest.raises(ConfigError) as raised:
            check_command_line(["-m", "hparams_search=es_optuna", sweep_arg], CONF)
        assert str(raised.value).startswith(problem)
        assert f"(in the sweep '{sweep_arg}' of the command line)" in str(raised.value)
    check_command_line(["-m", "hparams_search=es_optuna", "lora.rank=choice(2,4)"], CONF)


def test_a_sweep_directory_in_use_is_refused_before_any_trial(tmp_path: Path) -> None:
    """Issue 40 item 3: two sweeps with one ``hydra.sweep.dir`` interleaved their trials. A
    sweep locks its directory: a second one there (the lock held here, as a running sweep holds
    it) is refused before its study or any trial, exit 2."""
    from filelock import FileLock

    sweep_dir = tmp_path / "sweep"
    sweep_dir.mkdir()
    with FileLock(str(sweep_dir / ".lock")):
        proc = run_cli(sweep_command(tmp_path), timeout=120, cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    assert (
        f"bad configuration: hydra.sweep.dir: {sweep_dir} is in use by another evolm process"
    ) in out
    assert "Launching" not in out and not (tmp_path / "optuna.db").exists()
    assert sorted(p.name for p in sweep_dir.iterdir()) == [".lock"]


def test_a_sweep_directory_holding_trials_is_refused_and_trials_lock_their_folder(
    tmp_path: Path,
) -> None:
    """An earlier sweep's trials in the directory would be overwritten by this sweep's (numbered
    from 0 again): refused, naming them. A trial folder another process uses, or that holds a
    run, fails that trial (a ConfigError)."""
    from evolm.cli.rundir import check_sweep, lock_trial

    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path / "sweep")}}})
    held = check_sweep(config)  # a fresh directory: locked
    held.release()
    (tmp_path / "sweep" / "0").mkdir()
    (tmp_path / "sweep" / "0" / "config.yaml").write_text("seed: 0\n")
    with pytest.raises(ConfigError, match=r"holds the trials of an earlier sweep \(0/\)"):
        check_sweep(config)
    trial = tmp_path / "sweep" / "1"
    trial.mkdir()
    held = lock_trial(trial)
    with pytest.raises(ConfigError, match="in use by another evolm process"):
        lock_trial(trial)
    held.release()
    with pytest.raises(ConfigError, match="already holds a run"):
        lock_trial(tmp_path / "sweep" / "0")


# -- the pieces, in-process ---------------------------------------------------------------------


def layout(model_dir: str, rank: int) -> LoraLayout:
    from transformers import AutoConfig

    return LoraLayout.from_hf_config(AutoConfig.from_pretrained(model_dir), LoraSpec(rank=rank))


def random_population(lay: LoraLayout, members: int) -> LoraPopulation:
    gen = torch.Generator().manual_seed(0)
    tensors = tuple(torch.randn(members, *s, generator=gen) * 0.3 for s in lay.shapes())
    return LoraPopulation(lay, tensors)


@pytest.mark.parametrize("fast", [True, False])
def test_use_layout_equals_a_fresh_engine(tiny_model_dir: str, fast: bool) -> None:
    """An engine loaded for rank 4 then switched to rank 2 generates what a rank-2 one does."""
    rank2 = layout(tiny_model_dir, 2)
    adapters = random_population(rank2, 3)
    sampling = Sampling(max_new_tokens=8)
    prompts = ["Hello", "1, 2, 3,"]
    fresh = LocalEngine(tiny_model_dir, rank2, device="cpu", fast=fast)
    reused = LocalEngine(tiny_model_dir, layout(tiny_model_dir, 4), device="cpu", fast=fast)
    reused.generate(prompts, random_population(reused.layout, 3), sampling, seed=0)
    reused.use_layout(rank2)
    assert reused.generate(prompts, adapters, sampling, 0) == fresh.generate(
        prompts, adapters, sampling, 0
    )


class FakeServer:
    """A persistent server's engine: rank and modules fixed when it started (the real
    clients' ``use_layout`` check, without a server behind it)."""

    use_layout = RemoteEngine.use_layout

    def __init__(self, lay: LoraLayout, max_lora_rank: int) -> None:
        self.layout, self.max_lora_rank = lay, max_lora_rank
        self.lora_target_modules = list(lay.target_modules)
        self.closed = False

    def close(self) -> None:
        self.closed = True


def test_pool_shares_one_engine_in_a_multirun(
    tiny_model_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pool, "POOL", pool.EnginePool())
    monkeypatch.setattr(pool, "in_multirun", lambda: True)
    made: list[FakeServer] = []

    def make(lay: LoraLayout) -> FakeServer:
        made.append(FakeServer(lay, max_lora_rank=4))
        return made[-1]

    server = {"_target_": "evolm.server.vllm.VLLMEngine", "port": 1}
    r2, r4, r8 = (layout(tiny_model_dir, r) for r in (2, 4, 8))
    first = pool.open_engine("m", server, r2, lambda: make(r2))
    pool.release(first)
    again = pool.open_engine("m", server, r4, lambda: make(r4))
    assert again is first and len(made) == 1 and again.layout is r4 and not first.closed
    with pytest.raises(ConfigError, match=r"server\.max_lora_rank.*lora\.rank=8"):
        pool.open_engine("m", server, r8, lambda: make(r8))
    other = pool.open_engine("m", {**server, "port": 2}, r2, lambda: make(r2))
    assert other is not first and first.closed, "a new key closes the old engine first"
    monkeypatch.setattr(pool, "in_multirun", lambda: False)
    pool.release(other)
    assert other.closed and pool.POOL.engine is None, "a single run closes its engine"


def sweep_config(*overrides: str, sweeps: tuple[str, ...] = (), search: str = "es_optuna") -> Any:
    """The sweep's config as its callback sees it; ``sweeps``: command-line sweep expressions
    (compose() refuses them outside a multirun, so they are added as Hydra records them)."""
    with initialize_config_dir(config_dir=CONF):
        cfg = compose(
            "config", overrides=[f"hparams_search={search}", *overrides], return_hydra_config=True
        )
    with read_write(cfg.hydra.overrides.task):
        cfg.hydra.overrides.task += list(sweeps)
    return cfg


def test_overlay_composes_with_the_search_space() -> None:
    cfg = sweep_config("es.alpha=0.01", sweeps=("lora.rank=choice(2,4)",))
    sweeper = cfg.hydra.sweeper
    assert sweeper.direction == "maximize" and sweeper.n_jobs == 1
    assert sweeper.max_failure_rate == 1.0
    assert sweeper.storage == "sqlite:///outputs/optuna.db"
    space = search_space(cfg)
    assert space["es.sigma"] == "tag(log, interval(0.0005, 0.05))"
    assert space["lora.rank"] == "choice(2,4)", "the command line replaces a range"
    assert space["es.alpha"] == "0.01", "a plain value fixes a key"


def test_search_space_holds_the_defaults_and_the_papers_step() -> None:
    """Every searched key's default (conf/es/default.yaml, conf/lora/default.yaml) lies inside
    its range, as do the paper's sigma and alpha: a sweep can find the default run (it could
    not: alpha was searched in 0.003-0.3 around a default of 0.6)."""
    defaults = compose_config()
    params = yaml.safe_load((Path(CONF) / "hparams_search" / "es_optuna.yaml").read_text())
    space = params["hydra"]["sweeper"]["params"]
    assert set(space) == {"es.sigma", "es.alpha", "lora.init_scale", "lora.rank"}
    paper = {"es.sigma": 0.001, "es.alpha": 0.5}  # es.update=natural: alpha 0.5 = 5e-4 / sigma
    for key, expression in space.items():
        [o] = OverridesParser.create().parse_overrides([f"{key}={expression}"])
        values = [OmegaConf.select(defaults, key), *([paper[key]] if key in paper else [])]
        for value in values:
            if o.is_interval_sweep():
                sweep = o.value()
                assert sweep.start < value < sweep.end, (key, value, expression)
            else:
                assert value in list(o.sweep_iterator()), (key, value, expression)


def test_persistent_server_rank_must_cover_the_search() -> None:
    check_rank_cover(cfg := sweep_config(), search_space(cfg))  # local: nothing to check
    for server in ("server=vllm", "server=sglang"):
        cfg = sweep_config(server)
        with pytest.raises(ConfigError, match=r"server\.max_lora_rank=8"):
            check_rank_cover(cfg, search_space(cfg))
        cfg = sweep_config(server, "server.max_lora_rank=4")
        with pytest.raises(ConfigError, match="up to 8"):
            check_rank_cover(cfg, search_space(cfg))
        cfg = sweep_config(server, "server.max_lora_rank=8")
        check_rank_cover(cfg, search_space(cfg))
        cfg = sweep_config(server, "lora.rank=4")  # one rank: the engine sizes the server
        check_rank_cover(cfg, search_space(cfg))


def test_pareto_sweep_finds_the_reward_vs_kl_front(tmp_path: Path) -> None:
    """hparams_search=es_pareto on the tiny model (3 trials, about 15 s): a two-objective study
    (reward up, KL down), every trial a child run logging both, the Pareto-optimal trials
    listed at the end and kept on the parent run."""
    sweep_dir, out = sweep(tmp_path, "pareto", search="es_pareto")
    done = study(tmp_path)
    assert [d.name for d in done.directions] == ["MAXIMIZE", "MINIMIZE"]
    assert all(t.state is TrialState.COMPLETE and len(t.values) == 2 for t in done.trials)
    parent, children = mlflow_runs(tmp_path)
    logged = {
        (c.data.metrics["eval/reward_mean"], c.data.metrics["eval/kl_mean"]) for c in children
    }
    assert logged == {tuple(t.values) for t in done.trials}
    best = sorted(t.number for t in done.best_trials)
    goals = "maximize eval/reward_mean, minimize eval/kl_mean"
    assert f"Pareto front: {len(best)} of 3 completed trial(s) ({goals})" in out
    assert sorted(int(n) for n in re.findall(r"  trial (\d+): eval/reward_mean=", out)) == best
    assert parent.data.metrics["pareto_size"] == len(best)
    assert sorted(t["trial"] for t in json.loads(parent.data.tags["pareto_trials"])) == best
    assert "solutions" in yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())


def test_objectives_need_one_direction_each_and_an_engine_that_scores_kl() -> None:
    check_sweep_objectives(sweep_config(search="es_pareto"))
    check_sweep_objectives(sweep_config())  # one objective, one direction
    with pytest.raises(ConfigError, match=r"hydra\.sweeper\.direction: has 1 direction"):
        check_sweep_objectives(
            sweep_config("hydra.sweeper.direction=[maximize]", search="es_pareto")
        )
    with pytest.raises(ConfigError, match="scored by the local engine only"):
        check_sweep_objectives(sweep_config("server=sglang", search="es_pareto"))


def test_pareto_keeps_the_trials_no_other_beats() -> None:
    points = [Best(0, (1.0, 0.5), {}), Best(1, (2.0, 0.9), {}), Best(2, (0.5, 0.6), {})]
    points += [Best(3, (1.0, 0.5), {}), Best(4, (2.0, 1.0), {})]  # a tie stays, 4 is beaten by 1
    front = pareto(points, ["maximize", "minimize"])
    assert [b.number for b in front] == [1, 0, 3]
    assert _finite([1.0, 2.0], 2) == (1.0, 2.0)
    assert _finite([1.0, float("nan")], 2) is None and _finite(3.0, 2) is None


def test_resume_seed_is_fresh_per_study_size_and_worker() -> None:
    assert resume_seed(7, 0) == 7, "a new study samples with the configured seed"
    seeds = {resume_seed(7, n, w) for n in (0, 3, 6) for w in (0, 1)}
    assert len(seeds) == 6
    assert resume_seed(7, 3, 1) == resume_seed(7, 3, 1)
