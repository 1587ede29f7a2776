"""How each runtime reads an exported tree, modelled from its source (written here, not copied).

Each reader returns the set of rank paths the runtime actually verifies, or raises
``RuntimeRefusal`` where the runtime aborts or writes out of bounds, so tests can check that an
export the runtime accepts means the same tree.
"""

from __future__ import annotations

import ast
import bisect
import json
import math

MEDUSA_TOPK = 10
TRTLLM_PREFIX_CHUNK_SIZE_BITS = 4
TRTLLM_PREFIX_MAX_VALUE = 16

# Field names of vLLM's SpeculativeConfig that the exports use (vllm/config/speculative.py):
# 0.20.2 has speculative_token_tree; 0.32.0 still has method "medusa"; 0.34.0 has neither.
VLLM_0_20_2_FIELDS = {"method", "model", "num_speculative_tokens", "speculative_token_tree"}
VLLM_0_32_0_FIELDS = {"method", "model", "num_speculative_tokens"}


class RuntimeRefusal(Exception):
    """The runtime aborts, or its behaviour is undefined, on this input."""


Paths = set[tuple[int, ...]]


def medusa_reads(choices: list[list[int]], num_heads: int = 5) -> Paths:
    """FasterDecoding/Medusa main @ e2a5d20, medusa/model/utils.py, generate_medusa_buffers.

    Nodes sorted by (length, path); a node of rank ``r`` at depth ``i + 1`` verifies slot
    ``r + TOPK * i + 1`` of ``[root, head 1 top-TOPK, head 2 top-TOPK, ...]``; its ancestors come
    from the attention mask (the prefixes' positions in the sorted list). The tree read back is
    each node's chain of (head, rank) slots; a slot of another head is another tree.
    """
    ordered = sorted((list(c) for c in choices), key=lambda c: (len(c), c))
    candidates = num_heads * MEDUSA_TOPK + 1
    slot = {}
    for depth_index in range(max((len(c) for c in ordered), default=0)):
        for c in ordered:
            if len(c) == depth_index + 1:
                s = c[-1] + MEDUSA_TOPK * depth_index + 1
                if s >= candidates:
                    raise RuntimeRefusal(f"slot {s} is past the {candidates} candidates")
                slot[tuple(c)] = s
    read: Paths = set()
    for c in ordered:
        path = []
        for d in range(1, len(c) + 1):
            s = slot[tuple(ordered[ordered.index(c[:d])])]
            head, rank = (s - 1) // MEDUSA_TOPK + 1, (s - 1) % MEDUSA_TOPK
            if head != d:
                path.append(-1 - head)  # another head's candidate: not a rank of this level
            else:
                path.append(rank)
        read.add(tuple(path))
    return read


def _int32_shift_to_uint64(value: int, shift: int) -> int:
    """``(int32) value << shift`` widened to uint64, as C++ does it (undefined past 31 bits)."""
    if shift >= 32:
        raise RuntimeRefusal(f"shift by {shift} bits of a 32-bit int is undefined behaviour")
    result = (value << shift) & 0xFFFFFFFF
    if result & 0x80000000:
        result -= 1 << 32
    return result & 0xFFFFFFFFFFFFFFFF


def trtllm_prefix(path: list[int], length: int) -> int:
    """computePrefix in cpp/tensorrt_llm/runtime/utils/speculativeChoicesUtils.cpp @ 04a2cacb."""
    prefix = 0
    for ci in range(length):
        if path[ci] > TRTLLM_PREFIX_MAX_VALUE:
            raise RuntimeRefusal(f"Provided choices have too large node degree ({path[ci]})")
        shift = TRTLLM_PREFIX_CHUNK_SIZE_BITS * (length - 1 - ci)
        prefix |= _int32_shift_to_uint64(path[ci], shift)
    return prefix


