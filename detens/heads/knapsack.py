"""The knapsack layer of e2e-CEL (seed 003): an exact top-k selection with a perturbed-optimizer gradient.

Dimension legend: C clusters (independent problems, batched), N models, M noise samples.

For one cluster with scores ĉ ∈ R^N and the set P of models present in it, the unweighted knapsack

    K(ĉ) = argmax_b ĉᵀb   s.t.  1ᵀb = min(k, |P|),  b ∈ {0, 1}^N,  b_i = 0 for i ∉ P

selects the k highest-scoring present models (all present ones when k ≥ |P|; an absent model never).
K is piecewise constant, so its derivative is zero almost everywhere. Following Berthet et al. (2020,
"Learning with differentiable perturbed optimizers"), the layer uses K itself in the forward pass and,
in the backward pass, the Jacobian of the smoothed map 𝕂(ĉ) = E_Z[K(ĉ + εZ)], Z ~ N(0, I):

    ∂𝕂/∂ĉ = E_Z[K(ĉ + εZ) Zᵀ] / ε  ≈  (1 / (M ε)) Σᵢ K(ĉ + ε zᵢ) zᵢᵀ

(Gaussian integration by parts: for Z ~ N(0, I) the score function is ∇ν(z) = z, and the 1/ε comes from
differentiating ĉ + εz with respect to ĉ; the e2e-CEL paper's eq. 7 leaves the 1/ε out.)
The noise is drawn on the present entries only (absent entries cannot change K), so the estimated
Jacobian is exactly zero in the columns of absent models, and the M samples of all C clusters are one
batched ``[M, C, N]`` top-k.

``baseline=True`` subtracts the unperturbed solution inside the sum, (1 / (M ε)) Σᵢ (K(ĉ + ε zᵢ) − K(ĉ)) zᵢᵀ:
the same expectation (E[Z] = 0), with much less variance, and exactly zero where the selection cannot
change (k ≥ |P|, or one present model). The default (``False``) is the estimator as written above.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.autograd.function import FunctionCtx, once_differentiable

from detens.heads._io import check_int, check_number

__all__ = ["top_k_mask", "TopKKnapsack", "top_k_knapsack", "KnapsackLayer"]


def top_k_mask(scores: Tensor, present: Tensor, k: int) -> Tensor:
    """The exact solution K(ĉ) of the top-k knapsack, batched over any leading dimensions.

    Args:
        scores (Tensor[..., N]): ĉ, floating point.
        present (Tensor[..., N] bool): which models may be selected (broadcastable to ``scores``).
        k (int): how many to select, ``k >= 1``; where fewer than k are present, all present ones are.

    Returns:
        Tensor[..., N] bool: the selection mask (an absent model is never selected). Ties between equal
        scores are broken by ``torch.topk``.
    """
    num_models = scores.shape[-1]
    if num_models == 0 or scores.numel() == 0:
        return torch.zeros(scores.shape, dtype=torch.bool, device=scores.device)
    present = present.expand_as(scores)
    masked = scores.masked_fill(~present, float("-inf"))
    index = masked.topk(min(k, num_models), dim=-1).indices  # [..., k]
    chosen = torch.zeros(scores.shape, dtype=torch.bool, device=scores.device)
    chosen.scatter_(-1, index, True)
    return chosen & present  # fewer than k present: topk also picked -inf (absent) entries


def _check_options(k: Any, num_samples: Any, epsilon: Any) -> None:
    check_int(k, "k", 1)
    check_int(num_samples, "num_samples", 1)
    check_number(epsilon, "epsilon", strict=True)


def _noise(shape: tuple[int, ...], like: Tensor, generator: torch.Generator | None) -> Tensor:
    """Standard normal noise of ``shape`` on ``like``'s device and dtype, from ``generator`` if given."""
    if generator is None:
        return torch.randn(shape, device=like.device, dtype=like.dtype)
    noise = torch.randn(shape, generator=generator, device=generator.device, dtype=like.dtype)
    return noise.to(like.device)


