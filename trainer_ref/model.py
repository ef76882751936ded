"""Ling MoE model: a decoder-only transformer with fine-grained routed experts and shared experts.

Reference implementation of the Ling architecture ("Every FLOP Counts: Scaling a 300B Mixture-of-Experts
LING LLM without Premium GPUs", Ling Team, arXiv 2503.05139, §3.2 and §3.4.4), in plain PyTorch:

* GQA attention (``torch.nn.functional.scaled_dot_product_attention``, causal) with RoPE, pre-norm RMSNorm;
* MoE feed-forward: ``n_routed_experts`` fine-grained SwiGLU experts, fp32 softmax router, top-k, weights
  renormalised over the k, **dropless** dispatch (tokens sorted by expert, no capacity, nothing dropped), plus
  ``n_shared_experts`` shared experts that every token passes through;
* load-balance loss (Megatron form) and router z-loss, returned beside the logits with per-expert token counts;
* Stochastic Routing Warmup (paper eq. 3) with running router-score statistics kept as checkpointed buffers;
* NormHead (paper eq. 4): the LM-head weight is L2-normalised before use.

This module knows nothing of training (nanoGPT's ``model.py``/``train.py`` split): no optimiser, no data, no
I/O, no ``torch.distributed``. The caller passes the training ``step`` and the data-parallel ``rank`` to
``LingMoE.forward``; both only matter for the routing warmup noise.

Run ``python -m trainer_ref.model --preset ling-lite --count`` to print total and activated parameter
counts of a preset, computed on the meta device (nothing is allocated).

Interpretations (the report's text for eq. 3 and eq. 4 was not at hand; these follow the issue and Ling's
released ``modeling_bailing_moe.py``): the warmup's ``s`` are the router logits and ``mu_s``/``sigma_s`` per-layer
scalar EMAs of their mean/std (see :class:`MoEFeedForward`); NormHead normalises each vocabulary row by default
(Baichuan-2), the released Bailing code's per-hidden-column variant being ``norm_head_axis="hidden"``; the
balance loss's normalisation is Megatron-LM's (see :func:`load_balance_loss`).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import struct
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "IGNORE_INDEX",
    "PRESETS",
    "PUBLISHED_COUNTS",
    "LingMoE",
    "ModelConfig",
    "ModelOutput",
    "MoEAux",
    "MoEFeedForward",
    "ParamCount",
    "count_parameters",
    "load_balance_loss",
    "route",
    "router_z_loss",
    "routing_noise",
    "warmup_alpha",
]

IGNORE_INDEX = -100
"""Target value excluded from the cross-entropy (PyTorch's default ``ignore_index``)."""


@dataclass(frozen=True)
class ModelConfig:
    """Shape and routing hyper-parameters of a :class:`LingMoE`. The defaults are the ``tiny`` preset."""

    vocab_size: int = 8192
    """Vocabulary size (rows of the embedding and of the LM head). Set it to the tokenizer's vocabulary (the
    default is ``trainer_ref.data``'s default BPE size; a dataset's index records the actual one)."""
    d_model: int = 128
    """Hidden size (``hidden_size`` in the Hugging Face configs)."""
    n_layers: int = 2
    """Number of transformer blocks (``num_hidden_layers``)."""
    n_heads: int = 4
    """Query heads per attention layer (``num_attention_heads``)."""
    n_kv_heads: int = 2
    """Key/value heads (GQA, ``num_key_value_heads``); must divide ``n_heads``."""
    head_dim: int | None = None
    """Per-head width; ``None`` means ``d_model // n_heads``."""
    max_seq_len: int = 256
    """Longest sequence (tokens) ``forward`` accepts (``max_position_embeddings``)."""
    rope_theta: float = 10000.0
    """RoPE base (Ling: 600000)."""
    rms_norm_eps: float = 1e-6
    """Epsilon of every RMSNorm."""
    intermediate_size: int = 512
    """Inner width of the dense SwiGLU used by the first ``first_k_dense`` layers."""
    first_k_dense: int = 0
    """The first this-many layers use a dense SwiGLU instead of MoE (``first_k_dense_replace``; Ling: 0)."""
    n_routed_experts: int = 8
    """Routed (fine-grained) experts per MoE layer (``num_experts``)."""
    top_k: int = 2
    """Routed experts each token is sent to (``num_experts_per_tok``)."""
    moe_intermediate_size: int = 128
    """Inner width of each routed expert's SwiGLU; the shared expert is ``n_shared_experts`` times as wide."""
    n_shared_experts: int = 1
    """Shared experts every token passes through (0 disables); fused into one SwiGLU as in Bailing's code."""
    norm_topk_prob: bool = True
    """Renormalise the k selected probabilities to sum to 1 (only when ``top_k > 1``, as in Bailing's code)."""
    tie_embeddings: bool = False
    """Share the input embedding and LM-head matrices (Ling: untied)."""
    norm_head: bool = True
    """NormHead (paper eq. 4): L2-normalise the LM-head weight before computing logits."""
    norm_head_axis: Literal["vocab", "hidden"] = "vocab"
    """NormHead axis of the ``[vocab, d_model]`` head weight. ``"vocab"``: each vocabulary row (output embedding
    vector) has unit norm (Baichuan-2 NormHead). ``"hidden"``: each of the ``d_model`` columns, taken over the
    vocabulary, has unit norm (what Ling's released ``modeling_bailing_moe.py`` does: ``norm(dim=0)``)."""
    balance_loss_coeff: float = 0.01
    """Coefficient of the per-layer load-balance loss ``coeff * E * sum_i f_i * P_i`` (0 disables)."""
    z_loss_coeff: float = 0.001
    """Coefficient of the per-layer router z-loss ``coeff * mean_t logsumexp(s_t)**2`` (0 disables)."""
    routing_warmup_steps: int = 0
    """Stochastic Routing Warmup length W in optimiser steps (paper eq. 3); 0 disables."""
    routing_stats_momentum: float = 0.99
    """EMA momentum of the running router-score mean/std used by the routing warmup."""
    init_std: float = 0.02
    """Standard deviation of the normal initialisation of every weight matrix (Ling: 0.006)."""
    seed: int = 0
    """Seed of the parameter initialisation and of the routing-warmup noise."""

    def __post_init__(self) -> None:
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}")
        if self.head_dim is None and self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not a multiple of n_heads={self.n_heads}")
        if self.resolved_head_dim % 2:
            raise ValueError("RoPE needs an even head_dim")
        if not 1 <= self.top_k <= self.n_routed_experts:
            raise ValueError(f"top_k={self.top_k} must be in [1, n_routed_experts={self.n_routed_experts}]")
        if not 0 <= self.first_k_dense <= self.n_layers:
            raise ValueError(f"first_k_dense={self.first_k_dense} must be in [0, n_layers={self.n_layers}]")
        if self.norm_head_axis not in ("vocab", "hidden"):
            raise ValueError(f"norm_head_axis must be 'vocab' or 'hidden', not {self.norm_head_axis!r}")
        if self.routing_warmup_steps < 0 or not 0.0 <= self.routing_stats_momentum < 1.0:
            raise ValueError("routing_warmup_steps must be >= 0 and routing_stats_momentum in [0, 1)")

    @property
    def resolved_head_dim(self) -> int:
        """Per-head width actually used."""
        return self.head_dim if self.head_dim is not None else self.d_model // self.n_heads

    @property
    def moe_layer_ids(self) -> list[int]:
        """Indices of the blocks whose feed-forward is MoE."""
        return list(range(self.first_k_dense, self.n_layers))


