"""The Hydra config: every option composes and builds; bad input fails early and clearly."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from evolm.app import train
from evolm.app.build import Builder
from evolm.engine.local import LocalEngine
from evolm.errors import ConfigError
from evolm.model.gguf.weights import MODELS, locate
from tests.helpers import REPO, compose_config, run_cli

GROUPS = ["task", "model", "lora", "es", "server", "callbacks", "logger"]


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (REPO / "conf" / group).glob("*.yaml"))


@pytest.mark.parametrize(("group", "option"), [(g, o) for g in GROUPS for o in options(g)])
def test_every_option_composes_and_builds(group: str, option: str, tmp_path: Path) -> None:
    """Instantiating is cheap for every option: nothing loads a model or contacts a server."""
    cfg = compose_config([f"{group}={option}", f"output_dir={tmp_path}"])
    build = Builder(tuple(cfg.trusted_targets))
    node = cfg[group]
    if group == "model" and option in MODELS and locate(MODELS[option])[1]:
        with pytest.raises(ConfigError, match=f"make {MODELS[option].make_target} "):
            build(group, node)  # its weights are an optional install: it says which
        return
    if group in ("callbacks", "logger"):
        objs = [build(group, c) for c in node.values()]
        assert all(o is not None for o in objs)
    else:
        assert build(group, node) is not None


def test_overlays_compose_and_override_the_root(tmp_path: Path) -> None:
    for overlay in ["debug=fast", *(f"experiment={o}" for o in options("experiment"))]:
        compose_config([overlay, f"output_dir={tmp_path}"])
    fast = compose_config(["debug=fast", f"output_dir={tmp_path}"])
    assert (fast.generations, fast.eval_every, fast.es.population_size) == (3, 1, 4)
    paper = compose_config(["experiment=paper_conciseness", f"output_dir={tmp_path}"])
    assert (paper.generations, paper.es.sigma, paper.task.max_new_tokens) == (1000, 0.001, 100)
    q15 = compose_config(["experiment=qwen15_paper_countdown", f"output_dir={tmp_path}"])
    assert q15.model.name == "qwen2.5-coder-1.5b-instruct"  # the 0.5B run's settings otherwise
    assert (q15.task.chat_template, q15.task.drop_templates) == (True, None)
    assert q15.task.format_weight == 0.0  # the paper's effective reward: the answer alone
    assert q15.task.samples_per_generation is None and q15.extra_evals.tree_free.chat_template
    shown = compose_config(
        [
            "experiment=qwen05_paper_countdown",
            "task.chat_template=true",
            "task.shots=2",
            f"output_dir={tmp_path}",
        ]
    )  # the held-out puzzles are asked with the run's prompt, worked examples included
    assert [shown.extra_evals[k].shots for k in ("tree_free", "uniform_free")] == [2, 2]
    # examples by the puzzles' count of numbers, from the command line
    over = ["experiment=qwen05_paper_countdown_shots", "task.shots={3:2,4:3}"]
    by_count = compose_config([*over, f"output_dir={tmp_path}"])
    assert dict(by_count.extra_evals.uniform_free.shots) == {3: 2, 4: 3}


def test_the_05b_experiment_is_its_committed_run(tmp_path: Path) -> None:
    """``experiment=qwen05_paper_countdown_shots`` composes the task, ES, LoRA and held-out
    settings of the committed run it names (session 15's z3); only the machine's paths, the
    seed, the time budget and the engine's row cap were the run's own overrides."""
    run = OmegaConf.load(REPO / "docs/results/countdown-paper-split/session-15/z3.config.yaml")
    cfg = compose_config(["experiment=qwen05_paper_countdown_shots", f"output_dir={tmp_path}"])

    def plain(node: object) -> object:  # tuples and ListConfigs alike, as the YAML holds them
        return json.loads(json.dumps(OmegaConf.to_container(node, resolve=True)))

    def as_run(composed: object, ran: object) -> object:
        """``composed`` less the keys added since the run (``ran`` lacks them) left at null:
        an option the run predates, at its off value, does not change it."""
        if not isinstance(composed, dict) or not isinstance(ran, dict):
            return composed
        return {k: as_run(v, ran.get(k)) for k, v in composed.items() if k in ran or v is not None}

    for node in ("es", "lora", "extra_evals"):
        assert as_run(plain(cfg[node]), plain(run[node])) == plain(run[node]), node
    task, ran = as_run(plain(cfg.task), plain(run.task)), plain(run.task)
    assert {**task, "data_file": None} == {**ran, "data_file": None}  # type: ignore[dict-item]
    assert (cfg.model.name, cfg.generations, cfg.train_mean) == (
        run.model.name,
        run.generations,
        run.train_mean,
    )


@pytest.mark.parametrize(
    "override",
    ["es.sigmaa=0.1", "es.sigma=abc", "lora.rank=two", "generations=many", "nonsense=1"],
)
def test_unknown_keys_and_wrong_types_fail_at_compose(override: str) -> None:
    with pytest.raises(ConfigCompositionException):
        compose_config([override])


BAD = [
    ("es.sigma=0", "es.sigma"),
    ("es.sigma=-0.1", "es.sigma"),
    ("es.antithetic=true es.population_size=15", "es.population_size"),
    ("lora.rank=0", "lora.rank"),
    ("lora.target_modules=[q_proj,qkv_proj]", "lora.target_modules"),
    ("task.train_file=/no/such/file.jsonl", "task.train_file"),
    ("task.max_new_tokens=0", "task.max_new_tokens"),
    ("generations=0", "generations"),
    ("server.dtype=fp8", "server.dtype"),
    ("optimized_metric=[]", "optimized_metric"),
    ("callbacks.samples.count=-1", "callbacks.samples.count"),
    ("task=countdown task.drop_templates=eval", "task.drop_templates"),
    ("callbacks.health.shortcut_rise=0", "callbacks.health.shortcut_rise"),
    (
        "+task@extra_evals.cd=countdown extra_evals.cd.max_new_tokens=0",
        "extra_evals.cd.max_new_tokens",
    ),
    ("+extra_evals.x._target_=evolm.es.ES", "extra_evals.x._target_"),
    ("optimized_metric=[eval/reward_mean,[x]]", "optimized_metric"),
    ("keep_best=accuracy", "keep_best"),
]


@pytest.mark.parametrize(("overrides", "key"), BAD)
def test_bad_input_fails_before_the_model_loads(overrides: str, key: str, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cfg = compose_config(
        [*overrides.split(), f"output_dir={tmp_path}/run", f"model.cache_dir={cache}"]
    )
    loads = LocalEngine.loads
    with pytest.raises(ConfigError) as err:
        train(cfg)
    assert str(err.value).startswith(f"{key}: ") and "Fix: " in str(err.value)
    assert LocalEngine.loads == loads
    if not key.startswith("server."):  # engine keys are checked once the model path is known
        assert not cache.exists(), "the tiny model was built before the config was checked"


def test_untrusted_target_names_trusted_targets(tmp_path: Path) -> None:
    cfg = compose_config([f"output_dir={tmp_path}", "+callbacks.evil._target_=os.system"])
    with pytest.raises(ConfigError, match=r"callbacks.evil._target_: 'os.system' .*not trusted"):
        train(cfg)


@pytest.mark.slow  # make test-all (CI: the misspelt-key CLIs)
def test_cli_reports_one_clear_message(tmp_path: Path) -> None:
    proc = run_cli(["es.sigma=-1", f"hydra.run.dir={tmp_path}"], timeout=120)
    assert proc.returncode == 2
    out = proc.stdout + proc.stderr
    assert "bad configuration: es.sigma: must be > 0" in out and "Fix:" in out
    assert "Traceback" not in out


MISSPELT = {
    "key": (["es.sigmaa=0.1"], r"es\.sigmaa: no such key in es\. Fix: did you mean es\.sigma\? "),
    "key-multirun": (["-m", "es.sigmaa=0.1"], r"es\.sigmaa: no such key in es\. Fix: did you mean"),
    "option": (
        ["task=countdwn"],
        r"task: no option 'countdwn'; available: conciseness, countdown, scorer\. "
        r"Fix: did you mean task=countdown\?",
    ),
    "option-far": (["es=nope"], r"es: no option 'nope'; available: default, openai, paper\. Fix"),
    "hydra-key": (["hydra.run.dirr=x"], r"hydra\.run\.dirr: .* did you mean hydra\.run\.dir\?"),
    "value": (["lora.rank=abc"], r"lora\.rank: Value 'abc' .* could not be converted to Integer"),
    # `+` adds the key: composition passes, the constructor refuses it
    "added-key": (
        ["+es.sigmaa=0.1", "logger=none"],
        r"es\.sigmaa: .*unexpected keyword argument 'sigmaa'\. Fix: did you mean es\.sigma\? ",
    ),
}


IN_CI = ("key", "option", "added-key")  # the others: `make test-all` (each a 6-s CLI start)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(*case, id=name, marks=() if name in IN_CI else pytest.mark.slow)
        for name, case in MISSPELT.items()
    ],
)
def test_cli_misspelt_key_or_option_is_bad_configuration(
    args: list[str], message: str, tmp_path: Path
) -> None:
    """Exit 2 (bad configuration, docs/robustness.md), one message naming the key as written and
    only the right one (not Hydra's ``+es.sigmaa=0.1`` hint, nor its ``Builds_ES``)."""
    proc = run_cli(args, timeout=120, cwd=tmp_path, env={"PYTHONPATH": str(REPO)})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    assert re.search(f"bad configuration: {message}", out), out[-3000:]
    assert "Builds_" not in out and "Traceback" not in out
    assert "+es.sigmaa" not in out  # Hydra's hint adds the misspelt key
    assert not list((tmp_path / "outputs").rglob("*.yaml")), "nothing of a run is left"


def test_sglang_adapter_slots_default_to_population_plus_one(tmp_path: Path) -> None:
    """server=sglang runs a whole generation in one /generate: N adapters + the base model, and
    the mean's adapter with train_mean=true (the default)."""
    cfg = compose_config(["server=sglang", "es.population_size=30", f"output_dir={tmp_path}"])
    assert cfg.server.max_loras_per_batch == 32
    off = ["server=sglang", "es.population_size=30", "train_mean=false", f"output_dir={tmp_path}"]
    assert compose_config(off).server.max_loras_per_batch == 31
    fixed = ["server=sglang", "server.max_loras_per_batch=9", f"output_dir={tmp_path}"]
    cfg = compose_config(fixed)
    assert cfg.server.max_loras_per_batch == 9


def test_the_cli_asks_for_expandable_cuda_segments_unless_the_user_set_the_allocator() -> None:
    """A KV cache re-planned between training and evaluation needs one large free block: the
    CLI's default (evolm.__main__.allocator_defaults) keeps freed memory unsplit; a user's
    own allocator setting, under either of torch's names, is left alone."""
    from evolm.__main__ import allocator_defaults

    env: dict[str, str] = {}
    allocator_defaults(env)
    assert env == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    for name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        mine = {name: "max_split_size_mb:512"}
        allocator_defaults(mine)
        assert mine == {name: "max_split_size_mb:512"}
