"""The Θ objective's analytic gradients, checked against finite differences and autograd (float64).

Dimension legend: C clusters, N models.
"""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from detens.heads.theta import ThetaHead, ThetaLossFunction, theta_loss
from detens.matching import Clusters
from detens.targets import Targets

F64 = torch.float64
EPS = 1e-6


# -------------------------------------------------------------------------------- independent reference
def reference_objective(
    theta,
    preds,
    present,
    y,
    matched,
    valid,
    lambda_reg=1.0,
    lambda_cls=1.0,
    lambda_cons=1.0,
    eps=EPS,
    normalize_box=False,
):
    """J of DESIGN.md §2 written from the formulas, one cluster at a time, for autograd to differentiate."""
    total = theta.sum() * 0.0  # keeps the graph when no cluster counts
    count = 0
    for c in range(theta.shape[0]):
        if not bool(valid[c]):
            continue
        count += 1
        t, yhat = theta[c], preds[c]  # [N], [N, 5]
        fused = yhat.T @ t  # A = ŶᵀΘ, [5]
        if normalize_box:
            fused = torch.cat([fused[:4] / t.sum(), fused[4:]])
        w = torch.tensor(
            [1.0, 1.0, 1.0, 1.0, 1.0] if bool(matched[c]) else [0.0, 0.0, 0.0, 0.0, 1.0], dtype=F64
        )
        j_reg = 0.5 * (w * (fused - y[c]) ** 2).sum()
        j_cls = theta.new_zeros(())
        for i in range(t.shape[0]):
            if bool(present[c, i]):
                scaled = t[i] * yhat[i, 4]
                # Zero gradient at the bounds too, written out: torch.clamp before 2.14 passes it there.
                inside = bool(eps < scaled < 1 - eps)
                q = scaled if inside else scaled.detach().clamp(eps, 1 - eps)
                j_cls = j_cls - (y[c, 4] * torch.log(q) + (1 - y[c, 4]) * torch.log(1 - q))
        j_cons = 0.5 * (1 - t.sum()) ** 2
        total = total + lambda_reg * j_reg + lambda_cls * j_cls + lambda_cons * j_cons
    return total / max(count, 1)


def random_problem(seed: int, clamp_cases: bool = True):
    """Random clusters with absent models, unmatched and ignored clusters, θᵢpᵢ at and beyond the clamp."""
    g = torch.Generator().manual_seed(seed)
    num_clusters = int(torch.randint(1, 7, (1,), generator=g))
    num_models = int(torch.randint(1, 5, (1,), generator=g))
    xy = torch.rand(num_clusters, num_models, 2, generator=g, dtype=F64) * 0.6
    wh = torch.rand(num_clusters, num_models, 2, generator=g, dtype=F64) * 0.3 + 0.05
    scores = torch.rand(num_clusters, num_models, 1, generator=g, dtype=F64) * 0.8 + 0.1
    preds = torch.cat([xy, xy + wh, scores], dim=2)
    present = torch.rand(num_clusters, num_models, generator=g) < 0.75
    present[:, 0] |= ~present.any(1)  # at least one model per cluster
    if seed % 2 == 0:  # as matching leaves them; odd seeds keep a score on absent rows to test the mask
        preds[..., 4] = preds[..., 4].masked_fill(~present, 0.0)
    theta = torch.rand(num_clusters, num_models, generator=g, dtype=F64) * 0.9 + 0.1
    matched = torch.rand(num_clusters, generator=g) < 0.6
    ignore = ~matched & (torch.rand(num_clusters, generator=g) < 0.3)
    gt = torch.rand(num_clusters, 2, generator=g, dtype=F64) * 0.6
    boxes = torch.cat([gt, gt + 0.2], 1) * matched[:, None]
    if clamp_cases and num_models >= 2:
        c = int(torch.randint(0, num_clusters, (1,), generator=g))
        present[c, :2] = True
        preds[c, 0, 4], theta[c, 0] = 0.5, 2 * EPS  # θp == ε exactly
        preds[c, 1, 4], theta[c, 1] = 0.5, 2 * (1 - EPS)  # θp == 1 − ε exactly
        if num_models >= 3:
            preds[c, 2, 4], theta[c, 2] = 0.9, 1.5  # θp > 1 − ε: clamp active
        if num_models >= 4:
            present[c, 3] = True
            preds[c, 3, 4] = 0.0  # present with score 0: θp < ε, clamp active
    targets = Targets(boxes, matched, ignore)
    return theta, preds, present, targets


