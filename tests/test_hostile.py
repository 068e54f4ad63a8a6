"""Hostile and broken inputs (issue 17): one test per class of case, parametrized where many
cases share one cause. Each case is refused with one message naming the key or file and the
fix, or handled correctly; nothing runs that the trust list does not allow; nothing is lost.

The scorer service's own hostile cases are in tests/test_scorer_server.py.
"""

from __future__ import annotations

import errno
import json
import math
import os
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import optuna
import pytest
import torch
import yaml
from hydra.utils import execution_whitelist, instantiate
from omegaconf import OmegaConf
from safetensors.torch import save_file

from evolm import checkpoint as ck
from evolm.app import train
from evolm.app.build import Builder
from evolm.app.resume import load_run_config
from evolm.callbacks import RunContext
from evolm.callbacks.checkpoint import Checkpointer
from evolm.cli.export import main as export_main
from evolm.config import run_dir
from evolm.errors import ConfigError, RunAborted
from evolm.es import ES, ESState
from evolm.loop import check_finite_mean
from evolm.lora import LoraLayout, LoraSpec
from evolm.preflight.limits import check_population_memory
from evolm.preflight.trust import hydra_whitelist, job_trusted
from evolm.sweep import stale
from evolm.task.base import MAX_RECORD_CHARS, read_jsonl
from evolm.task.countdown.data import load_countdown_json
from evolm.task.scorer import ScorerClient, ScorerError
from tests.helpers import compose_config, generation_record, run_cli

# ------------------------------------------------------------------------------ security