# Ling-Lite: github.com/inclusionAI/Ling, mindie_config/lite/model_base_config.json (BailingMoeForCausalLM
# config of Ling-lite-base, as on huggingface.co/inclusionAI/Ling-lite-base); the same shapes are in the
# Ling-lite-1.5 config.json. Published size: 16.8B total / 2.75B activated (paper abstract, README).
_LING_LITE = ModelConfig(
    vocab_size=126464,
    d_model=2048,
    n_layers=28,
    n_heads=16,
    n_kv_heads=4,
    max_seq_len=16384,
    rope_theta=600000.0,
    rms_norm_eps=1e-5,
    intermediate_size=5632,
    first_k_dense=0,
    n_routed_experts=64,
    top_k=6,
    moe_intermediate_size=1408,
    n_shared_experts=2,
    tie_embeddings=False,
    norm_head=True,
    norm_head_axis="hidden",  # as the released modeling_bailing_moe.py normalises the head
    init_std=0.006,
)

# Ling-Plus: github.com/inclusionAI/Ling, inference/mindie/plus/model_base_config.json (config of
# Ling-plus-base, as on huggingface.co/inclusionAI/Ling-plus-base). Published size: 290B / 28.8B.
_LING_PLUS = ModelConfig(
    vocab_size=126464,
    d_model=5376,
    n_layers=88,
    n_heads=42,
    n_kv_heads=6,
    max_seq_len=16384,
    rope_theta=600000.0,
    rms_norm_eps=1e-6,
    intermediate_size=12288,
    first_k_dense=0,
    n_routed_experts=64,
    top_k=4,
    moe_intermediate_size=3072,
    n_shared_experts=1,
    tie_embeddings=False,
    norm_head=True,
    norm_head_axis="hidden",  # as the released modeling_bailing_moe.py normalises the head
    init_std=0.006,
)