def analytic(theta, preds, present, targets, **kw):
    theta = theta.detach().clone().requires_grad_(True)
    loss = theta_loss(theta, preds, present, targets.y(F64), targets.weights(F64), ~targets.ignore, **kw)
    loss.backward()
    return loss.detach(), theta.grad


def autograd_reference(theta, preds, present, targets, **kw):
    theta = theta.detach().clone().requires_grad_(True)
    loss = reference_objective(theta, preds, present, targets.y(F64), targets.matched, ~targets.ignore, **kw)
    loss.backward()
    return loss.detach(), theta.grad


LAMBDAS = [
    {},
    {"lambda_reg": 2.0, "lambda_cls": 0.5, "lambda_cons": 3.0},
    {"lambda_reg": 0.0, "lambda_cls": 1.0, "lambda_cons": 0.0},
    {"lambda_reg": 1.0, "lambda_cls": 0.0, "lambda_cons": 0.0, "eps": 1e-3},
]


class TestAnalyticVersusAutograd:
    @pytest.mark.parametrize("normalize_box", [False, True])
    @pytest.mark.parametrize("lambdas", LAMBDAS)
    @pytest.mark.parametrize("seed", range(25))
    def test_matches_autograd_of_reference(self, seed, lambdas, normalize_box):
        theta, preds, present, targets = random_problem(seed, clamp_cases="eps" not in lambdas)
        kw = {"normalize_box": normalize_box, **lambdas}
        loss, grad = analytic(theta, preds, present, targets, **kw)
        ref_loss, ref_grad = autograd_reference(theta, preds, present, targets, **kw)
        assert_close(loss, ref_loss)
        assert_close(grad, ref_grad)

    def test_clamp_bounds_give_zero_classification_gradient(self):
        # one cluster, 4 present models: θp = ε, θp = 1 − ε, θp > 1 − ε, θp = 0; only J_cls counts
        preds = torch.tensor([[[0.1, 0.1, 0.3, 0.3, p] for p in (0.5, 0.5, 0.9, 0.0)]], dtype=F64)
        theta = torch.tensor([[2 * EPS, 2 * (1 - EPS), 1.5, 0.4]], dtype=F64)
        present = torch.ones(1, 4, dtype=torch.bool)
        targets = Targets(torch.zeros(1, 4, dtype=F64), torch.tensor([False]), torch.tensor([False]))
        _, grad = analytic(theta, preds, present, targets, lambda_reg=0.0, lambda_cons=0.0)
        assert_close(grad, torch.zeros_like(grad))
        # just inside the bounds the gradient is the BCE one, (θp − y)/(θ(1 − θp))
        theta_in = torch.tensor([[3 * EPS, 1.9, 1.0, 0.4]], dtype=F64)
        _, grad = analytic(theta_in, preds, present, targets, lambda_reg=0.0, lambda_cons=0.0)
        expected = [(t * p) / (t * (1 - t * p)) for t, p in ((3 * EPS, 0.5), (1.9, 0.5), (1.0, 0.9))] + [0.0]
        assert_close(grad, torch.tensor([expected], dtype=F64))

    @pytest.mark.parametrize("normalize_box", [False, True])
    def test_ignored_clusters_contribute_nothing(self, normalize_box):
        theta, preds, present, targets = random_problem(3, clamp_cases=False)
        targets.ignore[:] = False
        targets.ignore[0] = True
        targets.matched[0] = False
        keep = ~targets.ignore
        loss, grad = analytic(theta, preds, present, targets, normalize_box=normalize_box)
        sub = Targets(targets.boxes[keep], targets.matched[keep], targets.ignore[keep])
        sub_loss, sub_grad = analytic(
            theta[keep], preds[keep], present[keep], sub, normalize_box=normalize_box
        )
        assert_close(loss, sub_loss)
        assert_close(grad[keep], sub_grad)
        assert (grad[~keep] == 0).all()

    def test_all_ignored_or_empty_gives_zero(self):
        theta, preds, present, targets = random_problem(5, clamp_cases=False)
        targets = Targets(targets.boxes, torch.zeros_like(targets.matched), torch.ones_like(targets.ignore))
        loss, grad = analytic(theta, preds, present, targets)
        assert float(loss) == 0.0 and (grad == 0).all()
        theta = torch.zeros(0, 3, dtype=F64, requires_grad=True)
        loss = theta_loss(
            theta,
            torch.zeros(0, 3, 5, dtype=F64),
            torch.zeros(0, 3, dtype=torch.bool),
            torch.zeros(0, 5, dtype=F64),
        )
        loss.backward()
        assert loss.item() == 0.0 and theta.grad.shape == (0, 3)

    def test_default_w_follows_the_label(self):
        theta, preds, present, targets = random_problem(7)
        with_w, _ = analytic(theta, preds, present, targets)
        without_w = theta_loss(theta, preds, present, targets.y(F64), valid=~targets.ignore)
        assert_close(with_w, without_w)


