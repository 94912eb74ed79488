"""The LLM stack: tokenizer, tiny models, sampling and masks, the GRPO step's invariants, and what a real model
needs (chunked log-probs, gradient checkpointing, bf16, truncated completions); hub-shaped models: test_llm_hub.py."""

import math
import random

import pytest
import torch

from minigrpo.llm.grpo import GRPOConfig, GRPOTrainer, completion_logprobs
from minigrpo.llm.models import load_causal_lm, make_tiny_model, tiny_config
from minigrpo.llm.sampling import completion_mask, encode_prompts, generate, process_logits, sequence_logprobs
from minigrpo.llm.tasks import AdditionTask, CountdownTask, Problem, SortTask
from minigrpo.llm.tokenizer import build_char_tokenizer
from minigrpo.losses import grpo_loss, loss_weights, reinforce_loss, selective_log_softmax


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    return make_tiny_model(tok, "llama", seed=0, hidden_size=32, num_heads=4, num_kv_heads=2).eval()


def test_tokenizer_roundtrip_and_save_load(tok, tmp_path):
    ids = tok.encode("12+34=", add_special_tokens=False)
    assert len(ids) == 6 and tok.decode(ids) == "12+34="
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    tok.save_pretrained(tmp_path)
    from transformers import AutoTokenizer
    again = AutoTokenizer.from_pretrained(tmp_path)
    assert again.encode("7*8", add_special_tokens=False) == tok.encode("7*8", add_special_tokens=False)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_tiny_models_and_loading_from_a_saved_folder(tok, arch, tmp_path):
    m = make_tiny_model(tok, arch, seed=0, hidden_size=32).eval()
    ids, mask = encode_prompts(tok, ["1+2=", "33+44="])
    assert m(input_ids=ids, attention_mask=mask).logits.shape == (2, ids.shape[1], len(tok))
    m.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    loaded, loaded_tok = load_causal_lm(str(tmp_path), device="cpu")
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids, attention_mask=mask).logits,
                                   m(input_ids=ids, attention_mask=mask).logits)
    assert loaded_tok.padding_side == "left"


def test_llama_config_uses_grouped_query_attention(tok):
    cfg = tiny_config(tok, "llama", num_heads=4, num_kv_heads=2)
    assert cfg.num_attention_heads == 4 and cfg.num_key_value_heads == 2


def test_completion_mask_keeps_the_first_eos_even_when_pad_is_eos():
    eos = 2
    ids = torch.tensor([[5, 6, 2, 2, 2], [5, 2, 7, 2, 2], [5, 6, 7, 8, 9]])
    assert completion_mask(ids, eos).tolist() == [[1, 1, 1, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1]]


def test_generation_logprobs_equal_one_forward_pass(tok, model):
    """KV-cached, left-padded generation and a single forward pass score the same tokens alike."""
    for temperature in (1.0, 0.7):
        g = generate(model, tok, ["1+2=", "45+67="], num_generations=3, max_new_tokens=5, temperature=temperature,
                     generator=torch.Generator().manual_seed(0))
        lp = sequence_logprobs(model, g.prompt_ids, g.prompt_mask, g.completion_ids, temperature, shared_prefix=False)
        assert ((lp - g.sampler_logprobs).abs() * g.completion_mask).max() < 1e-5


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_shared_prefix_scoring_equals_one_forward_pass_with_gradients(tok, arch):
    """Running each distinct prompt once and sharing its KV cache gives the same log-probs and gradients."""
    m = make_tiny_model(tok, arch, seed=1, hidden_size=32, num_heads=4)
    g = generate(m, tok, ["1+2=", "45+67=", "8+9="], num_generations=4, max_new_tokens=4,
                 generator=torch.Generator().manual_seed(0))
    rows = torch.tensor([11, 0, 5, 1, 6, 7, 2])  # any subset and order of rows
    results = []
    for shared in (False, True):
        m.zero_grad()
        lp = sequence_logprobs(m, g.prompt_ids[rows], g.prompt_mask[rows], g.completion_ids[rows], 0.8, shared)
        (lp * torch.linspace(-1, 1, lp.numel()).view_as(lp)).sum().backward()
        results.append((lp.detach(), [p.grad.clone() for p in m.parameters()]))
    (lp0, g0), (lp1, g1) = results
    torch.testing.assert_close(lp1, lp0, atol=1e-5, rtol=0)
    for a, b in zip(g1, g0):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_top_k_and_top_p_keep_the_expected_tokens():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.isfinite(process_logits(logits, top_k=2)).sum() == 2
    assert torch.isfinite(process_logits(logits, top_p=0.7)).tolist() == [[True, True, False, False]]
    with pytest.raises(ValueError, match="temperature"):
        process_logits(logits, temperature=0.0)


