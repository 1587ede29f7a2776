"""The self-test's attention checks: the forward a tree step makes under a tree mask, with
each way of reading grouped key/value heads, eagerly (and the kernel SDPA ran) and captured in
a CUDA graph."""

from __future__ import annotations

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from entmtp.model import GROUPED_KV_WAYS, StaticLlama
from entmtp.treesearch import Tree, reference_tree

from ._selftest_setup import TOPK, CheckFailed, Found, SelftestSetup, SkipCheck, tiny_llama

# SmolLM2-135M's attention shape (9 query heads over 3 key/value heads of 64): the kernel SDPA
# picks depends on the head size, the grouping and the dtype, not on the model's depth.
ATTENTION_CONFIG = dict(vocab_size=256, hidden_size=576, intermediate_size=64,
                        num_hidden_layers=1, num_attention_heads=9, num_key_value_heads=3,
                        max_position_embeddings=1024, tie_word_embeddings=False)
ATTENTION_PAST = 100  # cached positions before the tree


class AttentionProbe:
    """The forward a tree step makes (``StaticLlama.backbone``) for ``tree``'s tokens after
    ``past`` cached positions, under the tree mask as the runtime builds it: over the filled
    slots with an additive mask (``filled``, the CPU's window) or over the whole cache with a
    boolean mask that blocks the unfilled slots (``full``, the graphs' window)."""

    def __init__(self, model: torch.nn.Module, tree: Tree, past: int, window: str) -> None:
        net = self.net = StaticLlama(model)
        device, dtype = net.device, net.dtype
        buffers = tree.buffers(TOPK)
        q = tree.num_nodes + 1
        capacity = past + 2 * q
        generator = torch.Generator().manual_seed(3)
        self.cache = net.new_cache(capacity)  # [layers, 2, kv_heads, capacity, head_dim]
        with torch.no_grad():
            self.cache.copy_(torch.randn(self.cache.shape, generator=generator))
        vocab = model.get_output_embeddings().weight.shape[0]
        self.tokens = (torch.arange(q, device=device) * 7 + 3) % vocab  # [q]
        self.positions = past + torch.as_tensor(buffers.depths, device=device)  # [q]
        self.slots = past + torch.arange(q, device=device)  # [q]
        tree_mask = torch.as_tensor(buffers.attention_mask, device=device)  # [q, q] bool
        if window == "full":
            mask = torch.zeros(q, capacity, dtype=torch.bool, device=device)
            mask[:, :past] = True
            mask[:, past:past + q] = tree_mask
            self.mask, self.kv_len = mask, None  # [q, capacity] bool
        else:
            mask = torch.zeros(q, past + q, dtype=dtype, device=device)
            mask[:, past:].masked_fill_(~tree_mask, torch.finfo(dtype).min)
            self.mask, self.kv_len = mask, past + q  # [q, past + q] additive
        self.window = window
        has_child = np.zeros(q, dtype=bool)
        has_child[buffers.parents[1:]] = True
        self.leaf = int(np.flatnonzero(~has_child)[-1])  # no other node attends to it

    def forward(self, tokens: torch.Tensor | None = None) -> torch.Tensor:
        """Hidden states [q, hidden] of ``tokens`` (default: the probe's) at the tree."""
        tokens = self.tokens if tokens is None else tokens
        return self.net.backbone(self.cache, tokens, self.positions, self.slots, self.mask,
                                 self.kv_len)


class _AttentionKernels(TorchDispatchMode):
    """Records the SDPA kernel of every attention call under it: the backend torch chooses for
    those arguments (``torch._fused_sdp_choice``), or the kernel op when torch shows it."""

    def __init__(self) -> None:
        super().__init__()
        self.kernels: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        name = getattr(func, "overloadpacket", func).__name__
        if name == "scaled_dot_product_attention":
            self.kernels.append(_sdpa_choice(args, kwargs))
        elif "scaled_dot_product" in name and not name.startswith("_fused_sdp"):
            self.kernels.append(name.removeprefix("_scaled_dot_product_"))
        return func(*args, **kwargs)


def _sdpa_choice(args: tuple, kwargs: dict) -> str:
    try:
        from torch.nn.attention import SDPBackend

        return SDPBackend(torch._fused_sdp_choice(*args, **kwargs)).name.lower()
    except Exception:  # noqa: BLE001 - a torch that cannot tell
        return "unknown"


