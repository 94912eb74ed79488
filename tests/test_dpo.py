"""DPO (``minigrpo.llm.dpo``) and lesson 06's DPO-vs-GRPO plumbing (``minigrpo_course.experiments.dpo_vs_grpo``).

TRL 1.16 computes DPO's loss inside ``DPOTrainer._compute_loss`` (a method that runs the model), with no pure loss
function to compare against; the loss is checked against a hand-computed value and autograd instead."""

import copy
import math

import pytest
import torch

from minigrpo_course.experiments.dpo_vs_grpo import comparison_table, preference_pairs, train_dpo
from minigrpo.llm.dpo import completion_logps, dpo_loss
from minigrpo.llm.models import make_tiny_model
from minigrpo.llm.tasks import AdditionTask
from minigrpo.llm.tokenizer import build_char_tokenizer

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_dpo_loss_hand_computed():
    # pair 1: chosen gains 1 nat over the reference, rejected loses 1: margin 2 nats, β = 0.5 → −log σ(1)
    # pair 2: the policy prefers the rejected one by 2 nats: β · (−2) = −1 → −log σ(−1)
    pc, pr = torch.tensor([-1.0, -3.0]), torch.tensor([-5.0, -2.0])
    rc, rr = torch.tensor([-2.0, -3.0]), torch.tensor([-4.0, -4.0])
    loss, m = dpo_loss(pc, pr, rc, rr, beta=0.5)
    expected = 0.5 * (math.log1p(math.exp(-1.0)) + math.log1p(math.exp(1.0)))
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert m["rewards/chosen"] == pytest.approx(0.5 * (1.0 + 0.0) / 2)  # β·(pc − rc) = 0.5, 0
    assert m["rewards/rejected"] == pytest.approx(0.5 * (-1.0 + 2.0) / 2)  # −0.5, 1
    assert m["rewards/margins"] == pytest.approx(0.0)  # (0.5 + 0.5 − 0 − 1) / 2
    assert m["rewards/accuracies"] == 0.5
    assert m["logps/chosen"] == pytest.approx(-2.0) and m["logps/rejected"] == pytest.approx(-3.5)


def test_dpo_loss_gradient_matches_autograd_of_the_formula():
    g = torch.Generator().manual_seed(0)
    pc, pr, rc, rr = (-(torch.rand(6, generator=g, dtype=torch.float64) * 5) for _ in range(4))
    pc.requires_grad_(True), pr.requires_grad_(True)
    loss, _ = dpo_loss(pc, pr, rc, rr, beta=0.1)
    loss.backward()
    # d/dpc of mean(−log σ(β h)), h = (pc − rc) − (pr − rr): −β σ(−β h) / n, and +β σ(−β h) / n for pr
    h = (pc - rc - (pr - rr)).detach()
    w = 0.1 * torch.sigmoid(-0.1 * h) / 6
    torch.testing.assert_close(pc.grad, -w, rtol=0, atol=1e-12)
    torch.testing.assert_close(pr.grad, w, rtol=0, atol=1e-12)
    # at the reference (all log-ratios 0) the loss is log 2 whatever β
    z = torch.full((3,), -2.0)
    assert dpo_loss(z, z, z, z, beta=3.0)[0].item() == pytest.approx(math.log(2))


@pytest.mark.parametrize("bad, match", [
    (dict(policy_chosen_logps=[-1.0]), "policy_chosen_logps must be a torch tensor"),
    (dict(ref_rejected_logps=torch.tensor([-1, -2])), "ref_rejected_logps must be a floating tensor"),
    (dict(policy_rejected_logps=torch.tensor([-1.0])), "policy_rejected_logps has shape"),
    (dict(ref_chosen_logps=torch.tensor([[-1.0, -2.0]])), "ref_chosen_logps must be 1-D"),
    (dict(ref_chosen_logps=torch.tensor([-1.0, float("nan")])), "ref_chosen_logps contains NaN"),
    (dict(policy_chosen_logps=torch.tensor([0.5, -1.0])), "positive entry"),
    (dict(beta=0.0), "beta must be a finite number > 0"),
    (dict(beta=float("inf")), "beta must be"),
])
def test_dpo_loss_refuses_bad_input(bad, match):
    args = dict(policy_chosen_logps=torch.tensor([-1.0, -2.0]), policy_rejected_logps=torch.tensor([-1.0, -2.0]),
                ref_chosen_logps=torch.tensor([-1.0, -2.0]), ref_rejected_logps=torch.tensor([-1.0, -2.0]), beta=0.1)
    args.update(bad)
    with pytest.raises((ValueError, TypeError), match=match):
        dpo_loss(**args)


def test_completion_logps_stops_at_the_first_eos():
    tok = build_char_tokenizer()
    model = make_tiny_model(tok, "llama", seed=0, hidden_size=32).eval()
    enc = tok(["1+2=", "9+9="], add_special_tokens=False, return_tensors="pt")
    eos = tok.eos_token_id
    comp = torch.tensor([[7, eos, 5, 5], [8, 9, eos, 0]])
    with torch.no_grad():
        full = torch.log_softmax(model(input_ids=torch.cat([enc.input_ids, comp], 1)).logits, -1)
    P = enc.input_ids.shape[1]
    per_token = full[:, P - 1:-1].gather(-1, comp[..., None]).squeeze(-1)
    expected = torch.stack([per_token[0, :2].sum(), per_token[1, :3].sum()])
    with torch.no_grad():
        got = completion_logps(model, enc.input_ids, enc.attention_mask, comp, eos)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


def test_pairs_rank_by_reward_and_dpo_raises_the_margin():
    """Pairs: chosen reward > rejected reward in every pair. Eight DPO steps on one batch of pairs raise
    the implicit-reward margin above 0 and the accuracy to 1 (a check that the loss trains, not that it helps)."""
    torch.manual_seed(0)
    tok = build_char_tokenizer()

    class LongerIsBetter(AdditionTask):  # an untrained model is never right: rank by length instead
        def reward(self, problem, completion, finished=True):
            return float(len(completion))
    task = LongerIsBetter(eval_size=10)
    model = make_tiny_model(tok, "llama", seed=0, hidden_size=32).eval()
    batches = preference_pairs(model, tok, task, steps=2, prompts_per_step=8, num_generations=4, seed=0)
    assert sum(b.chosen_ids.shape[0] for b in batches) > 0
    for b in batches:
        assert (b.chosen_reward > b.rejected_reward).all()
    b = max(batches, key=lambda b: b.chosen_ids.shape[0])
    policy = copy.deepcopy(model)
    h = train_dpo(policy, model, tok, [b] * 8, beta=0.5, learning_rate=3e-3)
    assert h["rewards/margins"][0] == pytest.approx(0.0, abs=1e-4)  # the first step starts at the reference
    assert h["rewards/margins"][-1] > 0.1 and h["rewards/accuracies"][-1] == 1.0
    assert h["loss"][-1] < math.log(2)


def test_comparison_table():
    rows = [{"method": m, "seed": s, "reward": r, "pass@1": 0.1} for m, s, r in
            [("GRPO", 0, 0.4), ("GRPO", 1, 0.6), ("DPO", 0, 0.3), ("DPO", 1, 0.3)]]
    text = comparison_table(rows, start={"reward": 0.2, "pass@1": 0.1}, cols=("reward", "pass@1"))
    assert "0.500" in text and "0.400 / 0.600" in text and "reference" in text
