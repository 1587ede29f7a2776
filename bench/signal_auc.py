"""How well each causal signal predicts that head 1's top-1 draft is accepted.

    .venv/bin/python bench/signal_auc.py [--prompts 8] [--max-new-tokens 128] [--threads 2]

On greedy trajectories of the first ``--prompts`` prompts of each task's ``heldout`` split
(the shipped heads' held-out set, trees/heads/README.md), every position's head-1 top-1 draft is
either the true next-but-one token (accepted by a 1-node tree) or not. For each signal a
schedule can switch on before choosing the tree, this prints the ROC AUC of "low signal ->
accepted" (0.5: no information, 1.0: a perfect separation):

- ``base_entropy``: the base model's entropy at the step (the ``base_entropy`` signal, no
  smoothing);
- ``head1_entropy``: head 1's entropy at the step (the ``draft_entropy`` signal);
- ``head1_surprisal``: ``-log`` of head 1's top-1 probability (not a bundle signal yet).
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from entmtp.calibrate import TASKS, generate_trajectories, load_prompts
from entmtp.calibrate._head_examples import _examples, _prefixes
from entmtp.model import SHIPPED_HEADS, load_base_model, load_heads, shipped_heads_path


def roc_auc(signal: np.ndarray, accepted: np.ndarray) -> float:
    """P(an accepted position's signal < a rejected one's), ties counted half."""
    _, inverse, counts = np.unique(signal, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    ranks = ((ends - counts + 1 + ends) / 2.0)[inverse]  # 1-based, ties get their mean rank
    hit = accepted.astype(bool)
    n_hit, n_miss = int(hit.sum()), int((~hit).sum())
    if n_hit == 0 or n_miss == 0:
        return float("nan")
    # rank-sum of the misses: how often a miss sits above a hit
    return (ranks[~hit].sum() - n_miss * (n_miss + 1) / 2) / (n_hit * n_miss)


def entropy(log_probs: torch.Tensor) -> torch.Tensor:
    return -(log_probs.exp() * log_probs).sum(-1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    base = load_base_model()
    lm_head = base.model.get_output_embeddings()
    heads = {kind: load_heads(shipped_heads_path(kind), base) for kind in SHIPPED_HEADS}
    print(f"{args.prompts} held-out prompts per task x {args.max_new_tokens} new tokens; "
          "AUC of 'low signal -> head 1's top-1 draft accepted'")
    print(f"{'heads':<7} {'task':<5} {'positions':>9} {'top-1':>6} {'base_entropy':>13} "
          f"{'head1_entropy':>14} {'head1_surprisal':>16}")
    for task in TASKS:
        prompts = load_prompts(task, split="heldout", num_prompts=args.prompts)
        trajectories = generate_trajectories(base, prompts, max_new_tokens=args.max_new_tokens,
                                             batch_size=len(prompts))
        examples = _examples(trajectories, 1)
        rows, target = examples.rows, examples.targets[:, 0]
        with torch.inference_mode():
            hidden = examples.hidden[rows]
            base_entropy = entropy(torch.log_softmax(lm_head(hidden).float(), -1)).numpy()
            for kind, draft in heads.items():
                logits = draft.head_logits(1, hidden, _prefixes(examples, rows, 1))
                log_probs = torch.log_softmax(logits.float(), -1)
                top = log_probs.max(-1)
                accepted = (top.indices == target).numpy()
                aucs = [roc_auc(s, accepted) for s in
                        (base_entropy, entropy(log_probs).numpy(), -top.values.numpy())]
                print(f"{kind:<7} {task:<5} {len(accepted):>9} {accepted.mean():>6.3f} "
                      f"{aucs[0]:>13.3f} {aucs[1]:>14.3f} {aucs[2]:>16.3f}")


if __name__ == "__main__":
    main()