PRESETS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(),
    "ling-lite": _LING_LITE,
    "ling-plus": _LING_PLUS,
}
"""Named configurations. ``tiny``: 2 layers, d=128, 4 heads / 2 KV heads, 8 experts top-2 + 1 shared,
vocab 8192 (trains on a CPU in seconds). ``ling-lite`` / ``ling-plus``: the published shapes (sources above).
Derive variants with ``dataclasses.replace(PRESETS[name], ...)``."""

PUBLISHED_COUNTS: dict[str, tuple[float, float]] = {
    "ling-lite": (16.8e9, 2.75e9),
    "ling-plus": (290e9, 28.8e9),
}
"""(total, activated) parameters as published in arXiv 2503.05139 (abstract) and the Ling README."""


# --------------------------------------------------------------------------------------------------------------
# Building blocks


class RMSNorm(nn.Module):
    """Root-mean-square norm computed in fp32: ``x / sqrt(mean(x**2) + eps) * weight``."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        """Normalise the last dimension of ``x`` (any leading shape); returns ``x``'s dtype."""
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * self.weight.float()).to(x.dtype)


def rope_cos_sin(seq_len: int, head_dim: int, theta: float, device: torch.device) -> tuple[Tensor, Tensor]:
    """RoPE tables for positions ``0..seq_len-1``: two fp32 tensors of shape ``[seq_len, head_dim]``.

    Rotate-half convention (GPT-NeoX / Llama / Bailing): frequency ``theta**(-2i/head_dim)`` for pair ``i``,
    the two halves of the head dimension forming the pairs.
    """
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    freqs = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate ``x`` of shape ``[B, heads, T, head_dim]`` by the tables of :func:`rope_cos_sin` (fp32 math)."""
    xf = x.float()
    half = xf.shape[-1] // 2
    rotated = torch.cat((-xf[..., half:], xf[..., :half]), dim=-1)
    return (xf * cos + rotated * sin).to(x.dtype)


class Attention(nn.Module):
    """Causal grouped-query self-attention with RoPE, no biases (Ling: ``use_qkv_bias=False``, ``use_bias=False``)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.n_kv_heads = cfg.n_kv_heads
        self.head_dim = cfg.resolved_head_dim
        self.wq = nn.Linear(cfg.d_model, cfg.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(cfg.d_model, cfg.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(cfg.d_model, cfg.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * self.head_dim, cfg.d_model, bias=False)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """``x``: ``[B, T, d_model]`` -> ``[B, T, d_model]``; ``cos``/``sin``: ``[T, head_dim]``."""
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.n_kv_heads != self.n_heads:
            # Expand KV heads explicitly rather than SDPA's enable_gqa, which needs torch >= 2.5.
            rep = self.n_heads // self.n_kv_heads
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(b, t, self.n_heads * self.head_dim))


class SwiGLU(nn.Module):
    """``down(silu(gate(x)) * up(x))``: the dense feed-forward and the (fused) shared experts."""

    def __init__(self, d_model: int, hidden: int) -> None:
        super().__init__()
        self.gate = nn.Linear(d_model, hidden, bias=False)
        self.up = nn.Linear(d_model, hidden, bias=False)
        self.down = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        """``[..., d_model]`` -> ``[..., d_model]``."""
        return self.down(F.silu(self.gate(x)) * self.up(x))


# --------------------------------------------------------------------------------------------------------------
# Routing: pure functions, so the tests can check them on hand-made router logits.


def route(scores: Tensor, top_k: int, *, norm_topk_prob: bool = True) -> tuple[Tensor, Tensor, Tensor]:
    """Top-k softmax routing of router scores.

    Args:
        scores: router scores ``[N, E]`` (any float dtype; the softmax is computed in fp32).
        top_k: experts per token.
        norm_topk_prob: renormalise the k selected probabilities to sum to 1 (ignored when ``top_k == 1``,
            where it would cut the router's gradient from the language-model loss).

    Returns:
        ``(probs [N, E] fp32 full softmax, topk_idx [N, k] int64, topk_weight [N, k] fp32)``. The k indices of a
        token are distinct, so every token goes to exactly k experts.
    """
    scores = scores.float()
    probs = torch.softmax(scores, dim=-1)
    # Select on the scores, not the probabilities: the order is the same, but with widely spread scores the
    # softmax underflows to exact zeros, and top-k among tied zeros would favour fixed expert indices.
    topk_idx = torch.topk(scores, top_k, dim=-1).indices
    topk_weight = probs.gather(-1, topk_idx)
    if norm_topk_prob and top_k > 1:
        topk_weight = topk_weight / topk_weight.sum(dim=-1, keepdim=True)
    return probs, topk_idx, topk_weight


def load_balance_loss(probs: Tensor, counts: Tensor, top_k: int, coeff: float) -> Tensor:
    """Load-balance loss in Megatron-LM's form (``switch_load_balancing_loss_func``): ``coeff * E * sum_i f_i P_i``.

    Normalisation: ``f_i = counts_i / (N * top_k)`` is the fraction of the ``N * top_k`` routed token-slots that
    went to expert ``i`` (``sum_i f_i = 1``, not differentiable), and ``P_i = mean_t probs[t, i]`` is the mean
    full-softmax router probability of expert ``i`` over the ``N`` tokens (``sum_i P_i = 1``; carries the
    gradient). Perfect balance gives exactly ``coeff``; all tokens on the same k experts give about
    ``coeff * E / top_k``.

    Args:
        probs: ``[N, E]`` softmax probabilities (fp32).
        counts: ``[E]`` number of token-slots routed to each expert (sums to ``N * top_k``).
        top_k: experts per token.
        coeff: loss coefficient.

    Returns:
        A scalar fp32 tensor.
    """
    n_tokens, n_experts = probs.shape
    f = counts.to(probs.dtype) / (n_tokens * top_k)
    p = probs.mean(dim=0)
    return coeff * n_experts * torch.sum(f * p)


def router_z_loss(logits: Tensor, coeff: float) -> Tensor:
    """Router z-loss (ST-MoE, Zoph et al. 2022): ``coeff * mean_t logsumexp_e(logits[t, e])**2``.

    Args:
        logits: raw router logits ``[N, E]`` (before any warmup mixing); computed in fp32.
        coeff: loss coefficient.

    Returns:
        A scalar fp32 tensor.
    """
    return coeff * torch.logsumexp(logits.float(), dim=-1).pow(2).mean()


def warmup_alpha(step: int | None, warmup_steps: int) -> float:
    """Mixing weight ``alpha = min(step / W, 1)`` of Stochastic Routing Warmup (paper eq. 3).

    Returns 1.0 (learned scores only) when the warmup is disabled (``W == 0``) or ``step`` is ``None``.
    """
    if warmup_steps <= 0 or step is None:
        return 1.0
    return min(step / warmup_steps, 1.0)


def _noise_seed(seed: int, step: int, rank: int, layer: int, micro_step: int) -> int:
    # A cryptographic hash of the key, not Python's hash(): stable across processes and versions, and
    # neighbouring keys (rank 0 step 1 vs rank 1 step 0) give unrelated streams.
    key = struct.pack("<5q", seed, step, rank, layer, micro_step)
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") & ((1 << 63) - 1)


def routing_noise(shape: Sequence[int], *, seed: int, step: int, rank: int, layer: int, micro_step: int = 0) -> Tensor:
    """Standard-normal noise ``epsilon`` of Stochastic Routing Warmup, fp32 on the CPU.

    Drawn from a ``torch.Generator`` seeded by a hash of ``(seed, step, rank, layer, micro_step)``, so a replay
    of the same step on the same rank is bitwise identical, whatever happened before (no generator state to
    checkpoint), while ranks, steps and layers get independent noise. Drawn on the CPU so that the values do not
    depend on the accelerator; the caller moves them.
    """
    gen = torch.Generator(device="cpu")
    gen.manual_seed(_noise_seed(seed, step, rank, layer, micro_step))
    return torch.randn(tuple(shape), generator=gen, dtype=torch.float32)


# --------------------------------------------------------------------------------------------------------------
# MoE feed-forward


@dataclass
class RouterStats:
    """What one MoE layer reports for one forward pass."""

    balance_loss: Tensor
    """Scalar, coefficient applied, differentiable."""
    z_loss: Tensor
    """Scalar, coefficient applied, differentiable."""
    counts: Tensor
    """``[E]`` int64 token-slots routed to each expert (sums to ``tokens * top_k``)."""


class MoEFeedForward(nn.Module):
    """Ling MoE feed-forward: fp32 softmax router, top-k, dropless routed experts, plus shared experts.

    Routed experts are SwiGLUs of width ``moe_intermediate_size``, stored stacked (``w_gate``/``w_up``:
    ``[E, d_model, I]``, ``w_down``: ``[E, I, d_model]``). The ``n_shared_experts`` shared experts are one SwiGLU of
    width ``n_shared_experts * moe_intermediate_size`` (Bailing's layout; the same parameters and function as that
    many separate experts summed).

    Dispatch is dropless: the ``N * k`` (token, expert) slots are stably sorted by expert, each non-empty expert
    runs once on its contiguous group, and the outputs are permuted back and combined with the routing weights.
    There is no capacity factor and no token is ever dropped. The forward combination is a gather plus a sum over
    k (no atomics); on the CPU forward and backward are bitwise reproducible (on a GPU the backward of the token
    gather accumulates, so bitwise replay there needs ``torch.use_deterministic_algorithms(True)``).

    Stochastic Routing Warmup (paper §3.4.4, eq. 3), as implemented here: with router logits ``s`` (``[N, E]``,
    fp32), in training mode and while ``alpha = min(step / W, 1) < 1``, the scores used for routing are
    ``s_hat = alpha * s + (1 - alpha) * (mu + sigma * eps)`` where

    * ``mu``, ``sigma`` are **per-layer scalars**: an EMA (momentum ``routing_stats_momentum``) of the mean and
      standard deviation of all ``N * E`` router logits of each training batch, initialised from the first batch
      and updated (before use) only in training mode while the warmup is active. They are registered buffers
      (``score_mu``, ``score_sigma``, ``score_stats_updates``), hence in ``state_dict()`` and checkpointed. A
      scalar rather than a per-expert statistic is deliberate: a per-expert mean would re-inject the very expert
      preference the warmup is meant to hide, so at ``alpha = 0`` routing would not be uniform;
    * ``eps`` is i.i.d. standard normal per (token, expert), from :func:`routing_noise` keyed by
      ``(config.seed, step, rank, layer, micro_step)``.

    At step 0 routing is therefore uniformly random at the scale of the learned logits, and it shifts linearly to
    the learned router by step W. The routing probabilities, top-k (selected on the scores, see :func:`route`) and
    the balance loss use ``s_hat``; the z-loss uses the raw logits ``s`` (it regularises what the router produces).
    The router's gradient through the routing weights is scaled by ``alpha``. In eval mode, with ``W == 0`` or with
    ``step=None``, ``s_hat = s``.
    """

    score_mu: Tensor
    score_sigma: Tensor
    score_stats_updates: Tensor

    def __init__(self, cfg: ModelConfig, layer_id: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.layer_id = layer_id
        d, e, inner = cfg.d_model, cfg.n_routed_experts, cfg.moe_intermediate_size
        self.router = nn.Linear(d, e, bias=False)
        self.w_gate = nn.Parameter(torch.empty(e, d, inner))
        self.w_up = nn.Parameter(torch.empty(e, d, inner))
        self.w_down = nn.Parameter(torch.empty(e, inner, d))
        self.shared = SwiGLU(d, cfg.n_shared_experts * inner) if cfg.n_shared_experts > 0 else None
        self.register_buffer("score_mu", torch.zeros((), dtype=torch.float32))
        self.register_buffer("score_sigma", torch.ones((), dtype=torch.float32))
        self.register_buffer("score_stats_updates", torch.zeros((), dtype=torch.int64))

    def params_per_routed_expert(self) -> int:
        """Parameters of one routed expert (``3 * d_model * moe_intermediate_size``)."""
        return (self.w_gate.numel() + self.w_up.numel() + self.w_down.numel()) // self.cfg.n_routed_experts

    @torch.no_grad()
    def _update_score_stats(self, logits: Tensor) -> None:
        mean, std = logits.mean(), logits.std(unbiased=False)
        if int(self.score_stats_updates) == 0:
            self.score_mu.copy_(mean)
            self.score_sigma.copy_(std)
        else:
            m = self.cfg.routing_stats_momentum
            self.score_mu.mul_(m).add_(mean, alpha=1.0 - m)
            self.score_sigma.mul_(m).add_(std, alpha=1.0 - m)
        self.score_stats_updates.add_(1)

    def routing_scores(self, logits: Tensor, *, step: int | None, rank: int, micro_step: int = 0) -> Tensor:
        """Scores used for routing: ``logits`` ``[N, E]`` fp32, warmup-mixed per the class docstring."""
        alpha = warmup_alpha(step, self.cfg.routing_warmup_steps) if self.training else 1.0
        if alpha >= 1.0:
            return logits
        assert step is not None  # alpha < 1 implies a step
        self._update_score_stats(logits.detach())
        eps = routing_noise(
            logits.shape, seed=self.cfg.seed, step=step, rank=rank, layer=self.layer_id, micro_step=micro_step
        ).to(logits.device)
        noise = self.score_mu + self.score_sigma * eps
        return alpha * logits + (1.0 - alpha) * noise

    def _experts(self, x_sorted: Tensor, counts: list[int]) -> Tensor:
        """Run each non-empty expert on its contiguous group of ``x_sorted`` ``[N*k, d_model]``."""
        # unbind once: indexing the stacked weights per expert would make autograd build a full-size
        # zero gradient for every expert visited.
        gates, ups, downs = self.w_gate.unbind(0), self.w_up.unbind(0), self.w_down.unbind(0)
        outs = []
        start = 0
        for e, c in enumerate(counts):
            if c == 0:
                continue
            xe = x_sorted[start : start + c]
            outs.append((F.silu(xe @ gates[e]) * (xe @ ups[e])) @ downs[e])
            start += c
        return torch.cat(outs, dim=0)

    def forward(
        self, x: Tensor, *, step: int | None = None, rank: int = 0, micro_step: int = 0
    ) -> tuple[Tensor, RouterStats]:
        """``x``: ``[B, T, d_model]`` -> (``[B, T, d_model]``, :class:`RouterStats`)."""
        b, t, d = x.shape
        h = x.reshape(b * t, d)
        k = self.cfg.top_k
        logits = F.linear(h.float(), self.router.weight.float())  # fp32 router, [N, E]
        scores = self.routing_scores(logits, step=step, rank=rank, micro_step=micro_step)
        probs, topk_idx, topk_weight = route(scores, k, norm_topk_prob=self.cfg.norm_topk_prob)

        flat = topk_idx.reshape(-1)  # slot j = token j // k, its (j % k)-th choice
        counts = torch.bincount(flat, minlength=self.cfg.n_routed_experts)
        order = torch.argsort(flat, stable=True)  # slots grouped by expert
        y_sorted = self._experts(h[order // k], counts.tolist())
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(order.numel(), device=order.device)
        y_slots = y_sorted[inverse].view(b * t, k, d)
        y = (y_slots.float() * topk_weight.unsqueeze(-1)).sum(dim=1).to(x.dtype)
        if self.shared is not None:
            y = y + self.shared(h)

        stats = RouterStats(
            balance_loss=load_balance_loss(probs, counts, k, self.cfg.balance_loss_coeff),
            z_loss=router_z_loss(logits, self.cfg.z_loss_coeff),
            counts=counts.detach(),
        )
        return y.view(b, t, d), stats


class Block(nn.Module):
    """Pre-norm transformer block: ``x + attn(norm(x))``, then ``x + ffn(norm(x))`` with a dense or MoE ffn."""

    def __init__(self, cfg: ModelConfig, layer_id: int) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.rms_norm_eps)
        self.attn = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.d_model, cfg.rms_norm_eps)
        self.ffn: SwiGLU | MoEFeedForward
        if layer_id < cfg.first_k_dense:
            self.ffn = SwiGLU(cfg.d_model, cfg.intermediate_size)
        else:
            self.ffn = MoEFeedForward(cfg, layer_id)

    def forward(
        self, x: Tensor, cos: Tensor, sin: Tensor, *, step: int | None, rank: int, micro_step: int
    ) -> tuple[Tensor, RouterStats | None]:
        """``[B, T, d_model]`` -> (``[B, T, d_model]``, router stats or ``None`` for a dense layer)."""
        x = x + self.attn(self.attn_norm(x), cos, sin)
        if isinstance(self.ffn, MoEFeedForward):
            out, stats = self.ffn(self.ffn_norm(x), step=step, rank=rank, micro_step=micro_step)
            return x + out, stats
        return x + self.ffn(self.ffn_norm(x)), None


# --------------------------------------------------------------------------------------------------------------
# Model


@dataclass
class MoEAux:
    """Auxiliary outputs of the MoE layers, stacked over ``layer_ids`` (the MoE blocks, in order)."""

    layer_ids: list[int]
    """Block index of each row."""
    balance_loss: Tensor
    """``[L_moe]`` per-layer load-balance losses, coefficient applied, differentiable."""
    z_loss: Tensor
    """``[L_moe]`` per-layer router z-losses, coefficient applied, differentiable."""
    expert_counts: Tensor
    """``[L_moe, E]`` int64 token-slots per expert (each row sums to ``B * T * top_k``)."""

    @property
    def total(self) -> Tensor:
        """Scalar sum of all balance and z-losses (what :attr:`ModelOutput.loss` adds to the cross-entropy)."""
        return self.balance_loss.sum() + self.z_loss.sum()

    def load_max_over_mean(self) -> Tensor:
        """``[L_moe]`` fp32 ``max_i counts_i / mean_i counts_i`` per layer: 1.0 is perfect balance, ``E / k`` the worst."""
        counts = self.expert_counts.float()
        return counts.max(dim=-1).values / counts.mean(dim=-1)

    def load_stats(self) -> dict[str, float]:
        """Plain floats for logging: ``load_max_over_mean/<layer>``, ``balance_loss``, ``z_loss``."""
        out = {
            f"load_max_over_mean/{i}": float(v) for i, v in zip(self.layer_ids, self.load_max_over_mean(), strict=True)
        }
        out["balance_loss"] = float(self.balance_loss.detach().sum())
        out["z_loss"] = float(self.z_loss.detach().sum())
        return out


@dataclass
class ModelOutput:
    """What :meth:`LingMoE.forward` returns."""

    logits: Tensor
    """``[B, T, vocab_size]`` fp32."""
    loss: Tensor | None
    """Scalar ``ce_loss + aux.total`` when targets were given, else ``None``."""
    ce_loss: Tensor | None
    """Scalar mean token cross-entropy (nats) over targets not equal to :data:`IGNORE_INDEX`, else ``None``."""
    aux: MoEAux
    """Per-layer balance and z-losses and expert token counts."""


class LingMoE(nn.Module):
    """Ling decoder-only MoE language model (arXiv 2503.05139 §3.2).

    Embedding -> ``n_layers`` pre-norm blocks (GQA attention with RoPE; MoE feed-forward, or dense for the first
    ``first_k_dense``) -> final RMSNorm -> LM head (NormHead when ``config.norm_head``). Weights are initialised
    deterministically from ``config.seed`` (normal ``init_std`` for every matrix, ones for norms); building under
    ``torch.device("meta")`` skips initialisation, which :func:`count_parameters` uses.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.layers = nn.ModuleList(Block(config, i) for i in range(config.n_layers))
        self.norm = RMSNorm(config.d_model, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        if not any(p.is_meta for p in self.parameters()):
            self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Initialise every parameter from ``config.seed`` (same seed, same weights, on any device) and reset
        the routing-warmup statistics."""
        gen = torch.Generator(device="cpu")
        gen.manual_seed(self.config.seed)
        for name, p in self.named_parameters():  # deterministic order; tied weights appear once
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32) * self.config.init_std)
        for m in self.modules():
            if isinstance(m, MoEFeedForward):
                m.score_mu.zero_()
                m.score_sigma.fill_(1.0)
                m.score_stats_updates.zero_()

    def head_weight(self) -> Tensor:
        """LM-head weight ``[vocab_size, d_model]`` as used for the logits: L2-normalised when NormHead is on
        (per vocabulary row for ``norm_head_axis="vocab"``, per hidden column for ``"hidden"``)."""
        w = self.lm_head.weight
        if not self.config.norm_head:
            return w
        dim = 1 if self.config.norm_head_axis == "vocab" else 0
        return F.normalize(w.float(), p=2.0, dim=dim, eps=1e-7).to(w.dtype)

    def forward(
        self,
        idx: Tensor,
        targets: Tensor | None = None,
        *,
        step: int | None = None,
        rank: int = 0,
        micro_step: int = 0,
    ) -> ModelOutput:
        """Logits, optional loss and MoE auxiliaries for a batch of token ids.

        Args:
            idx: ``[B, T]`` int64 token ids, ``T <= max_seq_len``.
            targets: optional ``[B, T]`` int64 next-token ids aligned with ``idx`` (``targets[:, t]`` is the token
                after ``idx[:, t]``); :data:`IGNORE_INDEX` entries are skipped.
            step: training step, for the routing warmup's ``alpha`` and noise; ``None`` disables the warmup.
            rank: data-parallel rank, part of the warmup noise key (the model never asks ``torch.distributed``).
            micro_step: micro-batch index within the step under gradient accumulation, also part of the key.

        Returns:
            :class:`ModelOutput`. Raises ``ValueError`` if ``T > max_seq_len``.
        """
        b, t = idx.shape
        if t > self.config.max_seq_len:
            raise ValueError(f"sequence length {t} > max_seq_len {self.config.max_seq_len}")
        x = self.embed(idx)
        cos, sin = rope_cos_sin(t, self.config.resolved_head_dim, self.config.rope_theta, idx.device)
        stats: list[RouterStats] = []
        for layer in self.layers:
            x, s = layer(x, cos, sin, step=step, rank=rank, micro_step=micro_step)
            if s is not None:
                stats.append(s)
        x = self.norm(x)
        logits = F.linear(x, self.head_weight()).float()

        if stats:
            aux = MoEAux(
                layer_ids=self.config.moe_layer_ids,
                balance_loss=torch.stack([s.balance_loss for s in stats]),
                z_loss=torch.stack([s.z_loss for s in stats]),
                expert_counts=torch.stack([s.counts for s in stats]),
            )
        else:
            zero = logits.new_zeros(0)
            aux = MoEAux(
                [], zero, zero, torch.zeros(0, self.config.n_routed_experts, dtype=torch.int64, device=idx.device)
            )

        ce_loss = loss = None
        if targets is not None:
            ce_loss = F.cross_entropy(logits.view(b * t, -1), targets.reshape(b * t), ignore_index=IGNORE_INDEX)
            loss = ce_loss + aux.total
        return ModelOutput(logits=logits, loss=loss, ce_loss=ce_loss, aux=aux)


