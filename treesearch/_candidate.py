"""A candidate tree of a Pareto front: its expected accept length and modelled step latency."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from ._tree import Tree

DEFAULT_STUDY_NAME = "entmtp-tree-shapes"
CandidateSource = Literal["greedy", "optuna", "reference"]
_SOURCE_PRIORITY = {"reference": 0, "greedy": 1, "optuna": 2}


@dataclass(frozen=True)
class TreeCandidate:
    tree: Tree
    expected_accept_length: float  # tokens per step on the positions it was scored on
    latency_ms: float  # modelled draft + verify ms of one step
    source: CandidateSource = "greedy"

    @property
    def tokens_per_ms(self) -> float:
        return self.expected_accept_length / self.latency_ms if self.latency_ms > 0 else np.inf
