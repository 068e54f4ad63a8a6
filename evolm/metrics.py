"""Metric names, spelled once: what a run's records hold.

A record is one line of ``results.jsonl`` and one MLflow step: ``generation`` plus namespaced
numbers. ``train/`` describes the generation's population, ``eval/`` the mean on held-out
prompts, ``es/`` the update, ``time/`` seconds, ``data/`` the task's data (generation 0 only).
A task's score ``k`` (any key its ``score`` returns besides ``reward``) appears as
``train/k_mean`` and ``eval/k_mean``; the population's mean reward is ``train/fitness_mean`` (a
member's fitness is its mean reward).

What the noise costs (``train_mean=true``, the default): the unperturbed ES mean answers the
generation's training rows too, as one more adapter in the members' engine call (same prompts,
same decoding; it is not a member: fitness, update and every other ``train/`` number are the
members'). ``train/mean/k`` is the mean's average of score ``k`` on those rows
(``train/mean/reward``, countdown's ``train/mean/accuracy``...), and ``train/member_gap`` is
``train/mean/reward`` minus the members' average reward (``train/fitness_mean``, up to
rounding): positive, the perturbations cost reward (es.sigma too large); near 0 or negative,
they do not. ``train/member_gap_se`` is its standard error over the generation's prompts
(paired: per prompt, the mean's reward minus the members' average on it;
:func:`evolm.diagnostics.member_gap_se`): a gap within two of them is noise.

Diagnostics (:mod:`evolm.diagnostics`) describe the completions themselves, as
``train/<name>`` for the generation's population and ``eval/<name>`` for the mean on held-out
prompts (the README's metrics table lists them all):

- ``empty_share``: the share of completions that are empty (whitespace only);
- ``truncated_share``: the share cut at the token budget (``task.max_new_tokens``) before an
  EOS (engines that say: local, SGLang, vLLM);
- ``completion_tokens``: the mean length in tokens, EOS not counted (local, SGLang);
- ``distinct_per_prompt`` (train): the mean over prompts of how many different completions the
  members wrote (1: all the same, ES gets no signal from that prompt; N: all differ);
- ``pass_at_population`` (train): where the task scores correctness (a ``accuracy`` score of
  1/0 per completion, as countdown's), the share of prompts at least one member solved (pass@N,
  N = es.population_size; the mean's greedy pass@1 is ``eval/accuracy_mean``);
- ``train/pair_agreement`` (antithetic sampling only): the share of mirrored pairs whose two
  members got equal fitness (1: the perturbations change nothing the reward sees).

A task's set-level numbers (its optional ``summarize`` hook, :class:`evolm.task.base.Task`)
are diagnostics too: ``train/<name>``, ``eval/<name>``, and ``eval/<extra>/<name>`` for an
extra eval task. Countdown's (:mod:`evolm.task.countdown.summary`) make shortcuts visible:

- ``shortcut_accuracy``: what a rule-only model would score on these puzzles (the best fixed
  rule per puzzle size: an operator pattern over the numbers in their order, ranked by size, or
  with the first one negated); ``shortcut/by_size`` and ``shortcut/first_negated``: the best of
  the last two kinds alone; ``shortcut/<template>``: what one named template scores
  (``shortcut/sum``, ``shortcut/product``, ``shortcut/chain_sub``, ``shortcut/chain_div``);
- ``template_solvable_share``: the share of puzzles some fixed pattern solves;
- ``accuracy_beyond_shortcuts``: the accuracy on the puzzles no template solves;
- ``template_share``: the share of the correct answers that are template answers;
- ``answer_form_top_share``: among the answers that parse, the share written in the most common
  form (per puzzle size, weighted): 1.0 is a model that writes one form for everything;
- ``accuracy/<subset>``: the accuracy per puzzle family (``accuracy/template``,
  ``accuracy/addsub``, ``accuracy/muldiv``) and per size (``accuracy/n3``, ``accuracy/n4``);
- ``answered_share``: the share of completions that give an answer (a closed ``<answer>`` pair);
  ``answer_precision``: of those, the share that are right. A model that commits to wrong
  answers (a small one calling ``yes`` at a try that misses) has a low precision; one that
  searches on until the token budget instead, a low answered share.

Score keys that start with ``_`` are per-row data for ``summarize`` alone (countdown's
``_template_answer``, ``_form``, ``_answered``): never logged as ``<key>_mean``, nor written
with the samples.

How far the mean is from the base model: ``eval/kl_mean`` and ``eval/kl_std``, the mean and
std over the eval completions' tokens of the per-token KL(mean-adapted || base) along them
(engines that can score it: the local one; :meth:`evolm.engine.base.Engine.kl_to_base`);
``es/update_rel`` and ``es/mean_rel``, the Frobenius norm of the weight change ``dW`` of the
generation's update and of the whole mean adapter, relative to the norm of the base weights they
adapt (:mod:`evolm.lora.norms`).
"""

from __future__ import annotations

GENERATION = "generation"

FITNESS_MEAN = "train/fitness_mean"
FITNESS_STD = "train/fitness_std"
FITNESS_MIN = "train/fitness_min"
FITNESS_MAX = "train/fitness_max"
FITNESS_P20 = "train/fitness_p20"
FITNESS_P80 = "train/fitness_p80"
FITNESS_NONFINITE = "train/fitness_nonfinite"

