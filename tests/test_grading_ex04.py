"""The grader of exercise 04's PPO update (items 04.4 and 04.5): its typical mistakes differ from the reference by
one knob each, its recording optimizer sees what each step's loss saw, its CartPole batch has the training loop's
shapes, and a policy loss of the wrong sign fails item 04.5's training case itself, not only its quick case."""

import torch

from minigrpo_course.grading import ex04, run_item
from minigrpo_course.grading.core import outcome


def test_the_mistakes_are_the_reference_but_for_their_knob():
    """``ex04._update`` with no knob turned passes every case of 04.4 and the quick case of 04.5, so each typical
    mistake (one knob) is the reference with exactly that one thing wrong."""
    assert run_item(ex04.PPO_UPDATE, ex04._update).passed
    assert run_item(ex04.PPO_UPDATE_TRAINS, ex04._update, quick=True).passed


def test_the_recording_optimizer_counts_steps_and_the_samples_each_loss_saw():
    agent, opt, batch = ex04.ppo_problem(0, n=8)
    for rows in ([0, 1, 2], [5, 7]):
        loss = agent.value(batch[0][rows]).sum() + agent.dist(batch[0][rows]).entropy().sum()
        with torch.no_grad():
            agent.dist(batch[0])  # a pass without grad (a dashboard statistic) is not counted
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert opt.steps == 2 and opt.visits == [[0, 1, 2], [5, 7]]
    assert opt == ex04.ppo_problem(0, n=8)[1] and opt != ex04.ppo_problem(0, n=8, optimizer="adam")[1]


def test_the_cartpole_batch_has_the_training_loops_shapes():
    agent, opt, batch = ex04.cartpole_rollout(0)
    assert [tuple(x.shape) for x in batch] == [(256, 4)] + [(256,)] * 5
    assert batch[0].dtype == torch.float32 and batch[1].dtype == torch.int64
    torch.testing.assert_close(batch[4] - batch[3], batch[5])  # returns = advantages + old values


def test_a_policy_loss_of_the_wrong_sign_fails_the_training_case_itself():
    """Item 04.5's mistake (a policy loss of the wrong sign) fails its training case on its own, at the first graded
    seed already (greedy return about 9; the figures are in ex04's comments), not only its quick case."""
    item = ex04.PPO_UPDATE_TRAINS
    training = next(c for c in item.cases if not c.quick)
    result = outcome(item, training, next(w.fn for w in item.wrong_answers if w.name == "sign"))
    returns = next(v for k, v in result.items() if k.startswith("last greedy return"))
    assert returns[0] < 50 and torch.all(returns[1:] == 0), returns