class TestGradcheck:
    @pytest.mark.parametrize("normalize_box", [False, True])
    @pytest.mark.parametrize("seed", range(8))
    def test_gradcheck(self, seed, normalize_box):
        theta, preds, present, targets = random_problem(seed, clamp_cases=False)
        theta = theta.requires_grad_(True)
        args = (targets.y(F64), targets.weights(F64), ~targets.ignore, 1.0, 1.0, 1.0, EPS, normalize_box)
        assert torch.autograd.gradcheck(
            lambda t: ThetaLossFunction.apply(t, preds, present, *args), (theta,), eps=1e-6, atol=1e-5
        )

    def test_gradcheck_with_clamp_active_away_from_bounds(self):
        preds = torch.tensor(
            [[[0.1, 0.1, 0.3, 0.3, 0.9], [0.2, 0.1, 0.4, 0.3, 0.0], [0.1, 0.2, 0.3, 0.4, 0.6]]], dtype=F64
        )
        theta = torch.tensor([[1.5, 0.3, 0.5]], dtype=F64, requires_grad=True)  # θp = 1.35 and 0: clamped
        present = torch.ones(1, 3, dtype=torch.bool)
        y = torch.tensor([[0.1, 0.1, 0.3, 0.35, 1.0]], dtype=F64)
        args = (y, torch.ones(1, 5, dtype=F64), torch.ones(1, dtype=torch.bool), 1.0, 1.0, 1.0, 1e-3, False)
        assert torch.autograd.gradcheck(lambda t: ThetaLossFunction.apply(t, preds, present, *args), (theta,))


class TestHeadLossGradients:
    """The head's gathers (global expand, per-class rows) carry the analytic gradient back to Θ."""

    @pytest.mark.parametrize("normalize_box", [False, True])
    @pytest.mark.parametrize("seed", range(6))
    def test_per_class_head_matches_reference(self, seed, normalize_box):
        theta, preds, present, targets = random_problem(seed, clamp_cases=False)
        g = torch.Generator().manual_seed(100 + seed)
        labels = torch.randint(0, 4, (preds.shape[0],), generator=g)  # class 3 has no Θ of its own
        num_models = preds.shape[1]
        head = ThetaHead(
            [f"m{i}" for i in range(num_models)],
            per_class=True,
            class_ids=[0, 1, 2],
            normalize_box=normalize_box,
            shrinkage=0.3,
        ).double()
        with torch.no_grad():
            head.theta.copy_(torch.rand(num_models, generator=g, dtype=F64) + 0.1)
            head.class_theta.copy_(torch.rand(3, num_models, generator=g, dtype=F64) + 0.1)
        clusters = Clusters(preds, present, labels, torch.zeros(preds.shape[:2], dtype=torch.int64), (10, 10))
        loss = head.loss(clusters, targets)
        loss.backward()

        global_theta = head.theta.detach().clone().requires_grad_(True)
        class_theta = head.class_theta.detach().clone().requires_grad_(True)
        rows = [int(k) if int(k) < 3 else None for k in labels]
        per_cluster = torch.stack([class_theta[r] if r is not None else global_theta for r in rows])
        common = (preds, present, targets.y(F64), targets.matched, ~targets.ignore)
        ref = (
            reference_objective(per_cluster, *common, normalize_box=normalize_box)
            + reference_objective(global_theta.expand(len(rows), -1), *common, normalize_box=normalize_box)
            + 0.3 * ((class_theta - global_theta) ** 2).sum()
        )
        ref.backward()
        assert_close(loss.detach(), ref.detach())
        assert_close(head.theta.grad, global_theta.grad)
        assert_close(head.class_theta.grad, class_theta.grad)


class TestDescent:
    @pytest.mark.parametrize("normalize_box", [False, True])
    @pytest.mark.parametrize("seed", range(10))
    def test_one_gradient_step_lowers_J(self, seed, normalize_box):
        theta, preds, present, targets = random_problem(seed, clamp_cases=False)
        kw = {"normalize_box": normalize_box}
        loss, grad = analytic(theta, preds, present, targets, **kw)
        assert grad.abs().sum() > 0
        stepped, _ = analytic(theta - 1e-3 * grad, preds, present, targets, **kw)
        assert stepped < loss