UPDATE_NORM = "es/update_norm"
MEAN_NORM = "es/mean_norm"
UPDATE_REL = "es/update_rel"  # ||dW of the update||_F / ||W||_F over the adapted base weights
MEAN_REL = "es/mean_rel"  # ||dW of the mean's adapter||_F / ||W||_F: how far from the base

EVAL_REWARD = "eval/reward_mean"
KL_MEAN = "kl_mean"  # per-token KL(mean-adapted || base) along the eval completions
KL_STD = "kl_std"
EVAL_KL_MEAN = f"eval/{KL_MEAN}"
EVAL_KL_STD = f"eval/{KL_STD}"

# diagnostics: bare names, namespaced by train_diagnostic / eval_diagnostic
PROMPTS = "prompts"  # how many prompts were scored (eval: the held-out set's size)
EMPTY_SHARE = "empty_share"
TRUNCATED_SHARE = "truncated_share"
COMPLETION_TOKENS = "completion_tokens"
DISTINCT_PER_PROMPT = "distinct_per_prompt"
PASS_AT_POPULATION = "pass_at_population"
CORRECT_SCORE = "accuracy"  # the task score that says a completion is correct (1) or not (0)
PAIR_AGREEMENT = "pair_agreement"  # train only: antithetic pairs

# a task's set-level numbers (Task.summarize): bare names, namespaced as diagnostics are
SHORTCUT_ACCURACY = "shortcut_accuracy"
TEMPLATE_SOLVABLE_SHARE = "template_solvable_share"
ACCURACY_BEYOND_SHORTCUTS = "accuracy_beyond_shortcuts"
TEMPLATE_SHARE = "template_share"
ANSWER_FORM_TOP_SHARE = "answer_form_top_share"
BLIND_ACCURACY = "blind_accuracy"  # what the answers' own forms score without reading the target
ACCURACY_LIFT = "accuracy_lift"  # accuracy - blind_accuracy: what choosing per puzzle adds
ANSWERED_SHARE = "answered_share"  # completions with an answer
ANSWER_PRECISION = "answer_precision"  # of those, the right ones
PRIVATE_SCORE = "_"  # score keys with this prefix travel to Task.summarize only


def shortcut(template: str) -> str:
    """What one named answer template scores on a set of puzzles, e.g. ``shortcut/sum``."""
    return f"shortcut/{template}"


def subset_accuracy(subset: str) -> str:
    """The accuracy on one subset of the prompts, e.g. ``accuracy/muldiv``."""
    return f"accuracy/{subset}"


def size_subset(size: int) -> str:
    """The subset of the puzzles of ``size`` numbers, e.g. ``n3``."""
    return f"n{size}"


def is_private_score(key: str) -> bool:
    """A score key for ``Task.summarize`` alone (``_form``): not a metric."""
    return key.startswith(PRIVATE_SCORE)


GENERATION_S = "time/generation_s"
TRAIN_S = "time/train_s"  # training time so far: the sum of time/generation_s (evals excluded)
GENERATE_S = "time/generate_s"
SCORE_S = "time/score_s"
ES_S = "time/es_s"
EVAL_S = "time/eval_s"
COMM_S = "time/comm_s"  # distributed runs: the generation's all-gather and mean check


def train_score(key: str) -> str:
    """The population's mean of a task score, e.g. ``train/accuracy_mean``."""
    return f"train/{key}_mean"


def train_mean_score(key: str) -> str:
    """The unperturbed mean's average of a task score on the generation's training rows, e.g.
    ``train/mean/accuracy`` (``train_mean=true``)."""
    return f"train/mean/{key}"


TRAIN_MEAN_REWARD = train_mean_score("reward")
MEMBER_GAP = "train/member_gap"  # train/mean/reward - the members' average reward
MEMBER_GAP_SE = "train/member_gap_se"  # its standard error, paired by prompt


def eval_score(key: str) -> str:
    """The mean's mean of a task score on the eval split, e.g. ``eval/reward_mean``."""
    return f"eval/{key}_mean"


def extra_eval_score(name: str, key: str) -> str:
    """A score of the mean on the extra eval task ``name`` (``extra_evals``), e.g.
    ``eval/countdown/accuracy_mean``: what ES costs (or gains) on a task it does not train."""
    return f"eval/{name}/{key}_mean"


def extra_eval_diagnostic(name: str, key: str) -> str:
    """A diagnostic of the mean's completions on the extra eval task ``name``, e.g.
    ``eval/countdown/shortcut_accuracy``."""
    return f"eval/{name}/{key}"


def train_diagnostic(key: str) -> str:
    """A diagnostic of the generation's population, e.g. ``train/empty_share``."""
    return f"train/{key}"


def eval_diagnostic(key: str) -> str:
    """A diagnostic of the mean's completions on the eval split, e.g. ``eval/empty_share``."""
    return f"eval/{key}"


def task_stat(key: str) -> str:
    """A number the task's ``after_generation`` hook returned, e.g. ``train/lambda``."""
    return f"train/{key}"


def data_stat(key: str) -> str:
    """A number about the task's data (its ``data_stats`` hook), in generation 0's record, e.g.
    ``data/train_test_overlap``."""
    return f"data/{key}"


def engine_time(key: str) -> str:
    """A phase of the engine's last generation, e.g. ``time/engine_decode_s``."""
    return f"time/engine_{key}"


def is_eval(key: str) -> bool:
    """Keys an evaluation of the mean adds to a record."""
    return key.startswith("eval/") or key == EVAL_S
