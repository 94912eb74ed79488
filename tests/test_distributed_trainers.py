"""Data parallelism beyond LLM GRPO (minigrpo/infra/distributed.py): SFT, diffusion GRPO and PPO. For each, two CPU processes
(gloo) that each hold half of a global batch take the same optimizer step as one process on the whole batch.

Each test starts two processes (forked on Linux: 1-9 s per test on 2 busy cores; spawned elsewhere, ~10 s more for
the imports); the models are in float64, so the comparisons are exact up to summation order."""

import os

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from two_processes import START, accelerate_launch, free_port, join_as_launched

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _worker(rank, port, fn, args, out_dir):
    join_as_launched(rank, port)
    torch.save(fn(rank, *args), os.path.join(out_dir, f"rank{rank}.pt"))


def run_two_processes(fn, args, tmp_path) -> list:
    """``fn(rank, *args)`` in two gloo processes (a module-level function); what each returned, in rank order."""
    mp.start_processes(_worker, args=(free_port(), fn, args, str(tmp_path)), nprocs=2, join=True, start_method=START)
    return [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]


def _params_and_grads(model):
    return ([p.detach().clone() for p in model.parameters()],
            [p.grad.detach().clone() for p in model.parameters() if p.grad is not None])


# ----------------------------------------------------------------------------- SFT

SFT_GLOBAL = 8  # problems in the global batch; 4 per rank


def _sft_setup(batch_size, seed=0):
    from minigrpo.llm.models import make_tiny_model
    from minigrpo.llm.sft import SFTConfig, SFTTrainer
    from minigrpo.llm.tasks import TASKS
    from minigrpo.llm.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    task = TASKS["sort"]()
    model = make_tiny_model(tok, seed=seed).double()
    return SFTTrainer(model, tok, task, SFTConfig(steps=1, batch_size=batch_size, learning_rate=1e-2)), task


