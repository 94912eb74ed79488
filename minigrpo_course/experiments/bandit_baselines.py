"""Lesson 05's contextual bandit with hidden difficulty: the training loop of its five methods and the
exact gradient-variance measurements at a fixed policy.

The notebook defines the task (``MU = σ(1.5·X·W + ease)``) and the ideas; this module holds the plumbing:
sampling, the policy/critic MLPs, the loop that trains REINFORCE, REINFORCE + critic, GRPO with one step,
PPO and GRPO with PPO-style epochs (:func:`train_bandit`), and :class:`GradientLab`, which draws thousands
of batch gradients of a frozen policy from its exact score matrix.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn
from torch.func import functional_call, jacrev, vmap

from minigrpo.advantages import group_advantages
from minigrpo.losses import clipped_surrogate_loss

#: The methods of :func:`train_bandit` and their labels in the lesson.
METHODS = {
    "reinforce": "REINFORCE (no baseline)",
    "critic": "REINFORCE + learned critic",
    "group": "GRPO, 1 step per batch",
    "ppo": "PPO with a critic",
    "grpo": "GRPO (PPO-style epochs)",
}


@dataclass
class Bandit:
    """``X [K, D]``: what the policy and the critic see of each prompt; ``MU [K, A]``: P(answer a is correct)."""

    X: torch.Tensor
    MU: torch.Tensor
    hidden: int = 32

    def make_policy(self, seed: int) -> nn.Module:
        torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(self.X.shape[1], self.hidden), nn.Tanh(), nn.Linear(self.hidden, self.MU.shape[1]))

    def make_critic(self, seed: int) -> nn.Module:
        torch.manual_seed(seed + 10_000)
        return nn.Sequential(nn.Linear(self.X.shape[1], self.hidden), nn.Tanh(), nn.Linear(self.hidden, 1))

    @torch.no_grad()
    def success_rates(self, policy: nn.Module) -> torch.Tensor:
        """``[K]``: p_k = Σ_a π(a|x_k) μ_ka."""
        return (torch.softmax(policy(self.X), -1) * self.MU).sum(-1)

    def expected_reward(self, policy: nn.Module) -> float:
        """J(θ) = mean_k p_k, exact."""
        return float(self.success_rates(policy).mean())

    def best_reward(self) -> float:
        return float(self.MU.max(1).values.mean())

    def sample(self, policy: nn.Module, n_prompts: int, G: int, gen: torch.Generator):
        """``n_prompts`` prompts, ``G`` answers each (contiguous): prompts, answers, rewards, all ``[n_prompts * G]``."""
        prompts = torch.randint(self.X.shape[0], (n_prompts,), generator=gen).repeat_interleave(G)
        with torch.no_grad():
            probs = torch.softmax(policy(self.X[prompts]), -1)
        answers = torch.multinomial(probs, 1, generator=gen).squeeze(1)
        rewards = torch.bernoulli(self.MU[prompts, answers], generator=gen)
        return prompts, answers, rewards

    def log_probs(self, policy: nn.Module, prompts: torch.Tensor, answers: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(policy(self.X[prompts]), -1).gather(1, answers[:, None]).squeeze(1)


def train_bandit(bandit: Bandit, method: str, seed: int, steps: int, n_samples: int = 64, G: int = 8,
                 scale: str = "group", lr: float = 3e-3, epochs: int = 4, minibatches: int = 2, clip: float = 0.2):
    """Train one of :data:`METHODS`; returns (J after each step ``[steps + 1]``, fraction of all-equal groups
    per step, policy, critic).

    Each step samples ``n_samples`` answers (``n_samples // G`` prompts × ``G`` for "group"/"grpo", else one
    per prompt) and takes the advantage: the reward ("reinforce"), reward − V(x) ("critic", "ppo") or
    ``group_advantages`` ("group", "grpo"). "reinforce", "critic", "group": one step of −mean(log π · A).
    "ppo", "grpo": ``epochs × minibatches`` steps of ``clipped_surrogate_loss`` (PPO normalises A per minibatch).
    The critics regress on the observed rewards (MSE, Adam, the same learning rate)."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {tuple(METHODS)}, got {method!r}")
    gen = torch.Generator().manual_seed(seed)
    policy, critic = bandit.make_policy(seed), bandit.make_critic(seed)
    opt = torch.optim.Adam(policy.parameters(), lr=lr)
    critic_opt = torch.optim.Adam(critic.parameters(), lr=lr)
    curve, zero_std = [bandit.expected_reward(policy)], []
    for _ in range(steps):
        if method in ("group", "grpo"):
            prompts, answers, rewards = bandit.sample(policy, n_samples // G, G, gen)
            adv = group_advantages(rewards, G, scale=scale)
            zero_std.append(float((rewards.view(-1, G).std(1) == 0).float().mean()))
        else:
            prompts, answers, rewards = bandit.sample(policy, n_samples, 1, gen)
            with torch.no_grad():
                adv = rewards if method == "reinforce" else rewards - critic(bandit.X[prompts]).squeeze(1)

        def critic_step(idx):
            loss_v = (critic(bandit.X[prompts[idx]]).squeeze(1) - rewards[idx]).pow(2).mean()
            critic_opt.zero_grad(); loss_v.backward(); critic_opt.step()

        if method in ("reinforce", "critic", "group"):             # one step: −mean(log π · A)
            loss = -(bandit.log_probs(policy, prompts, answers) * adv).mean()
            opt.zero_grad(); loss.backward(); opt.step()
            if method == "critic":
                critic_step(slice(None))
        else:                                                      # PPO / GRPO: epochs of clipped minibatch steps
            with torch.no_grad():
                old = bandit.log_probs(policy, prompts, answers)
            for _ in range(epochs):
                for mb in torch.randperm(len(rewards), generator=gen).chunk(minibatches):
                    a = adv[mb]
                    if method == "ppo":
                        a = (a - a.mean()) / (a.std() + 1e-8)
                    loss, _ = clipped_surrogate_loss(bandit.log_probs(policy, prompts[mb], answers[mb]), old[mb], a, clip)
                    opt.zero_grad(); loss.backward(); opt.step()
                    if method == "ppo":
                        critic_step(mb)
        curve.append(bandit.expected_reward(policy))
    return np.array(curve), np.array(zero_std), policy, critic


def score_matrix(policy: nn.Module, X: torch.Tensor) -> torch.Tensor:
    """``[K, A, P]``: ∇_θ log π(a|x_k) for every prompt and answer, from the per-prompt Jacobian of the logits:
    ∇ log π_a = ∇ logit_a − Σ_b π_b ∇ logit_b."""
    params = {n: p.detach() for n, p in policy.named_parameters()}
    jac = vmap(jacrev(lambda prm, x: functional_call(policy, prm, (x,))), in_dims=(None, 0))(params, X)
    K, A = X.shape[0], jac[next(iter(params))].shape[1]
    J_logits = torch.cat([jac[n].reshape(K, A, -1) for n in params], -1)       # [K, A, P]
    with torch.no_grad():
        PI = torch.softmax(policy(X), -1)                                       # [K, A]
    return J_logits - (PI[:, :, None] * J_logits).sum(1, keepdim=True)


def autograd_score(policy: nn.Module, x: torch.Tensor, a: int) -> torch.Tensor:
    """∇_θ log π(a|x) by plain backward, flattened in parameter order: the check of :func:`score_matrix`."""
    policy.zero_grad()
    torch.log_softmax(policy(x), -1)[a].backward()
    return torch.cat([p.grad.reshape(-1) for p in policy.parameters()])


class GradientLab:
    """Exact quantities of a frozen policy on a :class:`Bandit` and Monte-Carlo batch gradients from them.

    ``PI [K, A]``, ``SCORE [K, A, P]``, ``P_K [K]`` (success rates), ``GRAD_P [K, P]`` (∇p_k) and ``GRAD_J [P]``
    (the exact ∇J). A batch gradient is ``g = (1/N) Σ_i A_i S[k_i, a_i]``, so ``n_batches`` batches cost a
    matrix product. ``group_weight(p, G, scale)`` is lesson 05's exact weight w_G(p) of a prompt (§4a)."""

    def __init__(self, bandit: Bandit, policy: nn.Module, n_samples: int, n_batches: int,
                 group_weight: Callable, seed: int = 1):
        self.bandit, self.N, self.B, self.group_weight = bandit, n_samples, n_batches, group_weight
        self.SCORE = score_matrix(policy, bandit.X)
        with torch.no_grad():
            self.PI = torch.softmax(policy(bandit.X), -1)
        self.P_K = (self.PI * bandit.MU).sum(1)
        self.GRAD_P = ((self.PI * bandit.MU)[:, :, None] * self.SCORE).sum(1)
        self.GRAD_J = self.GRAD_P.mean(0)
        self.SCORE_FLAT = self.SCORE.reshape(-1, self.SCORE.shape[-1])
        self.gen = torch.Generator().manual_seed(seed)

    def draw_batches(self, G: int):
        """``n_batches`` independent batches of ``N // G`` prompts × ``G`` answers → prompts, answers, rewards ``[B, N]``."""
        K, A = self.bandit.MU.shape
        prompts = torch.randint(K, (self.B, self.N // G), generator=self.gen).repeat_interleave(G, dim=1)
        answers = torch.multinomial(self.PI[prompts.reshape(-1)], 1, generator=self.gen).reshape(self.B, self.N)
        rewards = torch.bernoulli(self.bandit.MU[prompts, answers], generator=self.gen)
        return prompts, answers, rewards

    def batch_gradients(self, prompts, answers, adv) -> torch.Tensor:
        """``[B, P]``: g_b = (1/N) Σ_i A_i S[k_i, a_i] for each batch (200 batches at a time)."""
        idx = prompts * self.bandit.MU.shape[1] + answers
        return torch.cat([torch.einsum("bn,bnp->bp", adv[c:c + 200], self.SCORE_FLAT[idx[c:c + 200]])
                          for c in range(0, self.B, 200)]) / self.N

    def measure(self, grads: torch.Tensor, expected: torch.Tensor) -> dict[str, float]:
        """Direction and scale of the mean update against ∇J, relative variance, mean cosine of one batch."""
        cos = torch.nn.functional.cosine_similarity
        return {"cos(E g, ∇J)": float(cos(expected, self.GRAD_J, dim=0)),
                "scale": float(expected @ self.GRAD_J / (self.GRAD_J @ self.GRAD_J)),
                "rel. variance": float(((grads - expected) ** 2).sum(1).mean() / (expected @ expected)),
                "cos(g, ∇J)": float(cos(grads, self.GRAD_J[None], dim=1).mean())}

    def expected_group_gradient(self, G: int, scale: str) -> torch.Tensor:
        return (self.group_weight(self.P_K.double(), G, scale).float()[:, None] * self.GRAD_P).mean(0)

    def group_row(self, G: int, scale: str, batches) -> dict[str, float]:
        """:meth:`measure` of the group estimator (``scale`` of ``group_advantages``, or "rloo") on ``batches``."""
        prompts, answers, rewards = batches
        if scale == "rloo":
            adv = G / (G - 1) * group_advantages(rewards.reshape(-1), G, scale="none")
        else:
            adv = group_advantages(rewards.reshape(-1), G, scale=scale)
        return self.measure(self.batch_gradients(prompts, answers, adv.reshape(self.B, self.N)),
                            self.expected_group_gradient(G, scale))


def plot_mean_se(ax, x, runs: np.ndarray, style: str, label: str, alpha: float = 0.2):
    """Mean over seeds (rows of ``runs``) and a ± standard-error band (when there are 2+ seeds)."""
    mean = runs.mean(0)
    line, = ax.plot(x, mean, style, label=label)
    if len(runs) > 1:
        se = runs.std(0, ddof=1) / np.sqrt(len(runs))
        ax.fill_between(x, mean - se, mean + se, color=line.get_color(), alpha=alpha)
    return line


def samples_to(curve: np.ndarray, level: float, n_samples: int) -> str:
    """Samples until the curve first reaches ``level``, right-aligned (``> budget`` if it never does)."""
    hit = np.nonzero(curve >= level)[0]
    steps = len(curve) - 1
    return f"{hit[0] * n_samples:>8d}" if len(hit) else f"{'> ' + str(steps * n_samples):>8s}"
