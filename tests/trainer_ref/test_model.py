"""trainer_ref.model: shapes, causality, dropless routing, auxiliary losses, routing warmup, NormHead, counts."""

from __future__ import annotations

import ast
import dataclasses
import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from trainer_ref.model import (
    IGNORE_INDEX,
    PRESETS,
    PUBLISHED_COUNTS,
    LingMoE,
    ModelConfig,
    MoEFeedForward,
    count_parameters,
    load_balance_loss,
    main,
    route,
    router_z_loss,
    routing_noise,
    warmup_alpha,
)

REPO = Path(__file__).resolve().parents[2]
TINY = PRESETS["tiny"]


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """These tensors are tiny: intra-op threads only add overhead (and stall badly on a busy machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tokens(cfg: ModelConfig, b: int, t: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, cfg.vocab_size, (b, t), generator=torch.Generator().manual_seed(seed))


def skewed_layer(cfg: ModelConfig, n_tokens: int = 512) -> tuple[MoEFeedForward, torch.Tensor]:
    """An MoE layer whose router sends every token to experts 0 and 1, and inputs that trigger it."""
    layer = MoEFeedForward(cfg, layer_id=0)
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0.0, 0.05, generator=torch.Generator().manual_seed(1))
        layer.router.weight.zero_()
        layer.router.weight[:2] = 1.0  # logits of experts 0, 1 = sum(x) ~ d_model; the rest 0
    x = 1.0 + 0.1 * torch.randn(1, n_tokens, cfg.d_model, generator=torch.Generator().manual_seed(2))
    return layer, x


# ---------------------------------------------------------------------------------------------------------------
# Shapes, causality


@pytest.mark.parametrize(
    "overrides",
    [{}, {"n_kv_heads": 4}, {"first_k_dense": 1}, {"tie_embeddings": True}, {"n_shared_experts": 0, "top_k": 1}],
    ids=["tiny", "mha", "first-dense", "tied", "no-shared-top1"],
)
def test_forward_shapes_and_gradients(overrides: dict) -> None:
    cfg = dataclasses.replace(TINY, **overrides)
    model = LingMoE(cfg)
    idx, targets = tokens(cfg, 2, 16), tokens(cfg, 2, 16, seed=1)
    targets[0, :3] = IGNORE_INDEX
    out = model(idx, targets)
    n_moe = cfg.n_layers - cfg.first_k_dense
    assert out.logits.shape == (2, 16, cfg.vocab_size) and out.logits.dtype == torch.float32
    assert out.aux.layer_ids == list(range(cfg.first_k_dense, cfg.n_layers))
    assert out.aux.balance_loss.shape == out.aux.z_loss.shape == (n_moe,)
    assert out.aux.expert_counts.shape == (n_moe, cfg.n_routed_experts)
    assert out.aux.expert_counts.sum(-1).tolist() == [2 * 16 * cfg.top_k] * n_moe
    assert out.loss is not None and out.ce_loss is not None
    torch.testing.assert_close(out.loss, out.ce_loss + out.aux.balance_loss.sum() + out.aux.z_loss.sum())
    stats = out.aux.load_stats()
    assert set(stats) == {f"load_max_over_mean/{i}" for i in out.aux.layer_ids} | {"balance_loss", "z_loss"}
    out.loss.backward()
    moe = model.layers[-1].ffn
    assert moe.router.weight.grad is not None and moe.router.weight.grad.abs().sum() > 0
    assert moe.w_down.grad is not None
    if cfg.tie_embeddings:
        assert model.lm_head.weight is model.embed.weight
    assert model(idx).loss is None


def test_sequence_longer_than_max_is_rejected() -> None:
    with pytest.raises(ValueError, match="max_seq_len"):
        LingMoE(TINY)(tokens(TINY, 1, TINY.max_seq_len + 1))


def test_causal_future_tokens_do_not_change_earlier_logits() -> None:
    model = LingMoE(TINY).eval()
    idx = tokens(TINY, 2, 24)
    changed = idx.clone()
    changed[:, 12:] = tokens(TINY, 2, 12, seed=7)
    with torch.no_grad():
        a, b = model(idx).logits, model(changed).logits
    torch.testing.assert_close(a[:, :12], b[:, :12], rtol=0, atol=1e-5)
    assert not torch.allclose(a[:, 12:], b[:, 12:])


# ---------------------------------------------------------------------------------------------------------------
# Dropless routing


def test_dropless_every_token_gets_k_experts_even_when_router_is_extremely_skewed() -> None:
    cfg = dataclasses.replace(TINY, n_routed_experts=8, top_k=3)
    layer, x = skewed_layer(cfg, n_tokens=64)
    layer.eval()
    y, stats = layer(x)
    n = x.shape[1]
    logits = torch.nn.functional.linear(x.reshape(n, -1), layer.router.weight)
    _, idx, w = route(logits, cfg.top_k)
    assert all(len(set(row)) == cfg.top_k for row in idx.tolist())  # k distinct experts per token
    assert int(stats.counts.sum()) == n * cfg.top_k
    assert stats.counts[0] == stats.counts[1] == n  # everyone wants 0 and 1: no capacity, nobody dropped
    # Every token's output is exactly its k experts' weighted sum plus the shared expert.
    h = x.reshape(n, -1)
    ref = torch.stack(
        [
            sum(
                w[t, j] * (torch.nn.functional.silu(h[t] @ layer.w_gate[e]) * (h[t] @ layer.w_up[e])) @ layer.w_down[e]
                for j, e in enumerate(idx[t].tolist())
            )
            + layer.shared(h[t])
            for t in range(n)
        ]
    )
    torch.testing.assert_close(y.reshape(n, -1), ref, rtol=1e-4, atol=1e-5)


def test_dropless_with_identical_logits_still_routes_k_distinct_experts() -> None:
    probs, idx, w = route(torch.zeros(100, 16), top_k=4)
    assert all(len(set(row)) == 4 for row in idx.tolist())
    assert int(torch.bincount(idx.flatten(), minlength=16).sum()) == 400
    torch.testing.assert_close(w.sum(-1), torch.ones(100))
    torch.testing.assert_close(probs, torch.full((100, 16), 1 / 16))


# ---------------------------------------------------------------------------------------------------------------
# Auxiliary losses on a hand-made example

HAND_PROBS = [
    [0.5, 0.3, 0.1, 0.1],  # top-2: {0, 1}
    [0.1, 0.6, 0.2, 0.1],  # {1, 2}
    [0.2, 0.1, 0.4, 0.3],  # {2, 3}
    [0.6, 0.3, 0.05, 0.05],  # {0, 1}
]
HAND_SHIFT = [1.0, -2.0, 0.5, 3.0]  # a per-row constant: softmax ignores it, logsumexp equals it


def hand_logits() -> torch.Tensor:
    return torch.tensor([[math.log(p) + c for p in row] for row, c in zip(HAND_PROBS, HAND_SHIFT, strict=True)])


def test_balance_loss_matches_hand_computation() -> None:
    probs, idx, w = route(hand_logits(), top_k=2)
    assert [sorted(r) for r in idx.tolist()] == [[0, 1], [1, 2], [2, 3], [0, 1]]
    torch.testing.assert_close(w[0], torch.tensor([0.5 / 0.8, 0.3 / 0.8]))
    counts = torch.bincount(idx.flatten(), minlength=4)
    assert counts.tolist() == [2, 3, 2, 1]
    # f = counts / (N k) = [.25, .375, .25, .125]; P = column means = [.35, .325, .1875, .1375]
    # E * sum f P = 4 * (.0875 + .121875 + .046875 + .0171875) = 1.09375
    loss = load_balance_loss(probs, counts, top_k=2, coeff=0.01)
    assert loss.item() == pytest.approx(0.01 * 1.09375, rel=1e-6)
    # Uniform probabilities give exactly coeff, whatever the counts.
    uniform = torch.full((4, 4), 0.25)
    assert load_balance_loss(uniform, counts, 2, 0.01).item() == pytest.approx(0.01, rel=1e-6)


def test_z_loss_matches_hand_computation() -> None:
    # logsumexp of row r is HAND_SHIFT[r] (its probabilities sum to 1): mean(c^2) = (1 + 4 + .25 + 9) / 4
    assert router_z_loss(hand_logits(), coeff=0.001).item() == pytest.approx(0.001 * 3.5625, rel=1e-5)


def test_layer_reports_the_losses_of_its_router_logits() -> None:
    cfg = dataclasses.replace(TINY, balance_loss_coeff=0.1, z_loss_coeff=0.01)
    layer, x = skewed_layer(cfg, n_tokens=32)
    _, stats = layer.eval()(x)
    logits = torch.nn.functional.linear(x.reshape(32, -1), layer.router.weight)
    probs, idx, _ = route(logits, cfg.top_k)
    counts = torch.bincount(idx.flatten(), minlength=cfg.n_routed_experts)
    assert stats.counts.tolist() == counts.tolist()
    torch.testing.assert_close(stats.balance_loss, load_balance_loss(probs, counts, cfg.top_k, 0.1))
    torch.testing.assert_close(stats.z_loss, router_z_loss(logits, 0.01))
    # Everything on experts 0 and 1: f = [.5, .5, 0...], P ~ [.5, .5, 0...] -> E * 0.5 = 4 (times coeff).
    assert stats.balance_loss.item() == pytest.approx(0.1 * cfg.n_routed_experts / cfg.top_k, rel=1e-3)


# ---------------------------------------------------------------------------------------------------------------
# Stochastic Routing Warmup


def test_warmup_alpha() -> None:
    assert [warmup_alpha(s, 100) for s in (0, 50, 100, 250)] == [0.0, 0.5, 1.0, 1.0]
    assert warmup_alpha(0, 0) == 1.0 and warmup_alpha(None, 100) == 1.0


def test_routing_warmup_balances_a_skewed_router_at_step_0() -> None:
    cfg = dataclasses.replace(TINY, routing_warmup_steps=1000)
    layer, x = skewed_layer(cfg)
    layer.train()
    _, off = layer(x, step=None)  # no step: warmup off
    _, on = layer(x, step=0)
    _, done = layer(x, step=1000)  # alpha = 1: the learned router alone
    imbalance = {
        k: float(s.counts.max() / s.counts.float().mean()) for k, s in [("off", off), ("on", on), ("done", done)]
    }
    assert imbalance["off"] == pytest.approx(cfg.n_routed_experts / cfg.top_k)  # 4.0: two experts take all
    assert imbalance["done"] == pytest.approx(imbalance["off"])
    assert imbalance["on"] < 1.5, imbalance
    # Eval mode never mixes in noise.
    _, ev = layer.eval()(x, step=0)
    assert ev.counts.tolist() == off.counts.tolist()


def test_routing_warmup_at_model_level_flattens_the_load() -> None:
    torch.manual_seed(0)

    def imbalance(warmup: int) -> float:
        cfg = dataclasses.replace(TINY, routing_warmup_steps=warmup)
        model = LingMoE(cfg).train()
        with torch.no_grad():  # every token carries a common component the routers strongly like
            model.embed.weight[:, 0] = 1.0
            for block in model.layers:
                block.ffn.router.weight[:2, 0] = 50.0
        out = model(tokens(cfg, 4, 64), step=0)
        return float(out.aux.load_max_over_mean().max())

    without, with_ = imbalance(0), imbalance(500)
    assert without > 3.0 and with_ < 1.5, (without, with_)


def test_routing_noise_is_reproducible_and_keyed() -> None:
    key = dict(seed=3, step=17, rank=2, layer=5)
    a = routing_noise((64, 8), **key)
    assert torch.equal(a, routing_noise((64, 8), **key))
    assert a.dtype == torch.float32 and abs(float(a.mean())) < 0.2 and abs(float(a.std()) - 1.0) < 0.2
    for change in ({"rank": 3}, {"step": 18}, {"layer": 6}, {"seed": 4}, {"micro_step": 1}):
        assert not torch.equal(a, routing_noise((64, 8), **{**key, **change})), change
    # Neighbouring keys must not collide (rank 0 step 1 vs rank 1 step 0).
    assert not torch.equal(
        routing_noise((8,), seed=0, step=1, rank=0, layer=0), routing_noise((8,), seed=0, step=0, rank=1, layer=0)
    )


def test_warmup_replay_is_bitwise_identical_and_differs_across_ranks_and_steps() -> None:
    cfg = dataclasses.replace(TINY, routing_warmup_steps=100)
    idx = tokens(cfg, 2, 32)

    def run(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        model = LingMoE(cfg).train()
        out = model(idx, step=step, rank=rank)
        return out.logits.detach(), out.aux.expert_counts

    base = run(step=5, rank=0)
    replay = run(step=5, rank=0)
    assert torch.equal(base[0], replay[0]) and torch.equal(base[1], replay[1])
    for other in (run(step=5, rank=1), run(step=6, rank=0)):
        assert not torch.equal(base[0], other[0])


def test_router_statistics_are_buffers_updated_only_while_training_with_warmup() -> None:
    cfg = dataclasses.replace(TINY, routing_warmup_steps=10)
    model = LingMoE(cfg)
    sd = model.state_dict()
    for i in cfg.moe_layer_ids:
        for name in ("score_mu", "score_sigma", "score_stats_updates"):
            assert f"layers.{i}.ffn.{name}" in sd
    layer = model.layers[0].ffn
    idx = tokens(cfg, 2, 16)
    model.eval()(idx, step=0)
    assert int(layer.score_stats_updates) == 0
    model.train()(idx, step=0)
    assert int(layer.score_stats_updates) == 1
    mu, sigma = float(layer.score_mu), float(layer.score_sigma)
    assert sigma > 0 and (mu, sigma) != (0.0, 1.0)
    model(idx, step=10)  # alpha = 1: warmup over, statistics untouched
    assert int(layer.score_stats_updates) == 1
    # They round-trip through a checkpoint.
    fresh = LingMoE(cfg)
    fresh.load_state_dict(model.state_dict())
    assert float(fresh.layers[0].ffn.score_mu) == mu and int(fresh.layers[0].ffn.score_stats_updates) == 1


# ---------------------------------------------------------------------------------------------------------------
# NormHead


@pytest.mark.parametrize("axis", ["vocab", "hidden"])
def test_norm_head_makes_logits_independent_of_the_raw_head_scale(axis: str) -> None:
    cfg = dataclasses.replace(TINY, norm_head_axis=axis)
    model = LingMoE(cfg).eval()
    idx = tokens(cfg, 1, 8)
    w = model.head_weight()
    norms = w.norm(dim=1 if axis == "vocab" else 0)
    torch.testing.assert_close(norms, torch.ones_like(norms))
    with torch.no_grad():
        before = model(idx).logits
        scale = torch.rand(cfg.vocab_size if axis == "vocab" else cfg.d_model, generator=torch.Generator()) * 5 + 0.1
        model.lm_head.weight.mul_(scale[:, None] if axis == "vocab" else scale[None, :])
        after = model(idx).logits
    torch.testing.assert_close(before, after, rtol=1e-5, atol=1e-5)


def test_without_norm_head_the_raw_scale_matters() -> None:
    model = LingMoE(dataclasses.replace(TINY, norm_head=False)).eval()
    idx = tokens(TINY, 1, 8)
    with torch.no_grad():
        before = model(idx).logits
        model.lm_head.weight.mul_(3.0)
        torch.testing.assert_close(model(idx).logits, 3.0 * before)


# ---------------------------------------------------------------------------------------------------------------
# Initialisation, purity


def test_initialisation_is_deterministic_from_the_seed() -> None:
    a, b = LingMoE(TINY).state_dict(), LingMoE(TINY).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    c = LingMoE(dataclasses.replace(TINY, seed=1)).state_dict()
    assert not torch.equal(a["layers.0.ffn.w_gate"], c["layers.0.ffn.w_gate"])


def test_model_module_does_not_import_torch_distributed() -> None:
    source = (REPO / "trainer_ref" / "model.py").read_text()
    imported = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
    assert not any(m.startswith("torch.distributed") for m in imported), imported
    assert "torch.distributed" not in source.replace("``torch.distributed``", "")


def test_config_validation() -> None:
    with pytest.raises(ValueError):
        ModelConfig(n_heads=4, n_kv_heads=3)
    with pytest.raises(ValueError):
        ModelConfig(top_k=9, n_routed_experts=8)
    with pytest.raises(ValueError):
        ModelConfig(norm_head_axis="diag")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------------------------
# Parameter counts (meta device), CLI


@pytest.mark.parametrize("name", sorted(PUBLISHED_COUNTS))
def test_preset_counts_match_published_figures(name: str) -> None:
    n = count_parameters(PRESETS[name])
    total, activated = PUBLISHED_COUNTS[name]
    assert n.total == pytest.approx(total, rel=0.02)
    assert n.activated == pytest.approx(activated, rel=0.02)


def test_meta_count_agrees_with_a_real_model() -> None:
    for cfg in (TINY, dataclasses.replace(TINY, tie_embeddings=True, first_k_dense=1)):
        model = LingMoE(cfg)
        n = count_parameters(cfg)
        assert n.total == sum(p.numel() for p in model.parameters())
        moe_layers = cfg.n_layers - cfg.first_k_dense
        unused = moe_layers * (cfg.n_routed_experts - cfg.top_k) * 3 * cfg.d_model * cfg.moe_intermediate_size
        assert n.activated == n.total - unused


def test_cli_count_prints_total_and_activated(capsys: pytest.CaptureFixture[str]) -> None:
    expected = {"tiny": None, "ling-lite": ("16.80B", "2.75B"), "ling-plus": ("290.60B", "29.00B")}
    for name, figures in expected.items():
        assert main(["--preset", name, "--count"]) == 0
        text = capsys.readouterr().out
        n = count_parameters(PRESETS[name])
        assert f"total {n.total:,}" in text and f"activated {n.activated:,}" in text
        if figures:
            assert all(f in text for f in figures), text
    assert main(["--preset", "tiny"]) == 0
    assert '"vocab_size": 8192' in capsys.readouterr().out
    with pytest.raises(SystemExit) as err:
        main(["--preset", "nope"])
    assert err.value.code == 3


def test_cli_runs_as_a_module() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "trainer_ref.model", "--preset", "ling-lite", "--count"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "ling-lite: total 16,8" in proc.stdout and "(2.75B)" in proc.stdout
    assert "RuntimeWarning" not in proc.stderr


# ---------------------------------------------------------------------------------------------------------------
# Learning


def test_tiny_model_overfits_a_fixed_batch() -> None:
    cfg = dataclasses.replace(TINY, routing_warmup_steps=30)  # train through the warmup as well
    model = LingMoE(cfg).train()
    idx = tokens(cfg, 4, 33, seed=5)
    x, y = idx[:, :-1], idx[:, 1:]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    first = last = None
    for step in range(100):
        out = model(x, y, step=step)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        opt.step()
        last = out.ce_loss.item()
        first = last if first is None else first
    assert last < 0.5 * first, (first, last)