def trtllm_cpp_reads(choices: list[list[int]], max_draft_len: int, num_heads: int = 8) -> Paths:
    """initTensorsFromChoices (speculativeChoicesUtils.cpp @ 04a2cacb) with the packed mask of
    speculativeDecodingModule.h (3585984b): ``divUp(max_draft_len, 32)`` int32 words per row."""
    n = len(choices)
    if n > max_draft_len:
        raise RuntimeRefusal(f"TLLM_CHECK numChoices {n} <= maxDecodingDraftTokens")
    prefixes = [trtllm_prefix(c, len(c)) for c in choices]
    order = sorted(range(n), key=lambda i: (len(choices[i]), prefixes[i]))
    prev: dict[int, int] = {0: 0}
    cur: dict[int, int] = {}
    prev_shared: set[int] = set()  # keys two nodes of the previous level share
    cur_shared: set[int] = set()
    depth = 1
    parent_of = [-1] * (n + 1)
    node_id = [-1] * (n + 1)
    for ci, index in enumerate(order):
        choice = choices[index]
        if len(choice) != depth:
            if len(choice) != depth + 1:
                raise RuntimeRefusal("TLLM_CHECK depth + 1 == curDepth")
            if len(choice) > num_heads:
                raise RuntimeRefusal("Choices require larger maxPathLen than the engine has")
            prev, cur, depth = cur, {}, depth + 1
            prev_shared, cur_shared = cur_shared, set()
        linear = ci + 1
        if prefixes[index] in cur:
            cur_shared.add(prefixes[index])
        cur[prefixes[index]] = linear
        parent_key = trtllm_prefix(choice, len(choice) - 1)
        if parent_key in prev_shared:  # std::sort is unstable: either node may be the parent
            raise RuntimeRefusal(f"the parent of {choice} shares its key with another node")
        parent_of[linear] = prev.get(parent_key, 0)  # operator[] inserts 0: the root
        node_id[linear] = choice[-1]
    words = math.ceil(max_draft_len / 32)
    for linear in range(n + 1):  # setOnePackedMask(row, col = linear) on the diagonal
        if linear // 32 >= words:
            raise RuntimeRefusal(
                f"mask column {linear} is past the {words} words of a row: heap-buffer-overflow"
            )
    read: Paths = set()
    for linear in range(1, n + 1):
        path, at = [], linear
        while at != 0:
            path.append(node_id[at])
            at = parent_of[at]
        read.add(tuple(reversed(path)))
    if len(read) != n:
        raise RuntimeRefusal("two nodes got the same place in the tree")
    return read


def trtllm_python_tokens(choices: list[list[int]]) -> int:
    """Tokens TensorRT-LLM's Python runtime drafts (tensorrt_llm/runtime/medusa_utils.py @
    249d93d5, get_medusa_topks / get_medusa_tree): ranks 0..max at depth 1, then one token per
    distinct node below."""
    first = [c[0] for c in choices]
    return max(first) + 1 + sum(1 for c in choices if len(c) > 1)


def vllm_config_file_args(yaml_obj: dict) -> dict:
    """vllm/utils/argparse_utils.py load_config_file (0.20.2 and 0.34.0): a nested mapping
    becomes ``--key json.dumps(value)``, which the argument parser reads back with json.loads."""
    return {key: json.loads(json.dumps(value)) if isinstance(value, dict) else value
            for key, value in yaml_obj.items()}