def _sft_rank(rank, problems):
    trainer, _ = _sft_setup(SFT_GLOBAL // 2, seed=rank)  # rank 1 starts elsewhere: the broadcast must fix it
    assert (trainer.dist.rank, trainer.dist.world_size) == (rank, 2)
    loss = trainer.step(problems[rank * SFT_GLOBAL // 2:(rank + 1) * SFT_GLOBAL // 2])
    return loss, *_params_and_grads(trainer.model)


def test_sft_two_processes_take_the_one_process_step_of_the_global_batch(tmp_path):
    """Float64 tiny llama, 8 sorting demonstrations of different lengths (so the per-rank token counts differ): the
    summed gradients equal the one-process gradient to 1e-12 relative, the loss (the global token mean) to 1e-12, the
    parameters after AdamW to 1e-12; both ranks end with the same weights."""
    import random

    trainer, task = _sft_setup(SFT_GLOBAL)
    rng = random.Random(3)
    problems = [task.sample(rng) for _ in range(SFT_GLOBAL)]
    loss = trainer.step(problems)
    params, grads = _params_and_grads(trainer.model)
    for got_loss, p2, g2 in run_two_processes(_sft_rank, (problems,), tmp_path):
        assert got_loss == pytest.approx(loss, rel=1e-12)
        for a, b in zip(grads, g2):
            torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-15)
        for a, b in zip(params, p2):
            torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------- diffusion GRPO

DIFF_PROMPTS, DIFF_G = 4, 4  # global batch: 4 prompts x G = 4 chains; each of 2 ranks holds 2 whole groups
#: (scale_rewards, beta, num_iterations): the batch std gathered; the KL term; a second pass where ρ != 1
DIFF_CASES = [("group", 0.1, 2), ("batch", 0.0, 1)]


def _diffusion_trainer(case, prompts, seed=0):
    from minigrpo.diffusion.grpo import DiffusionGRPOConfig, DiffusionGRPOTrainer
    from minigrpo.diffusion.models import make_scheduler, make_unet
    from minigrpo.diffusion.rewards import ink_reward

    scale, beta, mu = case
    cfg = DiffusionGRPOConfig(prompts_per_step=prompts, num_generations=DIFF_G, num_inference_steps=4, beta=beta,
                              num_iterations=mu, scale_rewards=scale, timestep_fraction=0.5, learning_rate=1e-2,
                              epsilon=1e-3)
    model = make_unet(8, 10, (8, 16), 1, 4, seed=seed).double()
    return DiffusionGRPOTrainer(model, make_scheduler(20), ink_reward, cfg)


def _rollout_rows(ro, rows: slice):
    """The chains ``rows`` of a one-process rollout (with their steps and reference means)."""
    import dataclasses

    chain = dataclasses.replace(ro.chain, xs=ro.chain.xs[:, rows], logprobs=ro.chain.logprobs[rows],
                                labels=ro.chain.labels[rows])
    ref_mean = None if ro.ref_mean is None else ro.ref_mean[rows]
    return dataclasses.replace(ro, chain=chain, labels=ro.labels[rows], rewards=ro.rewards[rows],
                               advantages=ro.advantages[rows], steps=ro.steps[rows], ref_mean=ref_mean)


def _diffusion_rank(rank, rollouts, folder):
    torch.set_default_dtype(torch.float64)
    out = []
    for case, ro in zip(DIFF_CASES, rollouts):
        trainer = _diffusion_trainer(case, DIFF_PROMPTS // 2, seed=5 * rank)  # the broadcast must fix rank 1
        half = DIFF_PROMPTS // 2 * DIFF_G
        mine = _rollout_rows(ro, slice(rank * half, (rank + 1) * half))
        mine.advantages = trainer.advantages(mine.rewards)  # through the gather: the batch std is global
        metrics = trainer.step(mine)
        out.append((metrics, *_params_and_grads(trainer.model)))
    folder = os.path.join(folder, "checkpoint")  # a resume: rank 0 saved, every rank loads
    if rank == 0:
        trainer.save_checkpoint(folder)
    trainer.dist.barrier()
    trainer.load_checkpoint(folder)
    return out, trainer.gen.get_state()


def test_diffusion_grpo_two_processes_take_the_one_process_step_of_the_global_batch(tmp_path):
    """Float64 tiny UNet, one global rollout of 4 prompts x 4 chains per case (group scaling with β = 0.1 and μ = 2;
    batch scaling): two gloo processes holding two groups each recompute the advantages through the gathered
    rewards and end with the one-process gradients and parameters to 1e-10 relative; the gathered reward metrics
    and the grad norm agree too. Resumed from rank 0's checkpoint, the ranks' generators still differ."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # the sampler's noise in float64 too
    try:
        rollouts, expected = [], []
        for case in DIFF_CASES:
            trainer = _diffusion_trainer(case, DIFF_PROMPTS)
            ro = trainer.rollout()
            assert ro.rewards.view(DIFF_PROMPTS, DIFF_G).std(1).min() > 0
            rollouts.append(ro)
            expected.append((trainer.step(ro), *_params_and_grads(trainer.model)))
    finally:
        torch.set_default_dtype(previous)
    (out0, gen0), (out1, gen1) = run_two_processes(_diffusion_rank, (rollouts, str(tmp_path)), tmp_path)
    assert not torch.equal(gen0, gen1)  # resumed from rank 0's checkpoint, the ranks still sample apart
    for case, (metrics, params, grads) in zip(DIFF_CASES, expected):
        for got in (out0, out1):
            m2, p2, g2 = got[DIFF_CASES.index(case)]
            for key in ("reward", "reward_std", "frac_reward_zero_std", "grad_norm"):
                assert m2[key] == pytest.approx(metrics[key], rel=1e-10), (case, key)
            for a, b in zip(grads, g2):
                torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-13)
            for a, b in zip(params, p2):
                torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-10)


def test_accelerate_launch_runs_train_diffusion_in_two_processes(tmp_path):
    """``accelerate launch --multi_gpu --num_processes 2 -m minigrpo train diffusion --recipe digits --smoke`` on a
    CPU-only machine (gloo): rank 0 builds the smoke base model (cached) while rank 1 waits, both train, rank 0 alone
    evaluates, prints and writes (on 2 busy cores: 20 s of CPU, ~60 s wall; the LLM twin is in test_distributed.py)."""
    import json

    out = tmp_path / "run"
    done = accelerate_launch("train", "diffusion", "--recipe", "digits", "--smoke", "--output", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "in 2 processes" in done.stdout and done.stdout.count("before GRPO") == 1  # rank 0 alone reports
    record = json.loads((out / "results.json").read_text())
    assert record["history"]["step"] == [1, 2] and 0 <= record["reward_after"] <= 1
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint-2", "results.json"]


def test_train_diffusion_rejects_llm_options_and_unknown_recipes(capsys):
    from minigrpo.cli import DIFFUSION_RECIPES, main
    from minigrpo.diffusion import recipes

    assert DIFFUSION_RECIPES == recipes.DIFFUSION_RECIPES  # named twice so that --help imports no torch
    assert main(["train", "diffusion", "--recipe", "sort"]) == 2
    assert "no diffusion recipe 'sort'; recipes: digits" in capsys.readouterr().err
    assert main(["train", "diffusion", "--recipe", "digits", "--model", "x/y"]) == 2
    assert "--model and --lora are options of train llm" in capsys.readouterr().err
    assert main(["train", "diffusion", "--recipe", "digits", "max_step=3"]) == 2
    assert "override 'max_step=3' must be FIELD=VALUE" in capsys.readouterr().err


# ----------------------------------------------------------------------------- PPO

PPO_SAMPLES = 64  # the global batch (e.g. 2 ranks x 4 envs x 8 steps); 32 per rank
#: (update_epochs, target_kl): three passes; a target_kl that stops every rank after the first epoch
PPO_CASES = [(3, None), (3, 1e-9)]


def _ppo_setup(case, seed):
    import gymnasium as gym

    from minigrpo.control.agents import ActorCritic
    from minigrpo.control.ppo import PPOConfig

    epochs, target_kl = case
    cfg = PPOConfig(num_envs=4, num_steps=8, num_minibatches=1, update_epochs=epochs, target_kl=target_kl,
                    learning_rate=1e-2, ent_coef=0.01, clip_vloss=True, norm_adv=True)
    torch.manual_seed(seed)
    agent = ActorCritic(gym.spaces.Box(-5, 5, (4,)), gym.spaces.Discrete(3), (16,)).double()
    return cfg, agent, torch.optim.Adam(agent.parameters(), lr=cfg.learning_rate, eps=1e-5)


def _ppo_batch():
    """A global batch with ratios away from 1 (the clip acts) and advantages not yet standardised."""
    _, agent, _ = _ppo_setup(PPO_CASES[0], seed=0)
    g = torch.Generator().manual_seed(1)
    obs = torch.randn(PPO_SAMPLES, 4, generator=g, dtype=torch.float64)
    with torch.no_grad():
        actions = torch.randint(0, 3, (PPO_SAMPLES,), generator=g)
        old_logp = agent.dist(obs).log_prob(actions) + 0.3 * torch.randn(PPO_SAMPLES, generator=g, dtype=torch.float64)
        values = agent.value(obs) + 0.5 * torch.randn(PPO_SAMPLES, generator=g, dtype=torch.float64)
    adv = 2 + 3 * torch.randn(PPO_SAMPLES, generator=g, dtype=torch.float64)
    return [obs, actions, old_logp, adv, values + adv, values]


def _ppo_rank(rank, batch):
    from minigrpo.control.ppo import ppo_epochs
    from minigrpo.infra.distributed import Distributed

    out = []
    for case in PPO_CASES:
        cfg, agent, opt = _ppo_setup(case, seed=7 * rank)
        ranks = Distributed()
        ranks.broadcast_parameters(agent)  # as train_loop does: rank 1's other agent becomes rank 0's
        half = PPO_SAMPLES // 2
        metrics = ppo_epochs(cfg, agent, opt, [x[rank * half:(rank + 1) * half] for x in batch], 0.2, ranks)
        out.append((metrics, *_params_and_grads(agent)))
    return out


def test_ppo_two_processes_take_the_one_process_steps_of_the_global_batch(tmp_path):
    """Float64 actor-critic, one global batch of 64 samples, one minibatch per epoch: two gloo processes holding 32
    samples each (advantages standardised over both, gradients averaged) end with the one-process parameters after
    three Adam steps to 1e-9 relative; with a tiny target_kl both ranks stop after the first epoch, as one process
    does (the approx_kl they test is the global minibatch's)."""
    from minigrpo.control.ppo import ppo_epochs

    batch = _ppo_batch()
    expected = []
    for case in PPO_CASES:
        cfg, agent, opt = _ppo_setup(case, seed=0)
        expected.append((ppo_epochs(cfg, agent, opt, batch, 0.2), *_params_and_grads(agent)))
    assert [m["epochs_run"] for m, _, _ in expected] == [3, 1] and expected[0][0]["clip_frac"] > 0
    for got in run_two_processes(_ppo_rank, (batch,), tmp_path):
        for (metrics, params, grads), (m2, p2, g2) in zip(expected, got):
            assert m2["epochs_run"] == metrics["epochs_run"]
            for a, b in zip(grads, g2):
                torch.testing.assert_close(b, a, rtol=1e-9, atol=1e-12)
            for a, b in zip(params, p2):
                torch.testing.assert_close(b, a, rtol=1e-9, atol=1e-12)


def _ppo_train_rank(rank, output_dir):
    from minigrpo.control.a2c import A2CConfig, train_a2c
    from minigrpo.control.ppo import PRESETS, PPOConfig, train_ppo

    cfg = PPOConfig(**{**PRESETS["CartPole-v1"], "num_envs": 2, "num_steps": 16, "total_timesteps": 256,
                       "eval_every_steps": 128, "eval_episodes": 2, "output_dir": output_dir})
    result = train_ppo(cfg, progress=False)
    try:
        train_a2c(A2CConfig(num_envs=2, num_steps=8, total_timesteps=64), progress=False)
        refused = ""
    except ValueError as exc:
        refused = str(exc)
    return result.history, [p.detach().clone() for p in result.agent.parameters()], refused


def test_train_ppo_in_two_processes(tmp_path):
    """``train_ppo`` in two gloo processes (as under ``accelerate launch -m minigrpo.control``): each rank steps its
    own 2 CartPole envs; total_timesteps counts both ranks' steps (256 = 4 iterations × 2 ranks × 32); the ranks
    end with the same agent and the same (rank 0's) evaluations; rank 0 alone writes the checkpoint; A2C, whose update
    does not average gradients, refuses to run in several processes."""
    out = tmp_path / "ppo"
    (h0, p0, refused), (h1, p1, _) = run_two_processes(_ppo_train_rank, (str(out),), tmp_path)
    assert h0["env_steps"] == h1["env_steps"] == [64, 128, 192, 256]
    assert h0["eval_step"] == [128, 256] and h0["eval_return"] == h1["eval_return"]
    np.testing.assert_array_equal(h0["train_return"], h1["train_return"])  # averaged over the ranks (NaN: no episode)
    for a, b in zip(p0, p1):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert [p.name for p in out.iterdir()] == ["checkpoint-4"]
    assert refused.startswith("A2C trains in one process only")
