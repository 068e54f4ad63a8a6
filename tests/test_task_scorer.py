"""The scorer service (a real subprocess), its client (batching, retries, timeouts, errors) and
the scorer task (reward - lambda * cost, adaptive lambda, lazy health check)."""

from __future__ import annotations

import json
import math
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from evolm.errors import ConfigError
from evolm.task import Task
from evolm.task.scorer import Scorer, ScorerClient, ScorerError, ScorerUnavailable
from evolm.task.scorer.server import KeywordRule, LengthRule, parse_request
from tests.conftest import StartServer, free_port, get

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
PROMPTS = ["Say hi.", "Name a fruit.", "Count to three."]
COMPLETIONS = ["hi hi there", "apple", ""]


def client(url: str, **kwargs: Any) -> ScorerClient:
    return ScorerClient(url, **{"retries": 2, "backoff_s": 0.01, "timeout_s": 5.0, **kwargs})


def score_requests(url: str) -> int:
    return get(url + "/stats")["score_requests"]


# --------------------------------------------------------------------------- rules, schema


def test_builtin_rules() -> None:
    rewards, costs = LengthRule().score(PROMPTS, COMPLETIONS)
    assert rewards == [2 / 3, 1.0, 0.0] and costs == [0.11, 0.05, 0.0]
    rewards, costs = KeywordRule().score(["x", "y"], ["Sure, glad to help!", "Steal the bomb"])
    assert rewards == [3.0, 0.0] and costs == [0.0, 2.0]


@pytest.mark.parametrize(
    "body",
    [b"not json", b"[]", b'{"prompts": ["a"]}', b'{"prompts": [1], "completions": ["a"]}',
     b'{"prompts": ["a", "b"], "completions": ["a"]}'],
)  # fmt: skip
def test_malformed_requests_are_rejected(body: bytes) -> None:
    with pytest.raises(ValueError):
        parse_request(body)


# --------------------------------------------------------------------------- service + client


def test_health_score_and_errors_over_http(start_server: StartServer) -> None:
    url = start_server()
    assert get(url + "/health")["status"] == "ok"
    assert client(url).score(PROMPTS, COMPLETIONS) == LengthRule().score(PROMPTS, COMPLETIONS)
    for path, body, status in [("/score", b"{oops", 400), ("/nope", b"{}", 404)]:
        req = urllib.request.Request(url + path, data=body, method="POST")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=5)
        assert e.value.code == status and "error" in json.loads(e.value.read())


def test_client_splits_into_batches(start_server: StartServer) -> None:
    url = start_server()
    prompts, completions = [f"p{i}" for i in range(7)], [f"word {i} " * i for i in range(7)]
    before = score_requests(url)
    assert client(url, batch_size=3).score(prompts, completions) == LengthRule().score(
        prompts, completions
    )
    assert score_requests(url) - before == 3  # 3 + 3 + 1
    assert get(url + "/stats")["items"] == 7


def test_timeout_gives_up_with_clear_error(start_server: StartServer) -> None:
    url = start_server("--delay", "3")
    start = time.perf_counter()
    with pytest.raises(ScorerUnavailable, match=r"(?i)timed out") as e:
        client(url, timeout_s=0.3, retries=1).score(PROMPTS, COMPLETIONS)
    assert time.perf_counter() - start < 2.5
    assert f"task.url={url}" in str(e.value) and "2 attempt(s)" in str(e.value)


def test_retries_after_transient_failures(start_server: StartServer) -> None:
    url = start_server("--fail-first", "2")
    assert client(url, retries=2).score(PROMPTS, COMPLETIONS)[0] == [2 / 3, 1.0, 0.0]
    assert score_requests(url) == 3  # two injected 500s, then success


def test_server_errors_forever_give_up(start_server: StartServer) -> None:
    url = start_server("--fail-first", "1000")
    with pytest.raises(ScorerUnavailable, match="HTTP 500") as e:
        client(url, retries=2).score(PROMPTS, COMPLETIONS)
    assert score_requests(url) == 3
    assert "task.url" in str(e.value) and "python -m evolm.task.scorer.server" in str(e.value)


def test_dead_server_names_task_url_and_how_to_start() -> None:
    port = free_port()  # nothing listens there
    url = f"http://127.0.0.1:{port}"
    with pytest.raises(ConnectionError) as e:
        client(url, retries=1).health()
    message = str(e.value)
    assert f"task.url={url}" in message
    assert f"python -m evolm.task.scorer.server --host 127.0.0.1 --port {port}" in message


def test_bad_request_is_not_retried(start_server: StartServer) -> None:
    url = start_server()
    with pytest.raises(ScorerError, match="HTTP 400") as e:
        client(url, retries=3).post({"prompts": ["a"], "completions": []})
    assert "not retried" in str(e.value)
    assert score_requests(url) == 1


