"""Nothing silent in the LLM trainers (issue 25): a learning rate that blows up stops GRPO, SFT and DPO with one
sentence naming the step, the quantity and the likely cause (TrainingDiverged, which the CLI turns into exit 1)
instead of a torch traceback or NaN weights; a model that arrives with NaN weights is refused; a DatasetTask
without a held-out set trains without evaluation, with one warning, instead of logging NaN."""

import math
import warnings

import pytest
import torch

from minigrpo.infra.divergence import TrainingDiverged, all_finite
from minigrpo.llm.data import DatasetTask
from minigrpo.llm.grpo import GRPOConfig, GRPOTrainer
from minigrpo.llm.models import make_tiny_model
from minigrpo.llm.tasks import SortTask
from minigrpo.llm.tokenizer import build_char_tokenizer

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def _task(**kw):
    return DatasetTask([{"prompt": f"{i}+{i}="} for i in range(10)],
                       [lambda completions, **k: [len(c) + c.count("1") for c in completions]], max_completion_length=6,
                       **kw)


def _grpo(tok, **kw):
    cfg = GRPOConfig(**{"prompts_per_step": 2, "num_generations": 4, "max_steps": 6, "eval_every": 0,
                        "max_grad_norm": float("inf"), **kw})
    return GRPOTrainer(make_tiny_model(tok, "llama", seed=0, hidden_size=32), tok, _task(), cfg)


def test_logits_that_blow_up_while_sampling_are_a_sentence_not_a_multinomial_error(tok):
    """lr 1e10: the weights stay finite after step 1, the logits do not: step 2's sampling used to end in torch's
    "probability tensor contains either inf, nan or element < 0"."""
    trainer = _grpo(tok, learning_rate=1e10)
    with pytest.raises(TrainingDiverged) as info:
        trainer.train(progress=False)
    assert str(info.value) == ("GRPO step 2: the policy's logits (while sampling) is NaN or inf; learning_rate 1e+10 "
                               "is likely too high (try 1e+09)")
    assert isinstance(info.value, RuntimeError) and trainer.step_count == 1


def test_a_gradient_that_blows_up_stops_before_the_weights_take_it_in(tok):
    """lr 1e20: step 2's gradient norm is NaN; training stops there and the weights are still finite."""
    trainer = _grpo(tok, learning_rate=1e20)
    with pytest.raises(TrainingDiverged, match=r"^GRPO step 2: the (loss|gradient norm) is NaN or inf; "
                                               r"learning_rate 1e\+20 is likely too high"):
        trainer.train(progress=False)
    assert all_finite(trainer.model.parameters())


def test_sft_with_a_diverging_learning_rate_stops_instead_of_training_on_nan(tok):
    """lr 100: after step 2 the weights are no longer finite (they used to train on as NaN without a word)."""
    from minigrpo.llm.sft import SFTConfig, train_sft

    model = make_tiny_model(tok, "llama", seed=0, hidden_size=32)
    with pytest.raises(TrainingDiverged, match=r"^SFT step 2: a weight of the model is NaN or inf; learning_rate "
                                               r"100 is likely too high \(try 10\)$"):
        train_sft(model, tok, SortTask(eval_size=4), SFTConfig(steps=10, batch_size=8, learning_rate=100.0),
                  progress=False)


def test_dpo_with_a_diverging_learning_rate_stops_with_a_sentence(tok):
    from minigrpo.llm.dpo import PairBatch, train_dpo
    from minigrpo.llm.sampling import encode_prompts

    model, ref = (make_tiny_model(tok, "llama", seed=0, hidden_size=32) for _ in range(2))
    ids, mask = encode_prompts(tok, ["1+2=", "3+4="])
    batch = PairBatch(ids, mask, torch.tensor([[5, 2, 0], [6, 7, 2]]), torch.tensor([[8, 8, 2], [9, 2, 0]]),
                      torch.ones(2), torch.zeros(2))
    with pytest.raises(TrainingDiverged, match=r"^DPO step \d+: .* is NaN or inf; learning_rate 1e\+30 is likely"):
        train_dpo(model, ref, tok, [batch] * 10, learning_rate=1e30, max_grad_norm=float("inf"))


def test_a_model_with_nan_weights_is_refused_before_training(tok):
    model = make_tiny_model(tok, "llama", seed=0, hidden_size=32)
    with torch.no_grad():
        next(model.parameters())[0, 0] = math.nan
    with pytest.raises(ValueError, match=r"^GRPO: the model's weights hold NaN or inf before training"):
        GRPOTrainer(model, tok, _task(), GRPOConfig(eval_every=0))


def test_a_dataset_task_without_an_eval_set_trains_without_evaluation_and_one_warning(tok):
    """eval_every > 0 with no eval_dataset used to log NaN for every evaluation metric."""
    model = make_tiny_model(tok, "llama", seed=0, hidden_size=32)
    cfg = GRPOConfig(prompts_per_step=2, num_generations=4, max_steps=2, eval_every=1)
    with pytest.warns(UserWarning) as caught:
        trainer = GRPOTrainer(model, tok, _task(), cfg)
    messages = [str(w.message) for w in caught if "held-out" in str(w.message)]
    assert messages == ["GRPOConfig.eval_every=1, but the task 'dataset' has no held-out set (a DatasetTask without "
                        "eval_dataset): training without evaluation; give eval_dataset= to evaluate, or set "
                        "eval_every=0 to silence this"]
    result = trainer.train(progress=False)
    assert result.evals == [] and result.history["step"] == [1, 2]
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # with a held-out set: no warning, evaluations at 0, 1, 2
        with_eval = GRPOTrainer(make_tiny_model(tok, "llama", seed=0, hidden_size=32), tok,
                                _task(eval_dataset=[{"prompt": "2+2="}]), cfg)
    assert [e["step"] for e in with_eval.train(progress=False).evals] == [0, 1, 2]