def test_hydra_callback_target_is_refused_before_it_runs(tmp_path: Path) -> None:
    """``+hydra.callbacks.x._target_=os.makedirs`` used to run os.makedirs."""
    victim = tmp_path / "pwned"
    proc = run_cli(
        [
            "+hydra.callbacks.x._target_=os.makedirs",
            f"+hydra.callbacks.x.name={victim}",
            f"hydra.run.dir={tmp_path}/run",
        ],
        timeout=120,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2 and not victim.exists()
    assert "hydra.callbacks.x._target_: 'os.makedirs'" in out and "not trusted" in out
    assert "Traceback" not in out


def test_config_dir_logging_factory_is_refused(tmp_path: Path) -> None:
    """A ``--config-dir`` overlay whose logging config names a factory ``()`` used to run it."""
    victim = tmp_path / "pwned"
    (tmp_path / "overlay" / "hydra" / "job_logging").mkdir(parents=True)
    (tmp_path / "overlay" / "hydra" / "job_logging" / "evil.yaml").write_text(
        f"version: 1\nhandlers:\n  x:\n    (): os.makedirs\n    name: {victim}\n"
        "root:\n  handlers: [x]\n"
    )
    proc = run_cli(
        ["--config-dir", str(tmp_path / "overlay"), "hydra/job_logging=evil"],
        timeout=120,
        cwd=tmp_path,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2 and not victim.exists()
    assert "evil.yaml" in out and "'os.makedirs'" in out and "Traceback" not in out


@pytest.mark.parametrize("where", ["hydra.callbacks", "logging"])
def test_hydra_itself_enforces_the_trust_list(where: str, tmp_path: Path) -> None:
    """What Hydra instantiates is checked against :func:`hydra_whitelist` even where evolm's
    own pre-check does not look (defence in depth)."""
    victim = tmp_path / "pwned"
    with execution_whitelist(hydra_whitelist(["trusted_targets=[evolm.*,mypkg.*]"])):
        if where == "logging":
            from hydra.core.utils import configure_log

            handler = {"()": "os.makedirs", "name": str(victim)}
            conf = {"version": 1, "handlers": {"x": handler}, "root": {"handlers": ["x"]}}
            with pytest.raises(Exception, match="whitelist"):
                configure_log(OmegaConf.create(conf))
        else:
            with pytest.raises(Exception, match="whitelist"):
                instantiate({"_target_": "os.makedirs", "name": str(victim)})
    assert not victim.exists()
    assert "mypkg.*" in hydra_whitelist(["trusted_targets=[evolm.*,mypkg.*]"])


def test_resumed_config_targets_are_rechecked(tmp_path: Path) -> None:
    """``resume=<dir>`` reads that dir's config.yaml: its ``_target_`` s are data to check."""
    good = compose_config([f"output_dir={tmp_path}"])
    bad = OmegaConf.to_container(good, resolve=True)
    bad["callbacks"]["evil"] = {"_target_": "os.system", "command": "touch pwned"}
    bad["trusted_targets"] = ["evolm.*", "os.*"]  # the file cannot widen the list either
    (tmp_path / "config.yaml").write_text(OmegaConf.to_yaml(bad))
    with pytest.raises(ConfigError, match=r"callbacks.evil._target_: 'os.system' \(from .*config"):
        train(compose_config([f"resume={tmp_path}"]))


def test_only_the_command_line_widens_trusted_targets() -> None:
    cfg = OmegaConf.create({"trusted_targets": ["evolm.*", "os.*"]})
    with pytest.raises(ConfigError, match=r"trusted_targets: a config file widens it by \['os"):
        job_trusted(cfg, [])
    cli = ["trusted_targets=[evolm.*,os.*]"]
    assert job_trusted(cfg, cli) == ("evolm.*", "os.*")


# ------------------------------------------------------------------------------ silent


@pytest.mark.parametrize(
    "override",
    [
        "es.sigma=inf",
        "es.alpha=inf",
        "es.weight_decay=inf",
        "lora.alpha=nan",
        "lora.alpha=inf",
        "lora.init_scale=nan",
        "lora.init_scale=inf",
    ],
)
def test_non_finite_values_are_refused(override: str, tmp_path: Path) -> None:
    group, key = override.split("=")[0].split(".")
    cfg = compose_config([override, f"output_dir={tmp_path}"])
    with pytest.raises(ConfigError, match=rf"^{group}\.{key}: must be .*finite"):
        Builder(("evolm.*",))(group, cfg[group])


def test_rank_above_the_models_smallest_dimension_is_refused() -> None:
    hf = SimpleNamespace(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256
    )
    assert LoraLayout.from_hf_config(hf, LoraSpec(rank=64)).rank == 64
    for rank in (65, 300, 100_000):
        with pytest.raises(ConfigError, match=r"rank: .* smallest adapted dimension 64"):
            LoraLayout.from_hf_config(hf, LoraSpec(rank=rank))


def test_a_non_finite_mean_aborts_the_run() -> None:
    es = ES(population_size=4, sigma=1.0, alpha=1e38)
    state = es.init([torch.ones(2, 3)], seed=0)
    state, stats = es.tell(state, es.ask(state), torch.tensor([0.0, 1.0, 2.0, 1e30]))
    assert not math.isfinite(stats.mean_norm)  # ES overflowed...
    with pytest.raises(RunAborted, match=r"became non-finite .* in generation 1.*es.alpha"):
        check_finite_mean(stats.mean_norm, 1, es)  # ...and the loop stops there
    check_finite_mean(1.0, 1, es)


def write_adapter(run: Path, tensors: dict[str, torch.Tensor] | None, config: str | None) -> Path:
    adapter = run / "adapter"
    adapter.mkdir(parents=True)
    base = {"r": 2, "lora_alpha": 4, "target_modules": ["q_proj"], "base_model_name_or_path": "/x"}
    (adapter / "adapter_config.json").write_text(config if config is not None else json.dumps(base))
    if tensors is not None:
        save_file(tensors, str(adapter / "adapter_model.safetensors"))
    return adapter


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("nan", "holds NaN or inf in 1 of 2 tensors"),
        ("truncated", "adapter_model.safetensors cannot be read"),
        ("random", "adapter_model.safetensors cannot be read"),
        ("bad-json", "adapter_config.json is not valid JSON"),
        ("digits", "adapter_config.json is not valid JSON"),
        ("not-lora", "is not a PEFT LoRA config"),
    ],
)
def test_export_refuses_a_broken_adapter(
    case: str, message: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    good = {"a": torch.zeros(2, 4), "b": torch.ones(4, 2)}
    tensors = {"a": torch.full((2, 4), float("nan")), "b": torch.ones(4, 2)}
    digits = '{"r": 2, "lora_alpha": ' + "1" * 5000 + "}"
    config = {"bad-json": "{not json", "not-lora": "[1, 2]", "digits": digits}.get(case)
    adapter = write_adapter(tmp_path, tensors if case == "nan" else good, config)
    weights = adapter / "adapter_model.safetensors"
    if case == "truncated":
        weights.write_bytes(weights.read_bytes()[:40])
    elif case == "random":
        weights.write_bytes(os.urandom(256))
    assert export_main([str(tmp_path)]) == 2
    assert message in caplog.text
    assert not (tmp_path / "merged").exists()


def test_stale_running_trials_of_dead_processes_are_failed(tmp_path: Path) -> None:
    """A SIGKILLed sweep left its trial RUNNING forever; the next sweep's start fails it."""
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    sweeper = OmegaConf.create({"storage": url, "study_name": "s"})
    study = optuna.create_study(study_name="s", storage=url)
    dead, alive, unowned = study.ask(), study.ask(), study.ask()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # its pid now names no process
    storage = study._storage
    storage.set_trial_user_attr(
        dead._trial_id, stale.OWNER, f"{stale.owner().split(':')[0]}:{gone.pid}"
    )
    storage.set_trial_user_attr(alive._trial_id, stale.OWNER, stale.owner())
    assert stale.fail_stale_trials(sweeper) == [dead.number]
    states = {t.number: t.state.name for t in study.get_trials()}
    assert states == {dead.number: "FAIL", alive.number: "RUNNING", unowned.number: "RUNNING"}
    stale.claim_trial(sweeper, unowned.params)
    assert study.get_trials()[unowned.number].user_attrs[stale.OWNER] == stale.owner()


# ------------------------------------------------------------------------------ data lost


def test_runs_started_in_the_same_second_get_their_own_directory(tmp_path: Path) -> None:
    """Each process claims its run directory atomically (``${evolm.run_dir:...}``)."""
    fresh = tmp_path / "runs" / "2026-01-01" / "12-00-00"
    code = "import sys; from evolm.config import run_dir; print(run_dir(None, sys.argv[1]))"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(fresh)], stdout=subprocess.PIPE, env=env)
        for _ in range(3)
    ]
    dirs = sorted(p.communicate(timeout=60)[0].decode().strip() for p in procs)
    assert dirs == sorted([str(fresh), f"{fresh}-1", f"{fresh}-2"])
    assert run_dir(str(tmp_path / "old"), str(fresh)) == str(tmp_path / "old")  # resume: its own