def test_tasks_reward_correct_and_well_formed_answers():
    add = AdditionTask()
    p = Problem("12+34=", "46", (12, 34))
    assert add.reward(p, "46") == pytest.approx(1.1) and add.reward(p, "47") == pytest.approx(0.1)
    assert add.reward(p, "4x") == 0.0 and add.reward(p, "46", finished=False) == 0.0
    assert add.reward(p, "046") == 0.0
    cd = CountdownTask()
    q = Problem("3,5,7>22:", "3*5+7", ((3, 5, 7), 22))
    assert cd.is_correct(q, "5*3+7") and cd.is_correct(q, "7+3*5") and not cd.is_correct(q, "3*5+8")
    assert not cd.is_correct(q, "3*5+7+7")  # each number exactly once
    assert not cd.is_well_formed("3*05+7") and cd.reward(q, "3*05+7") == 0.0  # no leading zeros
    held = {x.prompt for x in cd.eval_set}
    rng = random.Random(0)
    assert all(cd.sample(rng).prompt not in held for _ in range(300))


def test_sort_task_and_its_imperfect_teacher():
    task = SortTask(min_len=5, max_len=8)
    p = Problem("sort 70931:", "01379", ("70931",))
    assert task.reward(p, "01379") == pytest.approx(1.1) and task.reward(p, "01397") == pytest.approx(0.1)
    assert task.reward(p, "0137") == pytest.approx(0.1) and task.reward(p, "01 379") == 0.0
    rng = random.Random(0)
    for _ in range(200):
        q = task.sample(rng)
        slip = task.noisy_answer(q, rng)
        assert task.is_correct(q, q.answer) and task.is_well_formed(slip) and not task.is_correct(q, slip)
        assert 5 <= len(q.meta[0]) <= 8
    assert task.noisy_answer(Problem("sort 777:", "777", ("777",)), rng) == "77"  # no wrong order exists
    with pytest.raises(NotImplementedError, match="slips"):
        AdditionTask(eval_size=2).noisy_answer(p, rng)


def test_sft_with_a_noisy_teacher_replaces_the_demanded_share_of_answers(tok, monkeypatch):
    """demo_error_rate = 1: every demonstration is a slip; 0: none is."""
    import minigrpo.llm.sft as sft

    task, seen = SortTask(eval_size=2), []
    real = sft.sft_batch
    monkeypatch.setattr(sft, "sft_batch", lambda t, problems, device, **kw: seen.extend(problems) or real(t, problems, device, **kw))
    m = make_tiny_model(tok, "llama", seed=0, hidden_size=32)
    for rate, wrong in ((1.0, True), (0.0, False)):
        seen.clear()
        sft.train_sft(m, tok, task, sft.SFTConfig(steps=2, batch_size=8, demo_error_rate=rate), progress=False)
        assert len(seen) == 16 and all(task.is_correct(p, p.answer) != wrong for p in seen)


