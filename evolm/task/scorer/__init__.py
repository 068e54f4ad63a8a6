"""``task=scorer``: a reward model's score minus lambda times a cost model's, from an HTTP
scorer service: the task (:mod:`.task`), its client (:mod:`.client`) and the reference service
(``python -m evolm.task.scorer.server``, :mod:`.server`)."""

from evolm.task.scorer.client import ScorerClient, ScorerError, ScorerUnavailable
from evolm.task.scorer.task import Scorer, split_prompts

__all__ = ["Scorer", "ScorerClient", "ScorerError", "ScorerUnavailable", "split_prompts"]