def test_runs_and_sweeps_claim_their_directories() -> None:
    """Both a run's and a sweep's directory go through the claiming resolver, so two sweeps
    started in the same second do not share (and overwrite) one multirun folder."""
    text = (Path(__file__).resolve().parents[1] / "conf" / "config.yaml").read_text()
    hydra_cfg = yaml.safe_load(text)["hydra"]
    assert hydra_cfg["run"]["dir"].startswith("${evolm.run_dir:${resume},outputs/runs/")
    assert hydra_cfg["sweep"]["dir"].startswith("${evolm.run_dir:null,outputs/multiruns/")


@pytest.mark.slow  # make test-all
def test_foreign_rank_checkpoint_fails_before_touching_the_run(
    short_run: tuple[Path, str], tmp_path: Path
) -> None:
    run = tmp_path / "run"
    shutil.copytree(short_run[0], run)
    [(_, path)] = ck.checkpoints(run / ck.CHECKPOINT_DIR)[-1:]
    loaded = ck.load_checkpoint(path)
    es = dict(loaded.es)
    es["mean"] = [torch.zeros(t.shape[0] * 2, t.shape[1]) for t in es["mean"]]  # other shapes
    ck.save_checkpoint(path.parent, ESState.from_state_dict(es), loaded.records, loaded.state)
    results = (run / "results.jsonl").read_bytes()
    fit = r"resume: .*gen-\d+\.pt does not fit this run: it holds \d+ LoRA tensors"
    with pytest.raises(ConfigError, match=fit):
        train(compose_config([f"resume={run}"]))
    assert (run / "results.jsonl").read_bytes() == results


