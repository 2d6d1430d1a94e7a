"""The knapsack layer: exact top-k forward, perturbed-optimizer backward (Berthet et al. 2020).

Dimension legend: C clusters, N models, M noise samples.

The gradient tests compare the Monte Carlo estimate with exact or independently estimated Jacobians,
with tolerances of several standard errors of the estimators, so that a wrong scale (e.g. the missing
1/ε of the e2e-CEL paper's eq. 7, a factor 1/ε off) or a wrong sign fails by many standard errors.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch.testing import assert_close

from detens.heads.knapsack import KnapsackLayer, TopKKnapsack, top_k_knapsack, top_k_mask

F64 = torch.float64
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def reference_top_k(scores, present, k):
    """Slow reference: for each row, sort the present entries by score and keep the first k."""
    out = torch.zeros(scores.shape, dtype=torch.bool)
    for c in range(scores.shape[0]):
        candidates = [n for n in range(scores.shape[1]) if present[c, n]]
        candidates.sort(key=lambda n: -float(scores[c, n]))
        for n in candidates[:k]:
            out[c, n] = True
    return out


def jacobian_rows(scores, present, k, num_samples, epsilon, seed, baseline=False):
    """The estimated Jacobian J[j, l] = ∂b_j/∂ĉ_l of ONE problem, from one batched call.

    The problem is replicated N times; copy j back-propagates v = e_j, so its gradient is row j of J.
    """
    num_models = scores.shape[0]
    batch = scores[None, :].repeat(num_models, 1).clone().requires_grad_(True)  # [N, N]
    mask = present[None, :].expand(num_models, -1)
    generator = torch.Generator().manual_seed(seed)
    chosen = top_k_knapsack(batch, mask, k, num_samples, epsilon, generator, baseline)
    (chosen * torch.eye(num_models, dtype=scores.dtype)).sum().backward()
    return chosen[0].detach(), batch.grad


class TestForward:
    @pytest.mark.parametrize("seed", range(5))
    def test_matches_reference(self, seed):
        g = torch.Generator().manual_seed(seed)
        num_models = 2 + seed
        scores = torch.randn(40, num_models, generator=g)
        present = torch.rand(40, num_models, generator=g) < 0.6
        for k in range(1, num_models + 2):
            got = top_k_mask(scores, present, k)
            assert torch.equal(got, reference_top_k(scores, present, k)), k
            layer_out = top_k_knapsack(scores, present, k)
            assert torch.equal(layer_out.bool(), got)
            assert layer_out.dtype == scores.dtype

    def test_absent_never_selected_and_count(self):
        g = torch.Generator().manual_seed(1)
        scores = torch.randn(200, 5, generator=g)
        present = torch.rand(200, 5, generator=g) < 0.5
        scores[~present] += 100.0  # absent models with the highest scores must still lose
        for k in range(1, 7):
            chosen = top_k_mask(scores, present, k)
            assert not (chosen & ~present).any()
            assert torch.equal(chosen.sum(1), present.sum(1).clamp(max=k))

    def test_all_present_selected_when_k_large(self):
        scores = torch.tensor([[0.1, -3.0, 2.0], [5.0, 4.0, 3.0]])
        present = torch.tensor([[True, False, True], [True, True, True]])
        assert torch.equal(top_k_mask(scores, present, 3), present)
        assert torch.equal(top_k_mask(scores, present, 2), torch.tensor([[True, False, True], [True, True, False]]))

    def test_empty(self):
        scores = torch.zeros(0, 3, requires_grad=True)
        chosen = top_k_knapsack(scores, torch.zeros(0, 3, dtype=torch.bool), 2, 10, 0.1)
        assert chosen.shape == (0, 3)
        chosen.sum().backward()
        assert scores.grad.shape == (0, 3)

    @pytest.mark.parametrize(
        "kwargs, error, message",
        [
            (dict(k=0), ValueError, "k must be an integer >= 1, got 0"),
            (dict(k=1.5), TypeError, "k must be an integer, got float"),
            (dict(num_samples=0), ValueError, "num_samples"),
            (dict(epsilon=0.0), ValueError, "epsilon must be a positive number"),
            (dict(epsilon=True), TypeError, "epsilon must be a number, got bool"),
        ],
    )
    def test_bad_options(self, kwargs, error, message):
        with pytest.raises(error, match=message):
            top_k_knapsack(torch.zeros(2, 3), None, **{"k": 1, **kwargs})

    def test_bad_shapes(self):
        with pytest.raises(ValueError, match="present must have the shape"):
            top_k_knapsack(torch.zeros(2, 3), torch.ones(2, 2, dtype=torch.bool))
        with pytest.raises(ValueError, match="Tensor\\[C, N\\]"):
            top_k_knapsack(torch.zeros(3))


class TestGradient:
    @pytest.mark.parametrize("epsilon", [0.25, 2.0])
    @pytest.mark.parametrize("baseline", [False, True])
    def test_two_models_closed_form(self, epsilon, baseline):
        """n = 2, k = 1: b₁ = 1[ĉ₁ − ĉ₂ + ε(z₁ − z₂) > 0], so 𝕂₁ = Φ(Δ/(√2ε)) and
        ∂𝕂₁/∂ĉ₁ = −∂𝕂₁/∂ĉ₂ = φ(Δ/(√2ε))/(√2ε) (and the opposite signs for b₂)."""
        deltas = torch.tensor([-1.5, -0.4, 0.0, 0.2, 0.7, 2.0], dtype=F64) * epsilon
        num = deltas.numel()
        scores = torch.stack([deltas, torch.zeros_like(deltas)], 1).repeat(2, 1).requires_grad_(True)  # [2D, 2]
        num_samples = 100_000
        generator = torch.Generator().manual_seed(7)
        chosen = top_k_knapsack(scores, None, 1, num_samples, epsilon, generator, baseline)
        v = torch.zeros_like(chosen)
        v[:num, 0] = 1  # first copy: row of b₁
        v[num:, 1] = 1  # second copy: row of b₂
        (chosen * v).sum().backward()

        x = deltas / (math.sqrt(2) * epsilon)
        exact = torch.exp(-x * x / 2) / math.sqrt(2 * math.pi) / (math.sqrt(2) * epsilon)  # [D]
        expected = torch.cat([torch.stack([exact, -exact], 1), torch.stack([-exact, exact], 1)])
        # Each estimate is the mean of M terms b·z/ε with |b| <= 1 and E z² = 1: standard error <= 1/(ε√M).
        standard_error = 1.0 / (epsilon * math.sqrt(num_samples))
        assert (scores.grad - expected).abs().max() < 5 * standard_error
        # The check is sharp: without the 1/ε the estimate is off by |1 − ε|·exact, many standard errors.
        assert (scores.grad * epsilon - expected).abs().max() > 20 * standard_error

    @pytest.mark.parametrize("num_models, k, epsilon", [(4, 2, 0.5), (5, 3, 1.0)])
    def test_matches_finite_differences_of_smoothed_map(self, num_models, k, epsilon):
        """For larger n, compare with central differences of 𝕂(ĉ) = E[K(ĉ + εZ)] estimated with common
        random numbers (the same Z at ĉ ± h e_l), each with its own standard error."""
        g = torch.Generator().manual_seed(3)
        scores = torch.randn(num_models, generator=g, dtype=F64) * 0.4 * epsilon
        present = torch.ones(num_models, dtype=torch.bool)
        num_est = 100_000
        _, estimate = jacobian_rows(scores, present, k, num_est, epsilon, seed=11)

        num_fd, h = 400_000, 0.04 * epsilon
        z = torch.randn(num_fd, num_models, generator=g, dtype=F64)
        finite, fd_error = torch.zeros(num_models, num_models, dtype=F64), torch.zeros(num_models, num_models, dtype=F64)
        for col in range(num_models):
            step = torch.zeros(num_models, dtype=F64)
            step[col] = h
            plus = top_k_mask(scores + step + epsilon * z, present, k).to(F64)
            minus = top_k_mask(scores - step + epsilon * z, present, k).to(F64)
            terms = (plus - minus) / (2 * h)  # [M, N]: per-sample difference quotients of every b_j
            finite[:, col] = terms.mean(0)
            fd_error[:, col] = terms.std(0) / math.sqrt(num_fd)
        est_error = 1.0 / (epsilon * math.sqrt(num_est))
        tolerance = 5 * torch.sqrt(fd_error**2 + est_error**2) + 2e-3  # + the O(h²) bias of the difference
        assert ((estimate - finite).abs() <= tolerance).all(), (estimate, finite, tolerance)
        assert finite.abs().max() > 10 * tolerance.max()  # the Jacobian is far from zero: the test has teeth
        # Σ_j b_j = k, so Σ_j ∂b_j/∂ĉ_l = 0: the estimate's columns sum to zero up to Monte Carlo error.
        assert estimate.sum(0).abs().max() < 5 * est_error * num_models

    def test_absent_columns_get_zero_gradient(self):
        g = torch.Generator().manual_seed(0)
        scores = torch.randn(30, 4, generator=g, requires_grad=True)
        present = torch.rand(30, 4, generator=g) < 0.6
        present[:, 0] = True
        chosen = top_k_knapsack(scores, present, 2, 50, 0.3, torch.Generator().manual_seed(1))
        (chosen * torch.randn(30, 4, generator=g)).sum().backward()
        assert torch.all(scores.grad[~present] == 0)
        assert scores.grad[present].abs().sum() > 0

    def test_baseline_zero_where_selection_is_fixed(self):
        scores = torch.randn(6, 3, requires_grad=True)
        present = torch.tensor([[True, True, False]] * 3 + [[True, False, False]] * 3)
        chosen = top_k_knapsack(scores, present, 2, 64, 0.5, torch.Generator().manual_seed(0), baseline=True)
        (chosen * torch.randn(6, 3)).sum().backward()
        assert torch.all(scores.grad == 0)

    def test_seeded_reproducible(self):
        def grad(seed):
            scores = torch.tensor([[0.3, 0.1, -0.2]], requires_grad=True)
            out = top_k_knapsack(scores, None, 1, 20, 0.5, torch.Generator().manual_seed(seed))
            (out * torch.tensor([[1.0, 2.0, 3.0]])).sum().backward()
            return scores.grad

        assert torch.equal(grad(4), grad(4))
        assert not torch.equal(grad(4), grad(5))

    def test_no_noise_without_grad(self):
        generator = torch.Generator().manual_seed(0)
        state = generator.get_state()
        top_k_knapsack(torch.randn(5, 3), None, 1, 100, 0.5, generator)
        assert torch.equal(generator.get_state(), state)

    @pytest.mark.parametrize("device", DEVICES)
    @pytest.mark.parametrize("dtype", [torch.float32, F64])
    def test_device_dtype(self, device, dtype):
        scores = torch.randn(7, 3, dtype=dtype, device=device, requires_grad=True)
        present = torch.ones(7, 3, dtype=torch.bool, device=device)
        generator = torch.Generator(device=device).manual_seed(0)
        out = KnapsackLayer(k=2, num_samples=16, epsilon=0.2)(scores, present, generator)
        assert out.device == scores.device and out.dtype == dtype
        out.sum().backward()
        assert scores.grad.device == scores.device and scores.grad.dtype == dtype

    def test_gradients_reach_a_network_and_it_learns_to_select(self):
        """A linear selection net learns, through the layer alone, to pick the best of 3 models:
        the reward of model n is x_n (a feature it sees), so the best choice is argmax x."""
        torch.manual_seed(0)
        net = torch.nn.Linear(3, 3)
        optimizer = torch.optim.Adam(net.parameters(), lr=0.05)
        generator = torch.Generator().manual_seed(0)
        data = torch.Generator().manual_seed(1)

        def accuracy():
            x = torch.randn(2000, 3, generator=data)
            chosen = top_k_mask(net(x), torch.ones(2000, 3, dtype=torch.bool), 1)
            return float((chosen.float().argmax(1) == x.argmax(1)).float().mean())

        before = accuracy()
        for step in range(150):
            x = torch.randn(256, 3, generator=data)
            scores = net(x)
            scores = scores / scores.norm(dim=1, keepdim=True)  # e2e-CEL's ĉ / ‖ĉ‖₂
            chosen = top_k_knapsack(scores, None, 1, 32, 0.5, generator)
            loss = -(chosen * x).sum(1).mean()
            optimizer.zero_grad()
            loss.backward()
            if step == 0:
                for name, p in net.named_parameters():
                    assert p.grad is not None and p.grad.abs().sum() > 0, name
                    assert torch.isfinite(p.grad).all(), name
            optimizer.step()
        assert accuracy() > 0.9 > before + 0.3


def test_function_apply_matches_wrapper():
    scores = torch.randn(5, 4)
    present = torch.ones(5, 4, dtype=torch.bool)
    for k in (1, 2, 4):
        direct = TopKKnapsack.apply(scores, present, k, 8, 0.1, None, False)
        assert_close(direct, top_k_knapsack(scores, present, k))
    # generator and baseline are optional; the backward returns one gradient per given input
    leaf = scores.clone().requires_grad_(True)
    TopKKnapsack.apply(leaf, present, 2, 8, 0.1).sum().backward()
    assert leaf.grad.shape == scores.shape


def test_selection_counts_exhaustive():
    """Every present pattern of 4 models and every k: exactly min(k, |present|) present ones chosen."""
    scores = torch.tensor([[0.4, -0.1, 0.9, 0.2]])
    for bits in itertools.product([False, True], repeat=4):
        present = torch.tensor([bits])
        for k in range(1, 6):
            chosen = top_k_mask(scores, present, k)
            assert int(chosen.sum()) == min(k, sum(bits))
            assert torch.equal(chosen, reference_top_k(scores, present, k))