def _trainer(tok, model, **kw):
    cfg = GRPOConfig(**{"prompts_per_step": 4, "num_generations": 4, "eval_every": 0, "max_steps": 1, **kw})
    return GRPOTrainer(model, tok, AdditionTask(eval_size=10), cfg)


def _rollout(trainer):
    """What a GRPO step's rollout makes, drawn as the trainer draws it: G completions for each of its
    prompts_per_step problems (its prompt stream, its sampler, its generator) and their rewards ``[B]``."""
    cfg, G = trainer.cfg, trainer.cfg.num_generations
    problems = [trainer.task.sample(trainer.rng) for _ in range(cfg.prompts_per_step)]
    gen = trainer.sample_completions(trainer.model.eval(), trainer.tokenizer, [p.prompt for p in problems], G,
                                     trainer.max_len, cfg.temperature, generator=trainer.gen,
                                     use_chat_template=False, system_prompt=None)
    texts, finished = gen.texts(trainer.tokenizer), gen.finished.tolist()
    rewards = torch.tensor([trainer.task.reward(problems[i // G], t, f) for i, (t, f) in enumerate(zip(texts, finished))])
    return gen, rewards


def _flat_grad(model):
    return torch.cat([p.grad.reshape(-1) if p.grad is not None else torch.zeros(p.numel())
                      for p in model.parameters()])


def test_mu_one_gradient_is_reinforce(tok):
    """μ = 1, old = logp.detach(): the GRPO loss's gradient equals the REINFORCE gradient with the group baseline."""
    model = make_tiny_model(tok, "llama", seed=1, hidden_size=32)
    trainer = _trainer(tok, model, learning_rate=0.0, loss_type="dapo")
    # the gradient of the REINFORCE loss on a batch, by hand
    torch.manual_seed(0)
    gen, rewards = _rollout(trainer)
    from minigrpo.advantages import group_advantages
    adv = group_advantages(rewards, 4)
    rows = torch.arange(rewards.numel())
    model.zero_grad()
    logp = completion_logprobs(model, gen, rows, 1.0)
    m = gen.completion_mask.bool()
    reinforce_loss(logp[m], adv.unsqueeze(-1).expand_as(logp)[m]).backward()
    g_reinforce = _flat_grad(model).clone()
    model.zero_grad()
    logp = completion_logprobs(model, gen, rows, 1.0)
    loss, _ = grpo_loss(logp, logp.detach(), adv, gen.completion_mask, "dapo", 0.2)
    loss.backward()
    torch.testing.assert_close(_flat_grad(model), g_reinforce, rtol=1e-5, atol=1e-7)


def test_stored_old_logprobs_are_the_loss_logprobs_before_any_update(tok):
    """μ = 2 with two micro-batches and lr = 0: π_old is stored in prepare() (eval mode, its own forward passes)
    and the loss rescored in train mode, micro-batch by micro-batch. The policy has not moved, so every ratio
    must be 1 up to float32 rounding and nothing may be clipped; a row misalignment between the stored π_old
    and the micro-batches, another temperature or dropout would show here. Measured: |ρ − 1| ≤ 6e-7."""
    model = make_tiny_model(tok, "llama", seed=1, hidden_size=32)
    trainer = _trainer(tok, model, learning_rate=0.0, num_iterations=2, gradient_accumulation_steps=2,
                       temperature=0.7)
    metrics = trainer.step()
    assert 1 - 1e-5 < metrics["ratio_min"] <= metrics["ratio_max"] < 1 + 1e-5, metrics
    assert metrics["clip_ratio/region_mean"] == 0.0


def test_all_equal_groups_give_zero_gradient(tok, monkeypatch):
    model = make_tiny_model(tok, "llama", seed=2, hidden_size=32)
    trainer = _trainer(tok, model, learning_rate=0.0)
    monkeypatch.setattr(trainer.task, "reward", lambda p, t, f=True: 1.0)  # every completion scores the same
    metrics = trainer.step()
    assert metrics["frac_reward_zero_std"] == 1.0
    assert _flat_grad(model).abs().max().item() == 0.0


def test_tokens_after_eos_change_neither_loss_nor_gradient(tok):
    model = make_tiny_model(tok, "llama", seed=3, hidden_size=32)
    trainer = _trainer(tok, model)
    gen, rewards = _rollout(trainer)
    from minigrpo.advantages import group_advantages
    adv = group_advantages(rewards + torch.arange(16.0) * 0.01, 4)  # non-zero advantages everywhere

    def loss_and_grad(g):
        model.zero_grad()
        rows = torch.arange(16)
        logp = completion_logprobs(model, g, rows, 1.0)
        loss, _ = grpo_loss(logp, logp.detach(), adv, g.completion_mask, "grpo", 0.2)
        loss.backward()
        return loss.item(), _flat_grad(model).clone()

    base_loss, base_grad = loss_and_grad(gen)
    changed = torch.where(gen.completion_mask.bool(), gen.completion_ids, torch.full_like(gen.completion_ids, 7))
    gen2 = type(gen)(gen.prompt_ids, gen.prompt_mask, changed, gen.completion_mask, gen.sampler_logprobs, gen.finished)
    loss2, grad2 = loss_and_grad(gen2)
    assert loss2 == pytest.approx(base_loss, abs=1e-7)
    torch.testing.assert_close(grad2, base_grad, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo"])
def test_gradient_accumulation_keeps_each_normaliser_exact(tok, loss_type):
    grads = []
    for accumulation in (1, 4):
        model = make_tiny_model(tok, "llama", seed=4, hidden_size=32)
        trainer = _trainer(tok, model, learning_rate=0.0, loss_type=loss_type, gradient_accumulation_steps=accumulation)
        trainer.step()
        grads.append(_flat_grad(model))
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-4, atol=1e-7)


def test_kl_to_the_reference_is_zero_at_the_start(tok):
    """The reference is a frozen copy: its log-probs equal the policy's up to float32 rounding (frozen weights may
    take another GEMM kernel: |Δ logp| ≤ 5e-7 measured), so the k3 KL is below 1e-12 (4.5e-16 measured)."""
    model = make_tiny_model(tok, "llama", seed=5, hidden_size=32)
    metrics = _trainer(tok, model, beta=0.1, learning_rate=0.0).step()
    assert 0.0 <= metrics["kl"] < 1e-12
    assert _trainer(tok, model, beta=0.0).ref is None  # beta = 0 loads no reference


def test_config_errors():
    with pytest.raises(ValueError, match="num_generations"):
        GRPOConfig(num_generations=1)
    with pytest.raises(ValueError, match="stochastic"):
        GRPOConfig(temperature=0.0)
    with pytest.raises(ValueError, match="loss_type"):
        GRPOConfig(loss_type="ppo")
    with pytest.raises(ValueError, match="divide"):
        GRPOConfig(prompts_per_step=3, num_generations=3, gradient_accumulation_steps=2)


def test_nan_reward_is_an_error(tok, model, monkeypatch):
    trainer = _trainer(tok, model)
    monkeypatch.setattr(trainer.task, "reward", lambda p, t, f=True: float("nan"))
    with pytest.raises(ValueError, match="NaN"):
        trainer.step()


#: The GRPO test's setup: SFT steps, GRPO steps and GRPO learning rate (see sort_grpo_run).
SORT_SFT_STEPS, SORT_GRPO_STEPS, SORT_GRPO_LR = 400, 40, 3e-4
#: Held-out pass@1 after GRPO must exceed pass@1 before by more than this.
MIN_PASS1_GAIN = 0.14


def sort_grpo_run(seed: int):
    """SFT a tiny Llama (hidden 64) on sorting 3-5 digits, taught by a teacher who slips (swaps two neighbours)
    in half its demonstrations, then GRPO it with the verifier's reward. Returns held-out pass@1 (100 problems,
    8 samples each, the same sampling seed) before and after GRPO, and GRPO's history."""
    from minigrpo.llm.grpo import train_grpo
    from minigrpo.llm.sft import SFTConfig, evaluate_task, train_sft

    tok = build_char_tokenizer()
    task = SortTask(min_len=3, max_len=5, eval_size=100)
    model = make_tiny_model(tok, "llama", seed=seed, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2)
    train_sft(model, tok, task, SFTConfig(steps=SORT_SFT_STEPS, batch_size=64, learning_rate=3e-3,
                                          demo_error_rate=0.5, seed=seed), progress=False)
    before = evaluate_task(model, tok, task, num_generations=8, seed=seed)["pass@1"]
    cfg = GRPOConfig(max_steps=SORT_GRPO_STEPS, prompts_per_step=16, num_generations=8,
                     learning_rate=SORT_GRPO_LR, filter_zero_std_groups=True, eval_every=0, seed=seed)
    result = train_grpo(model, tok, task, cfg, progress=False)
    after = evaluate_task(model, tok, task, num_generations=8, seed=seed)["pass@1"]
    return before, after, result.history


def test_grpo_turns_the_teachers_slips_into_pass_at_1():
    """GRPO removes the slips a noisy teacher taught: held-out pass@1 rises by a margin that holds on any seed.

    The reference knows the skill (seed 1: greedy 0.93) but samples its teacher's slips (pass@1 0.48); the
    verifier's reward removes them. Measured (benchmarks/margins_models.py, seeds 0–4 × torch threads 1, 2, the same
    figures on both thread counts): pass@1 0.45–0.54 before, 0.77–0.91 after, gain 0.285–0.419 (min 0.285);
    asserted > 0.14. About 19 s of CPU on one thread.
    """
    from minigrpo.utils import torch_threads

    with torch_threads(1):  # the tiny model's fastest; the margin is measured on 1 and 2 threads
        before, after, history = sort_grpo_run(seed=0)
    assert len(history["reward"]) == SORT_GRPO_STEPS
    assert after > before + MIN_PASS1_GAIN, (before, after)


def test_loss_weights_sum_to_the_batch_normaliser_in_the_loss_dtype():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    w = loss_weights(mask, "grpo", num_sequences=2, num_tokens=3, max_completion_length=3, dtype=torch.float64)
    assert w.dtype == torch.float64 and w.tolist() == [[0.25, 0.25, 0.0], [0.5, 0.0, 0.0]]  # each sequence 1/2
    assert loss_weights(mask, "dapo", 2, 3, 3).sum().item() == pytest.approx(1.0)  # each token 1/3
    assert loss_weights(mask, "dr_grpo", 2, 3, 3).sum().item() == pytest.approx(3 / 6)  # constant 2 * 3


# --------------------------------------------------------------------------- bounded memory, bf16, truncation

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunk_elements", [1, 3 * 50, 10**9])  # one position per block, 3 per block, all at once
def test_selective_log_softmax_matches_float64_with_gradient(dtype, chunk_elements):
    """Chunked log-probs, entropy and the hand-written gradient against float64 autograd (on a non-contiguous
    ``logits[:, :-1]`` view, as SFT passes it). Measured max errors: float32 6e-7 (log-prob) and 3e-8 (gradient);
    bf16 inputs are upcast per chunk, so only the bf16 rounding of the logits themselves remains (exact vs the
    float64 computation on the same rounded logits, 1e-6)."""
    torch.manual_seed(0)
    full = (3 * torch.randn(3, 6, 50)).to(dtype).requires_grad_()
    logits, targets = full[:, :-1], torch.randint(0, 50, (3, 5))
    logp, entropy = selective_log_softmax(logits, targets, 0.7, with_entropy=True, chunk_elements=chunk_elements)
    x64 = full.detach().double().requires_grad_()
    ref_all = torch.log_softmax(x64[:, :-1] / 0.7, -1)
    ref = ref_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    assert logp.dtype == torch.float32 and logp.shape == (3, 5)
    torch.testing.assert_close(logp.double(), ref, atol=1e-5, rtol=0)
    torch.testing.assert_close(entropy.double(), -(ref_all.exp() * ref_all).sum(-1), atol=1e-5, rtol=0)
    weights = torch.randn(3, 5, dtype=torch.float64)
    (logp * weights.float()).sum().backward()
    (ref * weights).sum().backward()
    assert full.grad.dtype == dtype
    tol = 1e-6 if dtype == torch.float32 else 1e-2  # the gradient is returned in the logits' dtype
    torch.testing.assert_close(full.grad.double(), x64.grad, atol=tol, rtol=tol)
    assert not entropy.requires_grad


def test_selective_log_softmax_never_makes_a_full_float32_copy():
    """The largest float32 tensor made in forward and backward of bf16 logits [4, 32, 1000] with 2,000-element
    chunks is one chunk (2 positions × 1,000), not [4, 32, 1000] (128,000 elements): recorded op by op."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Largest(TorchDispatchMode):
        biggest = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in (out if isinstance(out, (tuple, list)) else [out]):
                if isinstance(t, torch.Tensor) and t.dtype == torch.float32:
                    Largest.biggest = max(Largest.biggest, t.numel())
            return out

    logits = torch.randn(4, 32, 1000).bfloat16().requires_grad_()
    targets = torch.randint(0, 1000, (4, 32))
    with Largest():
        logp, _ = selective_log_softmax(logits, targets, with_entropy=True, chunk_elements=2000)
        logp.sum().backward()
    assert Largest.biggest <= 2 * 1000, Largest.biggest


def test_gradient_checkpointing_gives_the_same_step(tok):
    """Recomputing activations in backward changes memory, not the gradient (the plain forward pass replaces the
    shared-prefix KV cache, which checkpointing turns off): equal to float32 rounding."""
    grads = []
    for checkpointing in (False, True):
        model = make_tiny_model(tok, "llama", seed=4, hidden_size=32)
        trainer = _trainer(tok, model, learning_rate=0.0, gradient_checkpointing=checkpointing, beta=0.1)
        trainer.step()
        grads.append(_flat_grad(model))
    assert grads[0].abs().max() > 0
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-4, atol=1e-7)


def test_bf16_keeps_float32_masters_and_reports_the_sampler_trainer_gap(tok):
    """bf16 = autocast: the trained weights stay float32, the reference copy is stored in bf16, the loss and the
    log-probs are float32, and the gap between the sampler's and the trainer's log-probs is logged."""
    model = make_tiny_model(tok, "llama", seed=6, hidden_size=32)
    trainer = _trainer(tok, model, bf16=True, beta=0.1)
    metrics = trainer.step()
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())
    assert all(p.dtype == torch.bfloat16 for p in trainer.ref.parameters())
    gap = metrics["sampling/sampling_logp_difference/mean"]
    assert 0.0 <= gap <= metrics["sampling/sampling_logp_difference/max"] < 0.5, metrics


def test_truncated_completions_get_no_loss_but_keep_their_place_in_the_normaliser(tok, monkeypatch):
    """mask_truncated_completions (TRL's meaning): the step's gradient equals the "grpo" loss over every completion
    with the unfinished ones' masks zeroed (each sequence weighs 1/B, B counting the truncated ones). The step runs
    at learning rate 0 without clipping, so its gradient stays in ``.grad``."""
    import minigrpo.llm.grpo as grpo_module
    from minigrpo.advantages import group_advantages

    drawn = []

    def half_finished(*args, **kwargs):  # every other row ends at its second token: a mix of both kinds
        g = generate(*args, **kwargs)
        ids = g.completion_ids.clone()
        ids[::2, 1], ids[::2, 2:] = tok.eos_token_id, tok.pad_token_id
        ids[1::2] = torch.where(ids[1::2] == tok.eos_token_id, torch.full_like(ids[1::2], 7), ids[1::2])
        mask = completion_mask(ids, tok.eos_token_id)
        drawn.append(type(g)(g.prompt_ids, g.prompt_mask, ids, mask, g.sampler_logprobs * mask, (ids == 2).any(1),
                             g.stop_ids))
        return drawn[-1]

    monkeypatch.setattr(grpo_module, "generate", half_finished)
    model = make_tiny_model(tok, "llama", seed=3, hidden_size=32)
    trainer = _trainer(tok, model, learning_rate=0.0, loss_type="grpo", mask_truncated_completions=True,
                       max_grad_norm=float("inf"))
    trainer.task.reward = lambda p, t, f=True: float(len(t))  # a spread in every group
    trainer.step()
    gen = drawn[0]
    assert gen.finished.tolist() == [True, False] * 8
    mine = _flat_grad(model).clone()
    model.zero_grad()
    advantages = group_advantages(torch.tensor([float(len(t)) for t in gen.texts(tok)]), 4)
    logp = completion_logprobs(model, gen, torch.arange(16), 1.0)
    masked = gen.completion_mask * gen.finished.unsqueeze(1)
    grpo_loss(logp, logp.detach(), advantages, masked, "grpo", 0.2)[0].backward()
    torch.testing.assert_close(mine, _flat_grad(model), rtol=1e-5, atol=1e-8)


# --------------------------------------------------------------------------- float32 master weights
@pytest.fixture(scope="module")
def bf16_folder(tok, tmp_path_factory):
    """A Llama-shaped checkpoint stored in bf16, as hub checkpoints are."""
    folder = tmp_path_factory.mktemp("bf16_llama")
    make_tiny_model(tok, "llama", seed=7, hidden_size=64, num_heads=4, num_kv_heads=2).to(torch.bfloat16) \
        .save_pretrained(folder)
    return folder


def _load_as_a_user_would(folder):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())  # transformers 5: dtype="auto"
    return model


def _moved_share(before: dict, model) -> float:
    """The share of the entries that got a nonzero gradient in the last step which differ from ``before``."""
    moved = got_grad = 0
    for name, p in model.named_parameters():
        g = p.grad != 0
        moved += int(((p.detach().float() != before[name]) & g).sum())
        got_grad += int(g.sum())
    assert got_grad > 1000
    return moved / got_grad


@pytest.mark.parametrize("bf16", [False, True])
def test_grpo_full_fine_tuning_of_a_bf16_checkpoint_moves_every_weight_with_a_gradient(tok, bf16_folder, bf16):
    """Two GRPO steps at lr 1e-5 on a bf16-stored checkpoint: the trainer keeps float32 masters, so every entry that
    got a gradient moves (> 99%; on bf16 weights AdamW's ~1e-5 steps are below half a rounding step and most are
    lost: 1.7% moved on a real 135M model)."""
    from minigrpo.llm.data import DatasetTask

    model = _load_as_a_user_would(bf16_folder)
    before = {n: p.detach().float().clone() for n, p in model.named_parameters()}
    task = DatasetTask([{"prompt": f"{i}+{i}="} for i in range(10)],
                       [lambda completions, **kw: [len(c) + c.count("1") for c in completions]],
                       max_completion_length=6)
    trainer = GRPOTrainer(model, tok, task, GRPOConfig(prompts_per_step=4, num_generations=4, max_steps=2,
                                                       eval_every=0, learning_rate=1e-5, bf16=bf16))
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())
    trainer.train(progress=False)
    assert _moved_share(before, trainer.model) > 0.99


def test_sft_of_a_bf16_checkpoint_moves_every_weight_with_a_gradient(tok, bf16_folder):
    from minigrpo.llm.sft import SFTConfig, SFTTrainer

    model = _load_as_a_user_would(bf16_folder)
    before = {n: p.detach().float().clone() for n, p in model.named_parameters()}
    trainer = SFTTrainer(model, tok, SortTask(eval_size=2), SFTConfig(steps=2, batch_size=8, learning_rate=1e-5))
    assert all(p.dtype == torch.float32 for p in model.parameters())
    trainer.train(progress=False)
    assert _moved_share(before, model) > 0.99


def test_dpo_trains_float32_masters_of_a_bf16_checkpoint(tok, bf16_folder):
    from minigrpo.llm.dpo import PairBatch, train_dpo

    model, ref = _load_as_a_user_would(bf16_folder), _load_as_a_user_would(bf16_folder)
    before = {n: p.detach().float().clone() for n, p in model.named_parameters()}
    ids, mask = encode_prompts(tok, ["1+2=", "3+4="])
    chosen, rejected = torch.tensor([[5, 2, 0], [6, 7, 2]]), torch.tensor([[8, 8, 2], [9, 2, 0]])
    h = train_dpo(model, ref, tok, [PairBatch(ids, mask, chosen, rejected, torch.ones(2), torch.zeros(2))] * 2,
                  learning_rate=1e-5)
    assert len(h["loss"]) == 2 and all(p.dtype == torch.float32 for p in model.parameters())
    assert _moved_share(before, model) > 0.99


def test_top_k_and_top_p_are_scored_as_sampled_so_the_ratio_is_one_on_recompute(tok):
    """top_k = 5, top_p = 0.9 (TRL's fields): the sampler draws from the truncated, renormalised distribution and
    the trainer scores the same one. At lr 0 with μ = 2: π_old / π_θ is 1 (to 1e-5), the sampler–trainer gap is
    float32 rounding (< 1e-4) and so are the importance weights; scored without truncation the gap is > 1e-2.
    The reference is scored untruncated (its support holds the sampler's), so the KL stays finite."""
    model = make_tiny_model(tok, "llama", seed=1, hidden_size=32)
    trainer = _trainer(tok, model, learning_rate=0.0, num_iterations=2, top_k=5, top_p=0.9, temperature=0.8,
                       beta=0.1, vllm_importance_sampling_correction=True)
    drawn, sampler = [], trainer.sample_completions
    trainer.sample_completions = lambda *a, **k: drawn.append(sampler(*a, **k)) or drawn[-1]
    metrics = trainer.step()
    assert 1 - 1e-5 < metrics["ratio_min"] <= metrics["ratio_max"] < 1 + 1e-5, metrics
    assert metrics["sampling/sampling_logp_difference/max"] < 1e-4
    w_min, w_max = metrics["sampling/importance_sampling_ratio/min"], metrics["sampling/importance_sampling_ratio/max"]
    assert 1 - 1e-4 < w_min <= w_max < 1 + 1e-4
    assert 0 < metrics["kl"] < float("inf")
    gen = drawn[0]
    rows, mask = torch.arange(gen.completion_ids.shape[0]), gen.completion_mask.bool()
    with torch.no_grad():
        plain = completion_logprobs(model, gen, rows, 0.8)
        truncated, entropy = completion_logprobs(model, gen, rows, 0.8, with_entropy=True, top_k=5, top_p=0.9)
        _, plain_entropy = completion_logprobs(model, gen, rows, 0.8, with_entropy=True)
    assert (plain - gen.sampler_logprobs)[mask].abs().max() > 1e-2
    torch.testing.assert_close(truncated[mask], gen.sampler_logprobs[mask], atol=1e-4, rtol=0)
    assert (entropy <= plain_entropy + 1e-6).all() and (entropy <= math.log(5) + 1e-6).all()  # at most 5 tokens
    with pytest.raises(ValueError, match="top_p"):
        GRPOConfig(top_p=1.5)
    with pytest.raises(ValueError, match="top_k"):
        GRPOConfig(top_k=-1)