def test_disk_full_during_a_checkpoint_keeps_the_last_good_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / ck.CHECKPOINT_DIR
    state = ESState(mean=[torch.ones(2)], seed=0, generation=1)
    good = ck.save_checkpoint(directory, state, [], {})

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ck.os, "fsync", full)
    checkpointer = Checkpointer(every=1)
    ctx = RunContext(tmp_path, 5, LoraLayout((), 1, 1.0, 1), "base")
    with pytest.raises(RunAborted, match=r"No space left.*partial file was removed.*gen-000001"):
        checkpointer.on_generation_end(
            ctx, generation_record(2), ESState(mean=[torch.ones(2)], seed=0, generation=2)
        )
    assert sorted(p.name for p in directory.iterdir()) == [good.name, good.name + ".sha256"]
    monkeypatch.undo()
    assert ck.latest_checkpoint(directory).generation == 1


# ------------------------------------------------------------------- crash -> one message


def test_unknown_key_added_with_plus_names_it(tmp_path: Path) -> None:
    """``+es.sigm=0.1`` passes composition (``+`` adds keys) and used to end in a TypeError."""
    cfg = compose_config(["+es.sigm=0.1", f"output_dir={tmp_path}"])
    fix = r"Fix: did you mean es.sigma\? "  # the closest key only
    with pytest.raises(ConfigError, match=rf"^es.sigm: .*unexpected keyword.*{fix}"):
        Builder(("evolm.*",))("es", cfg.es)


def test_population_or_rank_too_large_for_memory_is_refused() -> None:
    gib = 2**30
    check_population_memory(10_000, 30, available=(gib, "RAM"))
    with pytest.raises(ConfigError, match=r"es.population_size: 200000 members .* GiB"):
        check_population_memory(10_000, 200_000, available=(8 * gib, "RAM"))


BAD_RECORDS = {
    "scalar": b'{"question": "q", "answer": "a"}\n42\n',
    "string": b'{"question": "q", "answer": "a"}\n"question answer"\n',
    "list": b'[{"question": "q"}]\n',
    "latin1": '{"question": "caf\xe9", "answer": "a"}\n'.encode("latin-1"),
    "huge": b'{"question": "' + b"x" * 1_000_000 + b'", "answer": "a"}\n',
    "digits": b'{"question": "q", "answer": "a"}\n{"question": "q", "answer": "a", "id": '
    + b"7" * 5000
    + b"}\n",
}
EXPECTED = {
    "scalar": ":2 is a JSON int, not an object",
    "string": ":2 is a JSON str, not an object",
    "list": ":1 is a JSON list, not an object",
    "latin1": "is not UTF-8 text",
    "huge": f"over the limit of {MAX_RECORD_CHARS}",
    "digits": ":2 holds a number of 5000 digits, more than the 4300 Python reads",
}


@pytest.mark.parametrize("case", sorted(BAD_RECORDS))
def test_bad_jsonl_records_name_the_file_and_line(case: str, tmp_path: Path) -> None:
    path = tmp_path / "data.jsonl"
    path.write_bytes(BAD_RECORDS[case])
    with pytest.raises(ConfigError, match=rf"^train_file: .*{EXPECTED[case]}.*Fix:"):
        read_jsonl(path, "train_file", ("question", "answer"))


@pytest.mark.parametrize(
    ("group", "key", "override"),
    [
        ("task", "train_file", "task=conciseness"),
        ("task", "prompts_file", "task=scorer"),
        ("task", "data_file", "task=countdown"),
    ],
)
def test_non_utf8_data_files_fail_in_every_task(
    group: str, key: str, override: str, tmp_path: Path
) -> None:
    path = tmp_path / "data.jsonl"
    path.write_bytes('{"question": "caf\xe9"}\n'.encode("latin-1"))
    cfg = compose_config([override, f"task.{key}={path}", f"output_dir={tmp_path}"])
    with pytest.raises(ConfigError, match=rf"^task.{key}: .*is not UTF-8 text"):
        Builder(("evolm.*",))(group, cfg.task)