# --------------------------------------------------------------------------------------------------------------
# Parameter counting


@dataclass(frozen=True)
class ParamCount:
    """Parameter counts of a configuration."""

    total: int
    """Every parameter, counted once: input embedding, attention, norms, routers, all experts, LM head (a tied
    head is not counted twice)."""
    activated: int
    """Parameters one token uses: ``total`` minus the ``E - top_k`` unused routed experts of every MoE layer.
    Embedding and LM head are included, as in the published Ling figures."""


def count_parameters(config: ModelConfig) -> ParamCount:
    """Total and activated parameters of ``config``, from a model built on the meta device (nothing allocated)."""
    with torch.device("meta"):
        model = LingMoE(config)
    total = sum(p.numel() for p in model.parameters())
    inactive = 0
    for m in model.modules():
        if isinstance(m, MoEFeedForward):
            inactive += (config.n_routed_experts - config.top_k) * m.params_per_routed_expert()
    return ParamCount(total=total, activated=total - inactive)


# --------------------------------------------------------------------------------------------------------------
# CLI: wiring only.


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(3, f"{self.prog}: error: {message}\n")  # 3 = usage error, per the repository's CLI convention


def _human(n: float) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.2f}M"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m trainer_ref.model``; returns the exit code."""
    parser = _Parser(
        prog="python -m trainer_ref.model",
        description="Show a Ling MoE preset's configuration or its parameter counts.",
        epilog="example: python -m trainer_ref.model --preset ling-lite --count",
    )
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny", help="named configuration")
    parser.add_argument("--count", action="store_true", help="print total/activated parameters (meta device)")
    args = parser.parse_args(argv)
    config = PRESETS[args.preset]
    if not args.count:
        print(json.dumps(dataclasses.asdict(config), indent=2))
        return 0
    n = count_parameters(config)
    line = f"{args.preset}: total {n.total:,} ({_human(n.total)}), activated {n.activated:,} ({_human(n.activated)})"
    if args.preset in PUBLISHED_COUNTS:
        pub_total, pub_active = PUBLISHED_COUNTS[args.preset]
        line += (
            f"; published {_human(pub_total)} / {_human(pub_active)} "
            f"({100 * (n.total / pub_total - 1):+.2f}% / {100 * (n.activated / pub_active - 1):+.2f}%)"
        )
    print(line)
    print("counted: all parameters incl. input embedding and LM head; activated = total - unused routed experts")
    return 0


if __name__ == "__main__":
    sys.exit(main())