class TopKKnapsack(torch.autograd.Function):
    """Forward: the exact top-k mask; backward: the perturbed-optimizer Jacobian estimate.

    ``TopKKnapsack.apply(scores, present, k, num_samples, epsilon[, generator[, baseline]])``; prefer
    :func:`top_k_knapsack`, which validates its arguments.

    Args:
        scores (Tensor[C, N]): ĉ (floating point, may require grad).
        present (Tensor[C, N] bool): the models that may be selected in each cluster.
        k (int): models to select per cluster.
        num_samples (int): M, the Gaussian samples of the backward estimate.
        epsilon (float): ε, the noise temperature.
        generator (torch.Generator | None): source of the noise (seeded for reproducibility); the
            noise is drawn on the generator's device and moved to the scores' device.
        baseline (bool): subtract K(ĉ) inside the estimate (see the module docstring).

    Returns:
        Tensor[C, N]: the 0/1 selection in ``scores``' dtype. The noise is drawn (and the M perturbed
        problems solved) in the forward pass, and only when ``scores`` requires grad.
    """

    @staticmethod
    def forward(
        ctx: FunctionCtx,
        scores: Tensor,
        present: Tensor,
        k: int,
        num_samples: int,
        epsilon: float,
        generator: torch.Generator | None = None,
        baseline: bool = False,
    ) -> Tensor:
        chosen = top_k_mask(scores, present, k).to(scores.dtype)  # [C, N]
        ctx.epsilon = float(epsilon)
        if ctx.needs_input_grad[0]:
            present_f = present.to(scores.dtype)
            noise = _noise((num_samples, *scores.shape), scores, generator) * present_f  # [M, C, N]
            perturbed = top_k_mask(scores.detach() + epsilon * noise, present, k).to(scores.dtype)  # [M, C, N]
            if baseline:
                perturbed = perturbed - chosen
            ctx.save_for_backward(noise, perturbed)
        return chosen

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, grad_output: Tensor) -> tuple[Tensor | None, ...]:
        noise, perturbed = ctx.saved_tensors  # [M, C, N] each
        # Jᵀ v with J = (1 / (M ε)) Σᵢ K(ĉ + ε zᵢ) zᵢᵀ:  (1 / (M ε)) Σᵢ ⟨v, K(ĉ + ε zᵢ)⟩ zᵢ
        inner = (perturbed * grad_output.to(perturbed.dtype)).sum(-1, keepdim=True)  # [M, C, 1]
        grad = (inner * noise).mean(0) / ctx.epsilon  # [C, N]
        return (grad.to(grad_output.dtype),) + (None,) * (len(ctx.needs_input_grad) - 1)


def top_k_knapsack(
    scores: Tensor,
    present: Tensor | None = None,
    k: int = 1,
    num_samples: int = 100,
    epsilon: float = 0.1,
    generator: torch.Generator | None = None,
    baseline: bool = False,
) -> Tensor:
    """Select the top-k present models per cluster, differentiably (see the module docstring).

    Args:
        scores (Tensor[C, N]): ĉ. present (Tensor[C, N] bool | None): default all present.
        k, num_samples, epsilon, generator, baseline: see :class:`TopKKnapsack`.

    Returns:
        Tensor[C, N]: the exact 0/1 top-k mask (``scores``' dtype); gradients flow back to ``scores``
        through the perturbed-optimizer estimate. C = 0 gives an empty ``[0, N]`` mask.
    """
    _check_options(k, num_samples, epsilon)
    if scores.ndim != 2 or not scores.is_floating_point():
        raise ValueError(f"scores must be a floating-point Tensor[C, N], got {scores.dtype} {list(scores.shape)}")
    if present is None:
        present = torch.ones(scores.shape, dtype=torch.bool, device=scores.device)
    if present.shape != scores.shape:
        raise ValueError(f"present must have the shape of scores {list(scores.shape)}, got {list(present.shape)}")
    present = present.to(device=scores.device, dtype=torch.bool)
    return TopKKnapsack.apply(scores, present, int(k), int(num_samples), float(epsilon), generator, bool(baseline))


class KnapsackLayer(nn.Module):
    """:func:`top_k_knapsack` as a module with fixed ``k``, ``num_samples``, ``epsilon``.

    ``layer(scores (Tensor[C, N]), present (Tensor[C, N] bool), generator=None) -> Tensor[C, N]``.
    """

    def __init__(self, k: int = 1, num_samples: int = 100, epsilon: float = 0.1, baseline: bool = False) -> None:
        super().__init__()
        _check_options(k, num_samples, epsilon)
        self.k = int(k)
        self.num_samples = int(num_samples)
        self.epsilon = float(epsilon)
        self.baseline = bool(baseline)

    def forward(
        self, scores: Tensor, present: Tensor | None = None, generator: torch.Generator | None = None
    ) -> Tensor:
        return top_k_knapsack(scores, present, self.k, self.num_samples, self.epsilon, generator, self.baseline)

    def extra_repr(self) -> str:
        return f"k={self.k}, num_samples={self.num_samples}, epsilon={self.epsilon}, baseline={self.baseline}"
