"""Runs that cannot learn say so: a callback that watches every generation's record.

An ES run whose members all score the same gets no signal (z-scores and ranks of a constant are
all zero), so its mean never moves, yet it exits 0. :class:`LearningMonitor` warns, loudly and
once per condition, when for ``patience`` generations in a row

- every member's fitness is equal (``train/fitness_std`` is 0), or non-finite, or
- the mean did not move (``es/update_norm`` is 0),

naming the likely causes and the keys to change, tags the run (``ctx.tags``, which the MLflow
logger copies onto the MLflow run: ``evolm.health``), and with ``abort=true`` ends the run with
:class:`~evolm.errors.RunAborted`. A tie that comes after ``patience`` generations with a signal
is reported apart, as a run that has stopped learning (converged, or the task saturated), not
one that never could. A generation in which more than ``max_nonfinite`` of the members had a
NaN/inf fitness (they rank worst) ends the run at once.

A run that learns the wrong thing is reported the same way (``gaming_empty``,
``gaming_truncated``): when for ``patience`` generations the population's fitness is above its
first generation's while its share of empty completions, or of completions cut at the token
budget, has risen by ``gaming_rise`` or more (:mod:`evolm.diagnostics`), the reward pays for
answering nothing (or for never stopping): ``THIS RUN IS GAMING ITS REWARD``, naming the metric.

A run that learns a shortcut (``shortcut``) is told so at an evaluation of the mean: when the
held-out accuracy (``eval/accuracy_mean``) has risen by ``shortcut_rise`` or more above the
run's first evaluation while the accuracy lift (``eval/accuracy_lift``: the accuracy minus what
the mean's own answer forms score written without reading the target,
:mod:`evolm.task.countdown.blind`) rose by less than half of that (:data:`LIFT_SHARE`):
``THIS RUN IS LEARNING A SHORTCUT``, quoting the numbers. Issue 36's 1.5B rose from 2.5% to
13.9% writing size-ranked sign rules (lift +1.1 -> +0.5 points); with the paper's effective
reward it rose to 17.4% by checking candidates against the target (lift +1.1 -> +12.8), still
below the best fixed rule (17.5%) and with 56% of its correct answers template-shaped: the lift
tells the two apart where the template figures cannot. Where the eval reports no lift, the
proxies decide: the accuracy on the puzzles no answer template solves
(``eval/accuracy_beyond_shortcuts``) rose by less than a quarter of the rise, or
:data:`TEMPLATE_SHARE_ALARM` or more of the correct answers are template answers
(``eval/template_share``), or the accuracy is still below what the best fixed rule alone
scores (``eval/shortcut_accuracy``, over the puzzle's order, the numbers ranked by size and
the first number negated).
The names are generic (:mod:`evolm.metrics`): any task whose ``summarize`` reports them is
watched. A change of the held-out accuracy counts only beyond its sampling error: it must reach
:data:`RISE_Z` standard errors of a difference of two binomial proportions, each evaluation a
sample of ``eval/prompts`` puzzles (Agresti and Caffo's estimate, one success and one failure
added to each, so 0 of 32 -> 1 of 32 is 0.6 standard errors, not a rise: the tiny model's
countdown demo went so and was once told it learned a shortcut). A first evaluation logged
before ``eval/prompts`` existed is taken to be of the current one's size; a current one
without it is judged without the test.

A run paid for something other than its task is told so when, at :data:`FELL_EVALS`
evaluations in a row, the population's fitness has risen while the mean's held-out accuracy has
not: ``THIS RUN IS GAMING ITS REWARD``, quoting both. ``accuracy_fell``: the fitness is above the
first generation's while the accuracy has fallen by ``shortcut_rise``, by half or more below
the first evaluation's and beyond its sampling error (above) (issue 36: with
``task.blind_baseline=true`` the 1.5B stopped reasoning to collect the format reward, 2.5% ->
0.0% in 20 generations). ``accuracy_flat``: the fitness, or the mean's reward on the held-out
puzzles (``eval/reward_mean``, against the first evaluation's; a generation's fitness is on
that generation's puzzles and may dip below the first's while it climbs), has risen by at least
the first spread across members of the run
(``train/fitness_std`` of its first generation whose members did not all tie; a rise of the
population mean that large is several standard errors) while the accuracy has risen by
less than ``shortcut_rise`` (issue 36's 0.5B with a format weight of 0.02: fitness 0.011 ->
0.019, every answer ``(a + b) / 3``, accuracy 0.0% -> 0.05% for 141 generations) or within its
sampling error (the tiny model's countdown demo: 0 -> 1 of 32 puzzles while its fitness, the
format reward, rose 0.33 -> 0.72, every answer the sum of the numbers; on a later build the
fitness rose 0.072 -> 0.093, under its spread of 0.029, while the held-out reward rose 0.069 ->
0.112 at an accuracy of 1 of 32 throughout; on session 32's build the held-out reward rose
0.118 -> 0.225 -> 0.239 at 3 -> 5 -> 5 of 32 while the fitness went 0.105 -> 0.128 -> 0.081,
its generations' puzzles easier, then harder, than the first's).

A run that never answers correctly (``never_correct``) is told so when for
``STREAK_NEEDED["never_correct"]`` (20) generations in a row, and ``patience``, no member solved
a single training prompt (``train/pass_at_population`` is 0; tasks that score correctness) while
the members' fitness still differs: ES then selects on the reward's other terms alone, which need
not lead to correct answers: ``THIS RUN NEVER ANSWERS CORRECTLY``. Issue 36's 0.5B on the
countdown puzzles that need ``*`` or ``/`` (``task.train_family=[muldiv]``, closeness weight 0.1,
from an adapter that solves 0.4% of such test puzzles): in 90 generations no member solved any
of the 76, the mean's closeness rose 0.23 -> 0.50, and it tried ``*`` in fewer answers (133 ->
23 of the 2,000 test puzzles), solving 1 of them where it had solved 4.

A run whose perturbations break the model (``noise_destroys``) is told so from the mean's reward
on the members' own training rows (``train_mean=true``: ``train/mean/reward``,
``train/member_gap`` and its standard error ``train/member_gap_se``, :mod:`evolm.metrics`):
``THE NOISE DESTROYS WHAT THE MEAN DOES`` when in EACH of the run's first :data:`NOISE_WINDOW`
generations that report them

- the mean's reward is away from 0 by more than :data:`NOISE_Z` standard errors of the gap,
- the gap (the mean's reward minus the members' average) is more than :data:`NOISE_SHARE` of
  the mean's reward's size (for a reward of 0 or more: the members score below half of the
  mean's), and
- the gap is larger than :data:`NOISE_Z` of its standard errors (paired by prompt: a gap of a
  correct answer or two on a handful of prompts is within them, and a single prompt has none),

so a difference the prompts' sampling explains does not fire it (three generations in a row at
over 3 standard errors each). The size is the distance from 0 (a mean about 0, as with the
blind baseline, is not judged), so a reward whose best is 0 is judged too: conciseness (minus
the length error) with members at -58 where the mean scores -4 has lost more than half of what
the mean does. Judged once, when the window is complete (a
resumed run whose history completed it is not judged again); once told, members that all tie
(at the broken members' reward) are not also reported as ``members_tie``, whose advice is to
raise es.sigma. The GPU run that motivated it: Qwen2.5-Coder-0.5B on countdown at
``es.sigma=0.002``, members solving 0.4-2.4% of the training puzzles while the unperturbed mean
solves 7-20%: ES then selects among broken members.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping

from evolm import metrics as M
from evolm.callbacks.base import Callback, RunContext
from evolm.callbacks.record import GenerationRecord, Record
from evolm.errors import ConfigError, RunAborted
from evolm.es import ESState

log = logging.getLogger(__name__)

TAG = "evolm.health"
NEVER_CORRECT = "never_correct"

ADVICE = {
    "members_tie": (
        "every member scored the same fitness ({fitness}) for {n} generations: ES gets no "
        "signal and the mean cannot move. Likely causes: the perturbations are too small to "
        "change the (greedy) outputs (raise es.sigma; with es.mean=lora also "
        "lora.init_scale), or the reward is the "
        "same for every completion (check that the base model can earn any reward on this task, "
        "e.g. the answer format; task.max_new_tokens may cut answers off)"
    ),
    "members_stalled": (
        "every member scored the same fitness ({fitness}) for {n} generations, after {learned} "
        "generations with a signal: the run has stopped learning. The perturbations no longer "
        "change the outputs (the population has converged, or the task is saturated at this "
        "fitness for the current answers). To explore further raise es.sigma; to stop such runs "
        "early, callbacks.health.abort=true"
    ),
    "no_fitness": (
        "no member had a finite fitness for {n} generations: the task's rewards are NaN or "
        "infinite (check task.* and its data, or the scorer service)"
    ),
    "mean_static": (
        "the mean did not move for {n} generations (es/update_norm = 0) although the members' "
        "fitness differs: es.alpha is too small to change an fp32 mean, or es.optimizer "
        "settings cancel the step"
    ),
    "gaming_empty": (
        "the population's fitness rose from {start} to {fitness} while its share of empty "
        "completions ({metric}) rose from {share_start} to {share}: the reward pays for "
        "answering nothing. Check what the task's reward gives an empty completion (conciseness "
        "scores it -len(reference), above a long wrong answer) and read the mean's completions"
    ),
    "gaming_truncated": (
        "the population's fitness rose from {start} to {fitness} while its share of completions "
        "cut at the token budget ({metric}) rose from {share_start} to {share}: the reward pays "
        "for length, or for answers that never end. Check the task's reward for long answers, "
        "and task.max_new_tokens"
    ),
    NEVER_CORRECT: (
        "no member answered any of the {prompts} training prompts correctly for {n} "
        "generations ({metric} = 0) while their fitness differs (spread {spread}): ES selects "
        "on the reward's other terms alone (countdown: task.closeness_weight, "
        "task.format_weight), which need not lead to correct answers. Train on prompts the "
        "model sometimes solves (countdown: task.train_family, task.train_n, task.shots; its "
        "start eval, eval/accuracy_mean, says how often it does)"
    ),
}
STREAK_NEEDED = {NEVER_CORRECT: 20}
"""Generations in a row a condition must hold, where more than ``patience``: none of the members
solving a training prompt is how every hard task starts, and is told only when it lasts (the
tiny model's countdown demo, 16 puzzles a generation, has gone 8 generations without a solve)."""
GAMING = {"gaming_empty": M.EMPTY_SHARE, "gaming_truncated": M.TRUNCATED_SHARE}
"""Reward-gaming conditions and the diagnostic (``train/<name>``) each watches."""

SHORTCUT = "shortcut"
FELL = "accuracy_fell"
FLAT = "accuracy_flat"
FELL_EVALS = 2
"""Evaluations in a row at which the accuracy must have fallen, or stayed flat while the fitness
rose (one can be noise)."""
FELL_ADVICE = (
    "the population's fitness rose from {start} to {fitness} while the mean's held-out accuracy "
    "({acc}) fell from {acc_start} to {acc_now} at {n} evaluations in a row: the reward pays for "
    "something other than solving the task. Read the mean's completions ({samples}) and check "
    "what the reward's other terms pay (countdown: the format reward, task.format_weight; with "
    "task.blind_baseline=true it is all that a fixed answer earns)"
)
FLAT_ADVICE = (
    "the population's fitness {moved} from {start} to {fitness} (its first spread across members: "
    "{spread}){held} while the mean's held-out accuracy ({acc}) went from {acc_start} "
    "to {acc_now} at {n} evaluations in a row{train}{noise}: the reward pays for something other "
    "than solving held-out puzzles. Read the mean's completions ({samples}) and check what the "
    "reward's other terms pay (countdown: task.format_weight, task.closeness_weight), and "
    "whether the training accuracy rose alone (memorized training puzzles, or a training "
    "split unlike the held-out one, e.g. countdown's task.train_n or task.train_family: "
    "compare the held-out accuracy by puzzle family)"
)
TRAIN_ACCURACY = M.train_score(M.CORRECT_SCORE)
SOLVED = M.train_diagnostic(M.PASS_AT_POPULATION)
NOISE = "noise_destroys"
NOISE_WINDOW = 3
"""The run's first generations with the mean's training reward that the noise rule reads."""
NOISE_SHARE = 0.5
"""The gap must exceed this share of the mean's reward's size (its absolute value)."""
NOISE_Z = 3.0
"""The gap must exceed this many standard errors of the gap."""
NOISE_ADVICE = (
    "members score {members} on the training rows ({fitness}), the unperturbed mean {mean} on "
    "the same rows ({mean_name}), averaged over generations {first}-{last}; in each, the gap "
    "({gap}) was over {z:g} standard errors ({se}). ES is selecting among broken members: "
    "lower es.sigma{now} until the members score near the mean (a smaller es.sigma keeps more "
    "of what the mean does; watch {gap})"
)
TEMPLATE_SHARE_ALARM = 0.9
"""A share of template answers among the correct ones this high, with the accuracy risen, is a
shortcut whatever the other puzzles do."""
BEYOND_SHARE = 0.25
"""Accuracy beyond shortcuts must rise by at least this share of the accuracy's rise."""
RISE_Z = 2.0
"""A held-out accuracy's change must reach this many of its standard errors (module doc)."""
LIFT_SHARE = 0.5
"""Where the eval reports the accuracy lift, it must account for at least this share of the
accuracy's rise; it then decides alone (the template figures are its proxies)."""
ACCURACY = M.eval_score(M.CORRECT_SCORE)
BEYOND = M.eval_diagnostic(M.ACCURACY_BEYOND_SHORTCUTS)
TEMPLATES = M.eval_diagnostic(M.TEMPLATE_SHARE)
BEST_TEMPLATE = M.eval_diagnostic(M.SHORTCUT_ACCURACY)
LIFT = M.eval_diagnostic(M.ACCURACY_LIFT)
BLIND = M.eval_diagnostic(M.BLIND_ACCURACY)
PROMPTS = M.eval_diagnostic(M.PROMPTS)
# the shortcut baseline of a run with no eval of its start (eval_start=false): a base taken to
# score nothing, so the whole accuracy is the rise and the whole lift the lift's (the 0.5B's
# seed-1 run of issue 36 ended at 9.6%, lift -2.5 points, and was flagged only so)
NO_START = {ACCURACY: 0.0, BEYOND: 0.0, LIFT: 0.0, PROMPTS: 0.0}  # no puzzles: no sampling error
SHORTCUT_ADVICE = (
    "held-out accuracy ({acc}) rose from {acc_start} to {acc_now} while the accuracy on the "
    "puzzles no answer template solves ({beyond}) went from {beyond_start} to {beyond_now}; "
    "{share} of the correct answers are template answers ({templates}), the best fixed rule "
    "alone scores {best} on these puzzles ({best_name}), and the mean's own answer forms, "
    "written without reading the target, would score {blind} ({blind_name}: accuracy lift "
    "{lift_start} -> {lift_now}). The model answers from the numbers' order or sizes instead of "
    "solving. Read the mean's answers ({samples}), and measure it where no template helps "
    "(task.drop_templates=test, or task.generator=uniform)"
)


class LearningMonitor(Callback):
    """Warns (and with ``abort``, stops the run) when a run cannot learn; see the module doc.

    Args:
        patience: generations in a row a condition must hold before it is reported (>= 1).
        abort: end the run with RunAborted instead of going on after the warning.
        population_size: members per generation (``${es.population_size}``), for the fraction
            below; null: that check is off.
        max_nonfinite: the largest fraction of a generation's members whose fitness may be
            non-finite (NaN/inf rewards: they rank worst and the run goes on); more, and the
            run stops at once with RunAborted, whatever ``abort`` says (1.0: never).
        gaming_rise: how much the share of empty (or truncated) completions must have risen
            since the first generation, with the fitness above the first generation's, to be
            reported as reward gaming (in (0, 1]; 1.0 only flags a rise from none to all).
        shortcut_rise: how much the held-out accuracy must have risen since the first
            evaluation, without the accuracy beyond shortcuts following, to be reported as a
            shortcut (in (0, 1]).
        sigma: the run's ``es.sigma`` (``${es.sigma}``), quoted by the noise warning; null:
            not quoted.
    """

    every_rank = True  # its abort must stop every rank of a distributed run alike

    def __init__(
        self,
        patience: int = 3,
        abort: bool = False,
        population_size: int | None = None,
        max_nonfinite: float = 0.5,
        gaming_rise: float = 0.25,
        shortcut_rise: float = 0.02,
        sigma: float | None = None,
    ) -> None:
        if patience < 1:
            raise ConfigError("patience", f"must be >= 1, got {patience}", "e.g. 3")
        if not 0.0 <= max_nonfinite <= 1.0:
            raise ConfigError(
                "max_nonfinite", f"must be in [0, 1], got {max_nonfinite}", "e.g. 0.5 (1.0: off)"
            )
        if not 0.0 < gaming_rise <= 1.0:
            raise ConfigError(
                "gaming_rise", f"must be in (0, 1], got {gaming_rise}", "e.g. 0.25 (1.0: lenient)"
            )
        if not 0.0 < shortcut_rise <= 1.0:
            raise ConfigError(
                "shortcut_rise", f"must be in (0, 1], got {shortcut_rise}", "e.g. 0.02"
            )
        self.patience, self.abort, self.gaming_rise = patience, abort, gaming_rise
        self.shortcut_rise, self.sigma = shortcut_rise, sigma
        self.population_size, self.max_nonfinite = population_size, max_nonfinite
        self._reset()

    def _reset(self) -> None:
        self.streaks: dict[str, int] = dict.fromkeys(ADVICE, 0)
        self.reported: set[str] = set()
        self.learned = 0  # generations whose members' fitness differed and the mean moved
        self.first: Record | None = None  # the run's first generation (the gaming baseline)
        self.spread: float | None = None  # the first fitness spread across members (not a tie)
        self.first_eval: Record | None = None  # the run's first eval (the shortcut baseline)
        self.fell = 0  # evaluations in a row with the accuracy fallen and the fitness risen
        self.noise_window: list[Record] = []  # the first generations with train/mean/reward

    def on_run_start(self, ctx: RunContext, state: ESState) -> None:
        self._reset()
        self.first = next((r for r in ctx.history if M.FITNESS_STD in r), None)
        self.spread = next(filter(None, map(_spread, ctx.history)), None)
        self.first_eval = next((r for r in ctx.history if ACCURACY in r), None)
        if self.first_eval is None and ctx.history:  # resumed; its start was not evaluated
            self.first_eval = dict(NO_START)
        scored = [r for r in ctx.history if M.TRAIN_MEAN_REWARD in r]
        self.noise_window = scored[:NOISE_WINDOW]  # complete: judged by the run before

    def on_generation_end(
        self, ctx: RunContext, generation: GenerationRecord, state: ESState
    ) -> None:
        if generation.generation == 0 and not generation.eval and self.first_eval is None:
            self.first_eval = dict(NO_START)  # eval_start=false
        if generation.eval and SHORTCUT not in self.reported and self._shortcut(generation.eval):
            self._report_shortcut(ctx, generation.generation, generation.eval)
        if generation.es is None:
            return  # the start's eval record
        record = generation.as_record()  # flat, as the baseline from ctx.history is
        self._check_nonfinite(record)
        self.spread = self.spread or _spread(record)
        self._watch_noise(ctx, record)
        if generation.eval and ACCURACY in generation.eval and not self.reported & {FELL, FLAT}:
            verdict = self._paid_elsewhere(generation.eval, record)
            self.fell = self.fell + 1 if verdict else 0
            if verdict and self.fell >= FELL_EVALS:
                self._report_fell(ctx, record, generation.eval, verdict)
        std, mean = record[M.FITNESS_STD], record[M.FITNESS_MEAN]
        tie = math.isfinite(mean) and _tie(std, mean)
        # a tie after learning is a stall (saturated or converged), not a run that never could
        stalled = tie and self.learned >= self.patience
        now = {  # members broken by the noise tie too: "raise es.sigma" would be the wrong fix
            "members_tie": tie and not stalled and NOISE not in self.reported,
            "members_stalled": stalled,
            "no_fitness": not math.isfinite(mean),
            "mean_static": math.isfinite(std) and std > 0 and record[M.UPDATE_NORM] == 0.0,
            NEVER_CORRECT: math.isfinite(std) and std > 0 and record.get(SOLVED) == 0.0,
            **self._gaming(record),
        }
        self.learned += bool(math.isfinite(std) and std > 0 and record[M.UPDATE_NORM] > 0.0)
        for condition, holds in now.items():
            self.streaks[condition] = self.streaks[condition] + 1 if holds else 0
            needed = max(self.patience, STREAK_NEEDED.get(condition, 0))
            if self.streaks[condition] >= needed and condition not in self.reported:
                self._report(ctx, condition, record)

    def _watch_noise(self, ctx: RunContext, record: Record) -> None:
        """Add ``record`` to the noise rule's window while it is open; judge it once full."""
        if M.TRAIN_MEAN_REWARD not in record or len(self.noise_window) >= NOISE_WINDOW:
            return
        self.noise_window.append(record)
        window = self.noise_window
        if len(window) == NOISE_WINDOW and all(map(_noise_costs, window)):
            mean = sum(r[M.TRAIN_MEAN_REWARD] for r in window) / len(window)
            gap = sum(r[M.MEMBER_GAP] for r in window) / len(window)
            message = NOISE_ADVICE.format(
                members=f"{mean - gap:.4g}",
                fitness=M.FITNESS_MEAN,
                mean=f"{mean:.4g}",
                mean_name=M.TRAIN_MEAN_REWARD,
                first=window[0][M.GENERATION],
                last=window[-1][M.GENERATION],
                gap=M.MEMBER_GAP,
                z=NOISE_Z,
                se=M.MEMBER_GAP_SE,
                now="" if self.sigma is None else f" (now {self.sigma:g})",
            )
            headline = "THE NOISE DESTROYS WHAT THE MEAN DOES"
            self._tell(ctx, NOISE, message, headline, record[M.GENERATION])

    def _gaming(self, record: Record) -> dict[str, bool]:
        """Whether the fitness is above the first generation's while a share of degenerate
        completions has risen by ``gaming_rise``, per condition of :data:`GAMING`."""
        first = self.first = self.first or record
        rose = record[M.FITNESS_MEAN] > first[M.FITNESS_MEAN]  # False for NaN
        out = {}
        for condition, key in GAMING.items():
            name = M.train_diagnostic(key)
            grown = record.get(name, 0.0) - first.get(name, math.inf)
            out[condition] = bool(rose and grown >= self.gaming_rise)
        return out

    def _shortcut(self, evaluation: Mapping[str, float]) -> bool:
        """:func:`learned_a_shortcut` since the first eval (the baseline, kept here)."""
        if ACCURACY not in evaluation:
            return False
        if self.first_eval is None:
            self.first_eval = dict(evaluation)
            return False
        return learned_a_shortcut(self.first_eval, evaluation, self.shortcut_rise)

    def _paid_elsewhere(self, evaluation: Mapping[str, float], record: Record) -> str | None:
        """:data:`FELL` when the held-out accuracy has fallen by ``shortcut_rise``, by half or
        more and by :data:`RISE_Z` standard errors below the first evaluation's while the
        fitness is above the first generation's;
        :data:`FLAT` when it has risen by less than ``shortcut_rise`` or by less than
        :data:`RISE_Z` standard errors while the fitness, or the mean's reward on the same
        held-out puzzles (``eval/reward_mean``), has risen by the run's first spread across
        members or more (none yet, every generation a tie: not judged); else None."""
        if self.first_eval is None or self.first is None or ACCURACY not in self.first_eval:
            return None
        start, now = self.first_eval[ACCURACY], evaluation[ACCURACY]
        rise = record[M.FITNESS_MEAN] - self.first[M.FITNESS_MEAN]  # NaN: no rise below
        fall, se = start - now, _change_se(self.first_eval, evaluation)
        fell = fall >= max(self.shortcut_rise, start / 2) and not fall < RISE_Z * se  # NaN se: off
        if rise > 0 and fell:
            return FELL
        # flat: a rise under shortcut_rise or within its sampling error (NaN se: the first only)
        flat = now - start < self.shortcut_rise or now - start < RISE_Z * se
        # risen: the fitness, or the mean's reward on the same held-out puzzles (NaN: no)
        held = evaluation.get(M.EVAL_REWARD, math.nan) - self.first_eval.get(
            M.EVAL_REWARD, math.nan
        )
        # a generation's fitness is on that generation's puzzles: it may dip below the first
        # generation's while the reward on the same held-out puzzles climbs
        risen = self.spread is not None and (rise >= self.spread or held >= self.spread)
        return FLAT if flat and risen else None

    def _report_fell(
        self, ctx: RunContext, record: Record, evaluation: Mapping[str, float], condition: str
    ) -> None:
        first, first_eval = self.first or {}, self.first_eval or {}
        train = ""
        if TRAIN_ACCURACY in first and TRAIN_ACCURACY in record:
            train = (
                f" (training accuracy, {TRAIN_ACCURACY}: {_share(first, TRAIN_ACCURACY)} -> "
                f"{_share(record, TRAIN_ACCURACY)})"
            )
        held = ""
        if M.EVAL_REWARD in first_eval and M.EVAL_REWARD in evaluation:
            held = (
                f", the mean's held-out reward ({M.EVAL_REWARD}) from "
                f"{first_eval[M.EVAL_REWARD]:.6g} to {evaluation[M.EVAL_REWARD]:.6g}"
            )
        start, fitness = first.get(M.FITNESS_MEAN, math.nan), record[M.FITNESS_MEAN]
        message = (FELL_ADVICE if condition == FELL else FLAT_ADVICE).format(
            start=f"{start:.6g}",
            fitness=f"{fitness:.6g}",
            moved="rose" if fitness > start else "went",
            spread=f"{self.spread if self.spread is not None else math.nan:.6g}",
            held=held,
            acc=ACCURACY,
            acc_start=_share(first_eval, ACCURACY),
            acc_now=_share(evaluation, ACCURACY),
            n=self.fell,
            train=train,
            noise=_within_noise(first_eval, evaluation),
            samples=f"{ctx.output_dir}/samples/gen-*.jsonl",
        )
        headline = f"THIS RUN IS GAMING ITS REWARD ({ACCURACY})"
        self._tell(ctx, condition, message, headline, record[M.GENERATION])

    def _tell(
        self,
        ctx: RunContext,
        condition: str,
        message: str,
        headline: str,
        generation: float,
        advise: bool = True,
    ) -> None:
        """Tag the run with ``condition``, then stop it (``abort``) or warn, once (``advise``:
        the warning ends by saying how to stop such runs)."""
        self.reported.add(condition)
        ctx.tags[TAG] = condition
        if self.abort:
            raise RunAborted(
                f"{message}. The run was stopped (callbacks.health.abort=true) at generation "
                f"{generation}"
            )
        advice = " Set callbacks.health.abort=true to stop such runs." if advise else ""
        log.warning("%s: %s.%s", headline, message, advice)

    def _report_shortcut(
        self, ctx: RunContext, generation: int, evaluation: Mapping[str, float]
    ) -> None:
        first = self.first_eval or {}
        acc_start = _share(first, ACCURACY)
        if first.get(PROMPTS) == 0:  # NO_START: say so, a reader would take 0.0% as measured
            acc_start += " (the start was not evaluated, eval_start=false: taken as 0)"
        message = SHORTCUT_ADVICE.format(
            acc=ACCURACY,
            acc_start=acc_start,
            acc_now=_share(evaluation, ACCURACY),
            beyond=BEYOND,
            beyond_start=_share(first, BEYOND),
            beyond_now=_share(evaluation, BEYOND),
            share=_share(evaluation, TEMPLATES),
            templates=TEMPLATES,
            best=_share(evaluation, BEST_TEMPLATE),
            best_name=BEST_TEMPLATE,
            blind=_share(evaluation, BLIND),
            blind_name=BLIND,
            lift_start=_share(first, LIFT),
            lift_now=_share(evaluation, LIFT),
            samples=f"{ctx.output_dir}/samples/gen-*.jsonl",
        )
        self._tell(ctx, SHORTCUT, message, "THIS RUN IS LEARNING A SHORTCUT", generation)

    def _check_nonfinite(self, record: Record) -> None:
        """Stop the run when more than ``max_nonfinite`` of the members had no finite fitness."""
        n, bad = self.population_size, int(record.get(M.FITNESS_NONFINITE, 0))
        if not n or bad <= self.max_nonfinite * n:
            return
        raise RunAborted(
            f"{bad} of {n} members ({bad / n:.0%}) had a NaN or infinite fitness in generation "
            f"{record[M.GENERATION]}, more than callbacks.health.max_nonfinite="
            f"{self.max_nonfinite}: the task's rewards are NaN or infinite (check task.* and "
            "its data, or the scorer service). Such members rank worst; to go on regardless, "
            "raise callbacks.health.max_nonfinite (1.0: never stop)"
        )

    def _report(self, ctx: RunContext, condition: str, record: Record) -> None:
        message = ADVICE[condition].format(
            fitness=f"{record[M.FITNESS_MEAN]:.6g}",
            n=self.streaks[condition],
            learned=self.learned,
            **self._gaming_figures(condition, record),
            **self._never_correct_figures(condition, record),
        )
        generation = record[M.GENERATION]
        if condition == "members_stalled":  # its advice already says how to stop such runs
            self._tell(ctx, condition, message, "THIS RUN HAS STOPPED LEARNING", generation, False)
        elif condition == NEVER_CORRECT:
            self._tell(ctx, condition, message, "THIS RUN NEVER ANSWERS CORRECTLY", generation)
        elif condition in GAMING:
            headline = f"THIS RUN IS GAMING ITS REWARD ({M.train_diagnostic(GAMING[condition])})"
            self._tell(ctx, condition, message, headline, generation)
        else:
            self._tell(ctx, condition, message, "THIS RUN IS NOT LEARNING", generation)

    def _gaming_figures(self, condition: str, record: Record) -> dict[str, str]:
        """The numbers a reward-gaming message quotes (none for the other conditions)."""
        if condition not in GAMING or self.first is None:
            return {}
        name = M.train_diagnostic(GAMING[condition])
        return {
            "start": f"{self.first[M.FITNESS_MEAN]:.6g}",
            "metric": name,
            "share_start": f"{self.first[name]:.2f}",
            "share": f"{record[name]:.2f}",
        }

    @staticmethod
    def _never_correct_figures(condition: str, record: Record) -> dict[str, str]:
        """The numbers the never-correct message quotes (none for the other conditions)."""
        if condition != NEVER_CORRECT:
            return {}
        prompts = record.get(M.train_diagnostic(M.PROMPTS), math.nan)
        return {
            "prompts": f"{prompts:.0f}",
            "metric": SOLVED,
            "spread": f"{record[M.FITNESS_STD]:.6g}",
        }


def _noise_costs(record: Record) -> bool:
    """Whether in this generation the mean's reward was away from 0 by :data:`NOISE_Z`
    standard errors of the gap, and the gap (the mean's reward minus the members') above
    :data:`NOISE_SHARE` of the mean's reward's size and above :data:`NOISE_Z` of its standard
    errors (NaN anywhere: no)."""
    mean = record[M.TRAIN_MEAN_REWARD]
    gap = record.get(M.MEMBER_GAP, math.nan)
    se = record.get(M.MEMBER_GAP_SE, math.nan)
    sized = abs(mean) > NOISE_Z * se  # "half of a reward of about 0" is no measure
    return bool(sized and gap > NOISE_SHARE * abs(mean) and gap > NOISE_Z * se)


def learned_a_shortcut(
    first: Mapping[str, float], evaluation: Mapping[str, float], min_rise: float = 0.02
) -> bool:
    """Whether the held-out accuracy rose from the ``first`` evaluation to ``evaluation`` by
    ``min_rise`` and by :data:`RISE_Z` standard errors while the accuracy lift did not follow
    (less than :data:`LIFT_SHARE` of the rise); where no lift is reported, while the accuracy
    beyond shortcuts did not follow, or nearly every correct answer is a template answer, or
    one fixed rule would still score more. The test the health monitor applies to every
    evaluation (``THIS RUN IS LEARNING A SHORTCUT``), for any two evaluations' records: the GRPO
    baseline's report applies it too."""
    if ACCURACY not in evaluation or ACCURACY not in first:
        return False
    rise = evaluation[ACCURACY] - first[ACCURACY]
    if not rise >= min_rise or rise < RISE_Z * _change_se(first, evaluation):
        return False  # NaN rise: no; NaN standard error (sizes not logged): not tested
    lift = evaluation.get(LIFT, math.nan) - first.get(LIFT, math.nan)
    if not math.isnan(lift):  # measured: what choosing per puzzle added, the direct test
        return lift < LIFT_SHARE * rise
    beyond = evaluation.get(BEYOND, math.nan) - first.get(BEYOND, math.nan)
    below_a_rule = evaluation[ACCURACY] < evaluation.get(BEST_TEMPLATE, -math.inf)
    return (
        bool(beyond < BEYOND_SHARE * rise)
        or evaluation.get(TEMPLATES, 0.0) >= TEMPLATE_SHARE_ALARM
        or below_a_rule
    )


def _tie(std: float, mean: float) -> bool:
    """Members whose fitness all tie: a spread of none, or rounding's."""
    return std <= 1e-12 * max(1.0, abs(mean))


def _spread(record: Record) -> float | None:
    """A generation's fitness spread across members (``train/fitness_std``); None for a tie,
    a non-finite one, or a record without it."""
    std, mean = record.get(M.FITNESS_STD, math.nan), record.get(M.FITNESS_MEAN, math.nan)
    if not (math.isfinite(std) and math.isfinite(mean)) or _tie(std, mean):
        return None
    return float(std)


def _change_se(first: Mapping[str, float], now: Mapping[str, float]) -> float:
    """The standard error of ``now``'s held-out accuracy minus ``first``'s, two binomial
    proportions of ``eval/prompts`` puzzles each, one success and one failure added to each
    (Agresti and Caffo 2000, which keeps 0 of n from having none). A start taken as 0
    (:data:`NO_START`, 0 puzzles) adds nothing; a first eval logged before the key is taken to
    be of ``now``'s size; NaN when ``now`` has no size."""
    size = now.get(PROMPTS)
    if size is None:
        return math.nan
    variance = 0.0
    for record in (first, now):
        n = record.get(PROMPTS, size)
        if n == 0:
            continue
        p = (record[ACCURACY] * n + 1) / (n + 2)
        variance += p * (1 - p) / (n + 2)
    return math.sqrt(variance)


def _within_noise(first: Mapping[str, float], now: Mapping[str, float]) -> str:
    """For a flat accuracy that rose: that the rise is within the sampling error of
    ``eval/prompts`` puzzles, and how to see a smaller one (empty otherwise)."""
    rise, se = now.get(ACCURACY, math.nan) - first.get(ACCURACY, math.nan), _change_se(first, now)
    if not 0 < rise < RISE_Z * se:  # NaN: nothing to say
        return ""
    return (
        f" (a rise of {rise:.1%}, {rise / se:.1f} standard errors of {now[PROMPTS]:.0f} "
        "held-out puzzles: more of them, task.eval_samples, would tell a smaller rise from none)"
    )


def _share(record: Mapping[str, float], name: str) -> str:
    """``record[name]`` as a percentage for a message (``n/a`` when the record lacks it)."""
    value = record.get(name)
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.1%}"
