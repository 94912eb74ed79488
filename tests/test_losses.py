import pytest
import torch

from minigrpo.losses import reinforce_loss


def test_value_hand_computed():
    loss = reinforce_loss(torch.tensor([-0.5, -1.0, -2.0]), torch.tensor([1.0, 2.0, -1.0]))
    assert loss.item() == pytest.approx(-(-0.5 - 2.0 + 2.0) / 3)


def test_gradient_is_the_policy_gradient_estimate():
    """d loss / d theta = -(1/N) Σ ∇log π · w, checked through a real categorical policy with autograd."""
    torch.manual_seed(0)
    logits = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    actions = torch.tensor([0, 2, 1, 1, 0])
    w = torch.randn(5, dtype=torch.float64)
    logp = torch.log_softmax(logits, -1)[torch.arange(5), actions]
    (grad,) = torch.autograd.grad(reinforce_loss(logp, w), logits)
    # hand formula: ∇_logits log softmax(a) = onehot(a) - softmax
    probs = torch.softmax(logits.detach(), -1)
    onehot = torch.nn.functional.one_hot(actions, 3).double()
    expected = -((onehot - probs) * w[:, None]) / 5
    torch.testing.assert_close(grad, expected)


def test_weights_are_detached():
    logp = torch.tensor([-1.0, -2.0], requires_grad=True)
    w = torch.tensor([1.0, 3.0], requires_grad=True)
    reinforce_loss(logp, w).backward()
    assert w.grad is None
    torch.testing.assert_close(logp.grad, torch.tensor([-0.5, -1.5]))


def test_shape_mismatch_is_an_error_not_a_broadcast():
    with pytest.raises(ValueError, match=r"same shape, got \(3,\) and \(3, 1\)"):
        reinforce_loss(torch.zeros(3), torch.zeros(3, 1))


def test_nan_weights_and_empty_batches_are_errors():
    with pytest.raises(ValueError, match="NaN"):
        reinforce_loss(torch.zeros(2), torch.tensor([1.0, float("nan")]))
    with pytest.raises(ValueError, match="empty"):
        reinforce_loss(torch.zeros(0), torch.zeros(0))