@pytest.mark.parametrize("form", ["array", "lines"])
def test_countdown_number_of_5000_digits_names_the_file_and_line(form: str, tmp_path: Path) -> None:
    """Before: ``ValueError: Exceeds the limit (4300 digits) for integer string conversion``."""
    records = [{"numbers": [1, 2], "target": 3}, {"numbers": [4, 5], "target": 9}]
    lines = [json.dumps(r) for r in records]
    lines.insert(1, '{"numbers": [1, ' + "9" * 5000 + '], "target": 3}')
    path = tmp_path / "cd.json"
    text = "[\n" + ",\n".join(lines) + "\n]\n" if form == "array" else "\n".join(lines) + "\n"
    path.write_text(text)
    line = 3 if form == "array" else 2
    with pytest.raises(ConfigError) as raised:
        load_countdown_json(path, "data_file")
    assert str(raised.value) == (
        f"data_file: {path}:{line} holds a number of 5000 digits, more than the 4300 Python "
        "reads. Fix: write such a value as a string, or drop it"
    )


def test_conciseness_extra_field_of_5000_digits_names_the_key_file_and_line(
    tmp_path: Path,
) -> None:
    path = tmp_path / "train.jsonl"
    path.write_bytes(BAD_RECORDS["digits"])
    cfg = compose_config([f"task.train_file={path}", f"output_dir={tmp_path}"])
    with pytest.raises(ConfigError, match=rf"^task\.train_file: {path}:2 holds a number of 5000"):
        Builder(("evolm.*",))("task", cfg.task)


def test_countdown_huge_record_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "cd.json"
    path.write_text(json.dumps([{"numbers": list(range(1, 20_000)), "target": 5}]))
    with pytest.raises(ConfigError, match=r"record 0's prompt is \d+ characters long, over"):
        load_countdown_json(path, "data_file")
    path.write_text(json.dumps({"numbers": [1] * 20_000, "target": 5}) + "\n")
    with pytest.raises(ConfigError, match=r"cd.json:1 is \d+ characters long"):
        load_countdown_json(path, "data_file")


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "lacks ['task', 'model'"),
        ("task: [unclosed", "is not valid YAML"),
        ("- 1\n- 2\n", "is empty or not a map"),
        ("task: {}\n", "lacks ['model', 'lora', 'es', 'server']"),
        ("task: {}\nmodel: {}\nlora: {}\nes: {}\nserver: {}\nbogus: 1\n", "bogus"),
    ],
    ids=["empty", "invalid", "list", "partial", "unknown-key"],
)
def test_invalid_run_config_yaml_names_the_file(text: str, problem: str, tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text(text)
    with pytest.raises(ConfigError, match=r"^resume: .*config.yaml") as err:
        load_run_config(tmp_path / "config.yaml")
    assert problem in str(err.value) and "Fix:" in str(err.value)


@pytest.fixture
def answering() -> Any:
    """A scorer stand-in on 127.0.0.1 that answers /score with the given JSON text."""
    servers = []

    def start(body: str) -> str:
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                data = body.encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None: ...

        srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}"

    yield start
    for srv in servers:
        srv.shutdown()
        srv.server_close()


@pytest.mark.parametrize("bad", ["NaN", '"high"', "null", "true", "Infinity"])
def test_scorer_answers_that_are_not_finite_numbers_stop_the_run(answering: Any, bad: str) -> None:
    url = answering(f'{{"rewards": [1.0, {bad}], "costs": [0.0, 0.0]}}')
    with pytest.raises(ScorerError, match=rf"{url} answered rewards\[1\] = .*not a finite number"):
        ScorerClient(url, retries=0).score(["p", "q"], ["a", "b"])
    assert issubclass(ScorerError, RunAborted)  # the CLI: one message, exit 3


def test_corrupt_optuna_sqlite_file_names_it(tmp_path: Path) -> None:
    db = tmp_path / "optuna.db"
    db.write_bytes(os.urandom(4096))
    with pytest.raises(ConfigError, match=r"hydra.sweeper.storage: .*optuna.db is not a usable"):
        stale.check_storage(f"sqlite:///{db}")
    db.unlink()
    optuna.create_study(study_name="s", storage=f"sqlite:///{db}")
    stale.check_storage(f"sqlite:///{db}")  # a good one passes


def test_cli_gives_one_message_without_traceback(tmp_path: Path) -> None:
    proc = run_cli(["+es.sigm=0.1", f"hydra.run.dir={tmp_path}"], timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "bad configuration: es.sigm:" in out
    assert "Traceback" not in out