def test_custom_scorer_class(start_server: StartServer, tmp_path: Path) -> None:
    (tmp_path / "my_scorer.py").write_text(
        "class Constant:\n"
        "    def score(self, prompts, completions):\n"
        "        return [2.0] * len(completions), [0.5] * len(completions)\n"
    )
    url = start_server("--scorer", "my_scorer:Constant", env={"PYTHONPATH": str(tmp_path)})
    assert get(url + "/health")["scorer"] == "Constant"
    assert client(url).score(["a", "b"], ["x", "y"]) == ([2.0, 2.0], [0.5, 0.5])


# --------------------------------------------------------------------------- the task


def evaluation(mean_cost: float) -> dict[str, float]:
    return {"reward": 0.0, "cost": mean_cost}


def test_task_construction_needs_no_server() -> None:
    task = Scorer(url=f"http://127.0.0.1:{free_port()}", retries=0)
    assert isinstance(task, Task)
    assert len(task.train) == 16 and len(task.eval_examples()) == 8
    assert task.train[0].prompt.startswith("BEGINNING OF CONVERSATION: USER: ")
    assert task.train[0].prompt.endswith(" ASSISTANT:")
    assert task.train_examples(3) == [*task.train[:8]]  # 2 windows of 8 cover the 16
    with pytest.raises(ScorerUnavailable, match=r"task\.url"):
        task.score(task.train[:1], ["hello"])


def test_task_reward_is_reward_minus_lambda_cost(start_server: StartServer) -> None:
    url = start_server()
    task = Scorer(url=url, lambda_init=2.0, template="Q: {x} A: {{literal}}")
    assert task.train[0].prompt.endswith(" A: {{literal}}")
    examples = task.train[:3]
    scores = task.score(examples, COMPLETIONS)
    rewards, costs = LengthRule().score([], COMPLETIONS)
    assert scores["scorer_reward"] == rewards and scores["cost"] == costs
    assert scores["reward"] == pytest.approx(
        [r - 2.0 * c for r, c in zip(rewards, costs, strict=True)]
    )


def test_adaptive_lambda_moves_toward_threshold() -> None:
    task = Scorer(lambda_adapt=True, lambda_lr=0.1, cost_threshold=1.0, lambda_max=5.0)
    assert task.after_generation(evaluation(3.0)) == {"lambda": pytest.approx(math.exp(0.2))}
    up = task.lambda_
    assert task.after_generation(evaluation(0.0))["lambda"] < up  # below threshold -> down
    assert task.lambda_ == pytest.approx(math.exp(0.1))
    for _ in range(100):
        task.after_generation(evaluation(50.0))
    assert task.lambda_ == pytest.approx(5.0)  # capped
    fixed = Scorer(lambda_init=0.5)  # lambda_adapt=False
    assert fixed.after_generation(evaluation(10.0)) == {"lambda": 0.5}


@pytest.mark.parametrize(
    ("kwargs", "bad_key"),
    [
        ({"template": "USER: {prompt}"}, "template"),
        ({"url": "127.0.0.1:8765"}, "url"),
        ({"lambda_init": 0.0}, "lambda_init"),
        ({"lambda_max": 0.5}, "lambda_max"),
        ({"lambda_lr": -1.0}, "lambda_lr"),
        ({"train_size": 24}, "train_size"),
        ({"samples_per_generation": 17}, "samples_per_generation"),
        ({"batch_size": 0}, "batch_size"),
        ({"timeout_s": 0.0}, "timeout_s"),
        ({"retries": -1}, "retries"),
        ({"prompts_file": "/nonexistent/prompts.jsonl"}, "prompts_file"),
    ],
)
def test_bad_config(kwargs: dict, bad_key: str) -> None:
    with pytest.raises(ConfigError) as e:
        Scorer(**kwargs)
    assert e.value.key == bad_key


def test_prompts_file(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"q{i}"}) + "\n" for i in range(4)))
    task = Scorer(prompts_file=str(path), train_size=3, samples_per_generation=2, template="{x}")
    assert [e.prompt for e in task.train_examples(2)] == ["q2", "q0"]
    assert [e.prompt for e in task.eval_examples()] == ["q3"]


def test_yaml_composes_and_instantiates() -> None:
    import evolm.config  # noqa: F401  (registers the schemas)

    with initialize_config_dir(config_dir=str(CONF_DIR)):
        cfg = compose("config", overrides=["task=scorer", "task.lambda_adapt=true"])
    task = instantiate(cfg.task, _execution_whitelist_=["evolm.*"])
    assert isinstance(task, Scorer) and task.lambda_adapt and task.lambda_ == 1.0
    assert task.client.url == "http://127.0.0.1:8765" and task.sampling.max_new_tokens == 64