class TestSeedErrata:
    """Seed 000's stated gradients do not match its written objectives (DESIGN.md §2, errata 1-3)."""

    def setup_method(self):
        g = torch.Generator().manual_seed(0)
        self.yhat = torch.rand(3, 5, generator=g, dtype=F64)  # Ŷ, N = 3
        self.theta = (torch.rand(3, generator=g, dtype=F64) * 0.5 + 0.2).requires_grad_(True)
        self.y = torch.rand(5, generator=g, dtype=F64)
        self.y[4] = 1.0

    def grad(self, value):
        (grad,) = torch.autograd.grad(value, self.theta)
        return grad

    def test_erratum_1_regression(self):
        stated = (self.yhat @ (self.yhat.T @ self.theta - self.y)).detach()  # Ŷ(ŶᵀΘ − y), Y read as y
        written = 0.5 * ((self.theta[:, None] * self.yhat - self.y) ** 2).sum()  # ½Σᵢ‖θᵢŷᵢ − y‖²
        assert not torch.allclose(stated, self.grad(written))
        consistent = 0.5 * ((self.yhat.T @ self.theta - self.y) ** 2).sum()  # ½‖ŶᵀΘ − y‖²
        assert_close(stated, self.grad(consistent))

    def test_erratum_2_classification_sign(self):
        q = self.theta * self.yhat[:, 4]
        y = self.y[4]
        stated = ((q - y) / (self.theta * (1 - q))).detach()
        written = (y * torch.log(q) + (1 - y) * torch.log(1 - q)).sum()  # no minus sign
        autograd = self.grad(written)
        assert not torch.allclose(stated, autograd)
        assert_close(stated, -autograd)  # it is the gradient of the negative (binary cross-entropy)

    def test_erratum_3_constraint(self):
        stated = (self.theta - 1).detach()  # Θ − 1
        written = 0.5 * (1 - self.theta.sum()) ** 2
        autograd = self.grad(written)
        assert not torch.allclose(stated, autograd)
        assert_close(-(1 - self.theta.sum()).detach().expand(3), autograd)


def test_only_theta_is_differentiable():
    theta, preds, present, targets = random_problem(1)
    with pytest.raises(ValueError, match="only with respect to theta"):
        theta_loss(theta, preds.requires_grad_(True), present, targets.y(F64))


@pytest.mark.parametrize("kw, match", [({"eps": 0.0}, "eps"), ({"eps": 0.5}, "eps")])
def test_bad_eps(kw, match):
    theta, preds, present, targets = random_problem(1)
    with pytest.raises(ValueError, match=match):
        theta_loss(theta, preds, present, targets.y(F64), **kw)


@pytest.mark.parametrize("row, column, value, match", [
    (0, 1, float("nan"), "y must be finite, got 1 rows"),
    (1, 4, float("inf"), "y must be finite"),
    (0, 4, 2.0, r"score target\) must be in \[0, 1\]"),
    (1, 4, -0.5, r"score target\) must be in \[0, 1\]"),
])
def test_targets_that_would_turn_the_loss_into_nan_are_refused(row, column, value, match):
    theta, preds, present, targets = random_problem(1)
    y = targets.y(F64).clone()
    assert torch.isfinite(theta_loss(theta, preds, present, y))
    y[row, column] = value
    with pytest.raises(ValueError, match=match):
        theta_loss(theta, preds, present, y)


def test_shape_errors_name_the_argument():
    theta, preds, present, targets = random_problem(2)
    with pytest.raises(ValueError, match="preds"):
        theta_loss(theta, preds[:, :, :4], present, targets.y(F64))
    with pytest.raises(ValueError, match="present"):
        theta_loss(theta, preds, present[:, :0], targets.y(F64))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    theta, preds, present, targets = random_problem(4)
    loss, grad = analytic(theta, preds, present, targets)
    theta_c = theta.cuda().requires_grad_(True)
    loss_c = theta_loss(
        theta_c,
        preds.cuda(),
        present.cuda(),
        targets.y(F64).cuda(),
        targets.weights(F64).cuda(),
        ~targets.ignore.cuda(),
    )
    loss_c.backward()
    assert_close(loss_c.cpu(), loss)
    assert_close(theta_c.grad.cpu(), grad)