def vllm_0_20_2_reads(config: dict) -> Paths:
    """vLLM 0.20.2: SpeculativeConfig forbids unknown keys (vllm/config/utils.py, extra=forbid)
    and sorts the tree breadth-first (config/speculative.py); llm_base_proposer.py drafts
    ``nodes at level l // nodes at level l-1`` children per node, the top-c of each node of the
    previous level, and verifies them with the tree's own mask (tree_attn.py)."""
    unknown = set(config) - VLLM_0_20_2_FIELDS
    if unknown:
        raise RuntimeRefusal(f"Unexpected keyword argument {sorted(unknown)}")
    tree = sorted(ast.literal_eval(config["speculative_token_tree"]), key=lambda t: (len(t), t))
    if config["num_speculative_tokens"] != len(tree):
        raise RuntimeRefusal("num_speculative_tokens differs from the tree's node count")
    widths = [sum(1 for t in tree if len(t) == d) for d in range(1, len(tree[-1]) + 1)]
    children = [widths[0]] + [widths[i] // widths[i - 1] for i in range(1, len(widths))]
    level: list[tuple[int, ...]] = [()]
    drafted: Paths = set()
    for c in children:
        level = [parent + (r,) for parent in level for r in range(c)]
        drafted.update(level)
    if drafted != set(tree):
        raise RuntimeRefusal("the drafted tree differs from the verified tree")
    return drafted


def vllm_medusa_chain_reads(config: dict, num_heads: int) -> Paths:
    """vLLM 0.32.0 method medusa: MedusaConfig.num_lookahead_tokens = num_speculative_tokens sets
    the heads used (transformers_utils/configs/medusa.py) and MedusaProposer.propose takes each
    head's argmax (v1/spec_decode/medusa.py): the chain [0], [0, 0], ..."""
    unknown = set(config) - VLLM_0_32_0_FIELDS
    if unknown:
        raise RuntimeRefusal(f"Unexpected keyword argument {sorted(unknown)}")
    n = config["num_speculative_tokens"]
    if not isinstance(n, int) or n <= 0:
        raise RuntimeRefusal("num_speculative_tokens must be > 0")
    if n > num_heads:
        raise RuntimeRefusal(f"{n} lookahead tokens but {num_heads} heads' weights")
    return {(0,) * d for d in range(1, n + 1)}


# -- batch-size schedules ------------------------------------------------------------------------
# vLLM 0.24.0 proposers that assert the scheduled K equals the configured count
# (vllm/v1/spec_decode/{medusa,suffix_decoding,ngram_proposer_gpu,extract_hidden_states}.py).
VLLM_0_24_0_FIXED_K_METHODS = {"medusa", "suffix", "ngram_gpu", "extract_hidden_states"}


def vllm_batch_schedule_reads(config: dict, max_num_seqs: int) -> list[int]:
    """The K vLLM drafts at each batch size 1..``max_num_seqs`` (index 0 unused).

    vllm/v1/spec_decode/dynamic/utils.py (the same file in 0.24.0 and 0.34.0):
    validate_and_normalize_dynamic_sd_schedule then build_dynamic_sd_schedule_lookup, as the
    scheduler calls it with ``max_num_seqs`` and ``num_speculative_tokens``.
    """
    unknown = set(config) - {"method", "model", "num_speculative_tokens",
                             "num_speculative_tokens_per_batch_size"}
    if unknown:
        raise RuntimeRefusal(f"Unexpected keyword argument {sorted(unknown)}")
    k_max = config["num_speculative_tokens"]
    if not isinstance(k_max, int) or k_max <= 0:  # Field(gt=0), and the lookup's own check
        raise RuntimeRefusal("num_speculative_tokens must be > 0")
    schedule = config["num_speculative_tokens_per_batch_size"]
    if not isinstance(schedule, list) or not schedule:
        raise RuntimeRefusal("must be a non-empty list")
    parsed = []
    for entry in schedule:
        if not isinstance(entry, list | tuple) or len(entry) != 3:
            raise RuntimeRefusal("each entry must be a 3-item sequence")
        start, end, k = (int(v) for v in entry)
        if start <= 0 or end <= 0 or start > end or k < 0:
            raise RuntimeRefusal(f"bad entry {entry}")
        parsed.append((start, end, k))
    parsed.sort(key=lambda e: e[0])
    previous_end = 0
    for start, end, _ in parsed:
        if start <= previous_end:
            raise RuntimeRefusal("Batch-size ranges must be non-overlapping and sorted.")
        previous_end = end
    if parsed[0][0] != 1:
        raise RuntimeRefusal("The first batch-size range must start at 1")
    dense = [0] * (max_num_seqs + 1)
    next_size, last_k = 1, None
    for start, end, k in parsed:
        if start > next_size and last_k is not None:
            for b in range(next_size, min(start, max_num_seqs + 1)):
                dense[b] = min(k_max, last_k)
        for b in range(max(start, next_size), min(end, max_num_seqs) + 1):
            dense[b] = min(k_max, k)
        next_size, last_k = max(next_size, end + 1), k
        if next_size > max_num_seqs:
            break
    for b in range(next_size, max_num_seqs + 1):
        dense[b] = min(k_max, last_k)
    return dense


def trtllm_draft_len_reads(spec_config: dict, batch_size: int) -> int:
    """The draft length TensorRT-LLM uses at ``batch_size``: llm_args.py DecodingBaseConfig's
    draft_len_schedule validator, then _torch/speculative/utils.py get_draft_len_for_batch_size
    (main after PR #10860: the first key >= batch_size by bisect_left, 0 past the last key)."""
    schedule = spec_config["draft_len_schedule"]
    max_draft_len = spec_config.get("max_draft_len")
    if spec_config.get("max_concurrency") is not None:
        raise RuntimeRefusal("max_concurrency and draft_len_schedule are mutually exclusive")
    for key, length in schedule.items():
        if not isinstance(key, int) or key < 1:
            raise RuntimeRefusal(f"batch size threshold must be >= 1, got {key!r}")
        if length < 0:
            raise RuntimeRefusal(f"draft length must be >= 0, got {length}")
    if max_draft_len is not None:
        if schedule[min(schedule)] != max_draft_len:
            raise RuntimeRefusal("the smallest key's length must equal max_draft_len")
        if any(length > max_draft_len for length in schedule.values()):
            raise RuntimeRefusal("all draft lengths must be <= max_draft_len")
    keys = sorted(schedule)
    index = bisect.bisect_left(keys, batch_size)
    return schedule[keys[index]] if index < len(keys) else 0


def trtllm_stage1_draft_len_reads(schedule: dict, batch_size: int) -> int:
    """The stage-1 reading of PR #8194 (drafter.py get_draft_len_for_batch_size by
    bisect_right): the largest key <= batch_size, key 1 required."""
    if 1 not in schedule:
        raise RuntimeRefusal("draft_len_schedule must include batch_size=1")
    keys = sorted(schedule)
    return schedule[keys[bisect.bisect_right(keys, batch_size) - 1]]