def _kernels(record: _AttentionKernels) -> str:
    seen = list(dict.fromkeys(record.kernels))
    return ", ".join(seen) if seen else "math (no fused kernel)"


def _relative_change(a: torch.Tensor, b: torch.Tensor) -> float:
    scale = float(b.float().abs().max()) or 1.0
    return float((a.float() - b.float()).abs().max()) / scale


def check_attention_eager(setup: SelftestSetup) -> Found:
    """Each way of reading grouped key/value heads under a 63-node tree mask gives the repeated
    heads' result, and the runtime's way attends to no node outside a node's ancestors."""
    probe = attention_probe(setup, "full" if setup.on_cuda else "filled")
    net = probe.net
    tolerance = 1e-4 if setup.dtype == torch.float32 else 3e-2
    outputs, kernels = {}, {}
    try:
        with torch.inference_mode():
            for way in GROUPED_KV_WAYS:
                net.grouped_kv = way
                with _AttentionKernels() as record:
                    outputs[way] = probe.forward().clone()
                kernels[way] = _kernels(record)
            net.grouped_kv = None
            chosen = net.grouped_kv_way(False)
            changed_tokens = probe.tokens.clone()
            vocab = ATTENTION_CONFIG["vocab_size"]
            changed_tokens[probe.leaf] = (changed_tokens[probe.leaf] + 1) % vocab
            changed = probe.forward(changed_tokens)
            probe.forward()  # the cache as the other checks find it
    finally:
        net.grouped_kv = None
    departures = {way: _relative_change(out, outputs["repeat"]) for way, out in outputs.items()}
    details = {"window": probe.window, "way": chosen, "kernels": kernels,
               "departure_from_repeat": departures, "tolerance": tolerance,
               "tree_rows": int(probe.tokens.numel()), "past": ATTENTION_PAST}
    for way, departure in departures.items():
        if departure > tolerance:
            raise CheckFailed(f"the {way} way departs from the repeated heads by {departure:.2g} "
                              f"of the output's scale (tolerance {tolerance:g})", details)
    others = torch.ones(probe.tokens.numel(), dtype=torch.bool, device=changed.device)
    others[probe.leaf] = False
    leak = _relative_change(changed[others], outputs[chosen][others])
    details["change_outside_the_leaf"] = leak
    if leak != 0.0:
        raise CheckFailed(f"the tree mask leaks: changing leaf node {probe.leaf} changed rows "
                          f"that cannot see it by {leak:.2g}", details)
    return Found(f"{chosen} way, kernel {kernels[chosen]} ({probe.window} window, "
                 f"{probe.tokens.numel()} tree rows after {ATTENTION_PAST} cached)", details)


def check_attention_graph(setup: SelftestSetup) -> Found:
    """The same forward captured in a CUDA graph replays the eager result bitwise."""
    if not setup.on_cuda:
        raise SkipCheck(f"CUDA graphs run on CUDA only; on {setup.device} steps run eagerly")
    probe = attention_probe(setup, "full")
    device = probe.net.device
    with torch.inference_mode():
        eager = probe.forward().clone()
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(2):
                probe.forward()
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = probe.forward()
        graph.replay()
        torch.cuda.synchronize(device)
    way = probe.net.grouped_kv_way(False)
    details = {"way": way, "window": "full"}
    if not torch.equal(captured, eager):
        details["departure"] = _relative_change(captured, eager)
        raise CheckFailed(f"the captured forward ({way} way) departs from the eager one by "
                          f"{details['departure']:.2g} of its scale", details)
    return Found(f"{way} way captured and replayed: bitwise the eager result", details)


def attention_probe(setup: SelftestSetup, window: str) -> AttentionProbe:
    """The setup's probe for ``window`` (built once): a 63-node tree after ``ATTENTION_PAST``
    cached positions on a one-layer model of ``ATTENTION_CONFIG``."""
    setup.require_device()

    def build() -> AttentionProbe:
        model = tiny_llama(ATTENTION_CONFIG, setup.device, setup.dtype, seed=5)
        return AttentionProbe(model, reference_tree("mc_sim_7b_63"), ATTENTION_PAST, window)

    return setup.once(("attention", window), build)
