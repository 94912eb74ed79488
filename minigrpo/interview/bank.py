"""The interview question bank: every question and follow-up of the course's seed interviews.

Each :class:`Question` says what it asks, which seed questions it covers, what a strong answer
must contain (the checklist), a model answer, and the lesson cell that demonstrates it. A cell is
named by ``(notebook, fragment)``: a piece of text that must appear in exactly one cell of that
notebook, so rebuilding a notebook (new cells, new ids) does not break the link while the
heading survives. ``tests/test_interview.py`` checks both the coverage and the links.

The text is ours; the seed interviews only decided what is asked.
"""

from __future__ import annotations

from dataclasses import dataclass

# --------------------------------------------------------------------------------------------
# The seed interviews, enumerated: every question and follow-up gets a reference "SSS.part".
# Paraphrased (one line each) so the bank can be checked without the seed files.
# --------------------------------------------------------------------------------------------

SEED_FILES = {
    "000": "000_91d4d26d4a40d38a.txt (GRPO-style fine-tuning of a text-to-image diffusion model)",
    "001": "001_71ca7ed5b4de874a.txt (debugging a GRPO loop; why the ratio is not 1)",
    "002": "002_723c3314c0c50e02.txt (PPO vs GRPO for large-model fine-tuning)",
    "003": "003_4e41d8661624d54e.txt (GRPO overview with sixteen interview questions)",
    "004": "004_d65a0963c7a287a2.txt (policy-gradient methods and efficient attention)",
}

SEED_QUESTIONS: dict[str, str] = {
    "000.main": "set up and implement GRPO fine-tuning of a text-to-image diffusion model; how it differs from REINFORCE",
    "000.a": "diffusion RL: what are the states, actions and rewards",
    "000.b": "diffusion RL: how to sample trajectories and compute the GRPO advantages",
    "000.c": "diffusion RL: which loss, and how it relates to the policy gradient",
    "000.d": "diffusion RL: pseudocode of one training iteration",
    "001.clarify": "GRPO debugging: which clarifying questions to ask about the stack first",
    "001.1": "walk through one end-to-end GRPO training step",
    "001.2": "three easy-to-miss bugs in a GRPO/PPO loop, each with detection and fix",
    "001.3": "why the importance ratio deviates from 1 in a strictly on-policy loop; what to check",
    "001.F1": "how the clipped surrogate keeps a non-trivial ratio from destabilising training",
    "001.F2": "a group whose completions all get the same reward: advantage, skip or not, divide-by-zero guard",
    "001.F3": "unavoidable engine-vs-trainer log-prob mismatch: the principled correction",
    "001.F4": "process supervision vs outcome supervision: what changes",
    "001.F5": "KL to the reference: in the reward or in the loss, and the trade-offs",
    "002.1": "describe PPO's actor-critic set-up and its reward-minus-value advantage",
    "002.2": "describe GRPO's group-relative advantage on a worked group of rewards",
    "002.3": "why many large-model recipes prefer GRPO to PPO",
    "002.4": "the main risk of GRPO",
    "002.5": "choosing the group size k in practice",
    "003.Q1": "what GRPO is and how it differs from PPO",
    "003.Q2": "why GRPO normalises advantages within groups",
    "003.Q3": "what happens when every output of a group gets the same reward",
    "003.Q4": "walk through the GRPO update equation step by step",
    "003.Q5": "how to choose the group size G and its trade-offs",
    "003.Q6": "the role of the reference policy",
    "003.Q7": "exploration vs exploitation in GRPO",
    "003.Q8": "debugging a GRPO run that is not improving",
    "003.Q9": "memory requirements of GRPO training",
    "003.Q10": "implementing GRPO from scratch: the key components",
    "003.Q11": "using preference data instead of absolute rewards with GRPO",
    "003.Q12": "GRPO compared with DPO",
    "003.Q13": "adapting GRPO to multi-turn dialogue",
    "003.Q14": "adapting GRPO to continual / lifelong learning",
    "003.Q15": "failure modes of GRPO and how to detect them",
    "003.Q16": "when to choose GRPO over REINFORCE",
    "004.A1": "on-policy vs off-policy: definition and two examples of each",
    "004.A2": "TRPO: the problem it solves, the KL trust region, the constrained objective",
    "004.A3": "PPO: the clipped surrogate and what the clipping prevents",
    "004.A4": "GAE: the advantage, the estimator, and λ's bias-variance trade-off",
    "004.B1": "linear attention: linear in what, what changes vs softmax, what is lost",
    "004.B2": "grouped-query attention: what is shared, why it helps inference, trade-offs, relation to MHA/MQA",
    "004.F1": "reusing a large replay buffer with PPO/TRPO: what breaks, and how ε interacts with staleness",
    "004.F2": "γ and λ both down-weight the future: how their roles differ",
    "004.F3": "why exact softmax attention (FlashAttention) still wins over linear attention",
    "004.F4": "cut KV-cache memory 4x with 32 query heads: GQA-8 vs MQA vs linear attention, what to measure",
}


@dataclass(frozen=True)
class Demo:
    """A lesson cell: the notebook (repo-relative path) and a fragment found in exactly one of its cells."""

    notebook: str
    fragment: str

    @property
    def lesson(self) -> str:
        """The two-digit number of the notebook, e.g. "06"."""
        return self.notebook.rsplit("/", 1)[-1][:2]


@dataclass(frozen=True)
class Question:
    id: str
    topic: str
    seeds: tuple[str, ...]  #: keys of SEED_QUESTIONS this entry answers
    question: str
    checklist: tuple[str, ...]  #: what a strong answer covers
    answer: str  #: a model answer (plain text, unicode math)
    demo: Demo
    #: the lesson that will demonstrate it better once it exists (the demo is provisional until then)
    planned: str | None = None


_L00 = "notebooks/00_rl_basics.ipynb"
_L02 = "notebooks/02_actor_critic_gae.ipynb"
_L03 = "notebooks/03_trpo.ipynb"
_L04 = "notebooks/04_ppo.ipynb"
_L05 = "notebooks/05_ppo_to_grpo.ipynb"
_L06 = "notebooks/06_grpo_llm.ipynb"
_L07 = "notebooks/07_debugging_grpo.ipynb"
_L09 = "notebooks/09_grpo_diffusion.ipynb"
_L10 = "notebooks/10_efficient_attention.ipynb"

_GRPO_OBJECTIVE_06 = Demo(_L06, "## 4. The GRPO objective, and where each term is in the code")
_WRONG_TOOL_05 = Demo(_L05, "## 8. Where GRPO is the wrong tool")
_DASHBOARD_06 = Demo(_L06, "- **zero-std fraction**")
_KL_06 = Demo(_L06, "## 7. Where the KL lives")
_CRITIC_05 = Demo(_L05, "## 1. Why drop the critic")


QUESTIONS: tuple[Question, ...] = (
    # ----------------------------------------------------------------------------- RL basics
    Question(
        id="on-vs-off-policy", topic="basics", seeds=("004.A1",),
        question="Define on-policy and off-policy precisely, and give two algorithms of each kind.",
        checklist=(
            "behaviour policy (collects the data) vs target policy (the one being improved)",
            "on-policy: the update is an expectation under the current policy, so data must come from it (or very close to it)",
            "off-policy: learns the target from data of any behaviour policy (replay buffer), via Bellman backups of Q or importance weights",
            "examples: REINFORCE, A2C, TRPO, PPO, GRPO on-policy; Q-learning/DQN, DDPG/TD3, SAC off-policy",
            "trade-off: off-policy reuses data (sample-efficient) but is less stable; on-policy is simpler and stable but throws data away",
            "PPO's few epochs per batch are still on-policy: the ratio corrects a small, bounded lag",
        ),
        answer=(
            "Two policies are involved: the behaviour policy that chose the actions in the data, and the target "
            "policy we want to improve. An algorithm is on-policy when its update estimates an expectation under "
            "the current policy, so it needs fresh samples from that policy; REINFORCE's ∇log π·return, A2C, TRPO, "
            "PPO and GRPO are on-policy. It is off-policy when it can learn the target from actions some other "
            "policy took, usually because it regresses Q(s,a) on a Bellman target that does not care who chose a, "
            "or because it reweights with π/μ: DQN, DDPG, TD3 and SAC learn from a replay buffer.\n\n"
            "The property to look at is what the gradient or target is an expectation over. Off-policy methods "
            "squeeze more out of each sample but mix bootstrapping, function approximation and stale data, which "
            "makes them harder to stabilise; on-policy methods are simpler and steadier but discard each batch "
            "after use. PPO and GRPO sit on the on-policy side even with several epochs: the data is one iteration "
            "old and the clipped ratio handles that small mismatch, not an arbitrary buffer."
        ),
        demo=Demo(_L00, "## 4. On-policy vs off-policy"),
    ),
    # ----------------------------------------------------------------------------- GAE
    Question(
        id="gae", topic="gae", seeds=("004.A4",),
        question="Define the advantage function, write the GAE estimator, and explain how λ trades bias for variance.",
        checklist=(
            "A(s,a) = Q(s,a) − V(s): how much better the action is than the policy's average; V is a baseline (no bias, less variance), the standard choice though not the variance-optimal one",
            "TD residual δ_t = r_t + γ V(s_{t+1}) − V(s_t), with no bootstrap after a terminal state",
            "Â_t = Σ_l (γλ)^l δ_{t+l}, computed backwards: Â_t = δ_t + γλ Â_{t+1}",
            "λ = 0: one-step TD, low variance, biased by the critic's errors",
            "λ = 1: Monte-Carlo return minus V, unbiased, high variance",
            "in between: an exponentially weighted average of n-step estimators; γ = 0.99, λ = 0.95 typical",
            "terminated vs truncated: a time-limit cut still bootstraps from V of the final observation",
        ),
        answer=(
            "The advantage A^π(s,a) = Q^π(s,a) − V^π(s) says how much better action a is than what the policy does "
            "on average in s. Weighting ∇log π by it instead of by the return subtracts V(s), a baseline: no bias, "
            "much less variance. V is the standard baseline, not the variance-optimal one (that is a "
            "score-norm-weighted average of returns, lesson 01), but it is nearly as good and is learned anyway. "
            "GAE builds it from the TD residual δ_t = r_t + γ(1 − done_t)V(s_{t+1}) − V(s_t), which is itself "
            "a one-step advantage estimate. The k-step estimate is the sum of k discounted residuals, and GAE "
            "averages all of them with weights (1 − λ)λ^(k−1), which collapses to Â_t = Σ_l (γλ)^l δ_{t+l}; in code, "
            "one backward pass Â_t = δ_t + γλ(1 − done_t)Â_{t+1}.\n\n"
            "λ decides how far we trust sampled rewards over the critic. λ = 0 keeps only δ_t: one reward and V, so "
            "little variance, but any error in V goes straight into the gradient as bias. λ = 1 gives the discounted "
            "return minus V(s_t): V only serves as a baseline, so no bias, but the sum of many random rewards is "
            "noisy. λ ≈ 0.95 with γ = 0.99 is the usual compromise. At a time-limit truncation the last residual "
            "still bootstraps from V of the final observation, while the recursion does not cross into the next "
            "episode; only a real terminal state bootstraps nothing."
        ),
        demo=Demo(_L02, "## 3. Generalized advantage estimation"),
    ),
    Question(
        id="gamma-vs-lambda", topic="gae", seeds=("004.F2",),
        question="γ and λ both down-weight the future. How are their roles different, and why tune them separately?",
        checklist=(
            "γ is part of the objective: it defines which return is maximised (horizon ≈ 1/(1 − γ)); changing it changes the problem and possibly the optimal policy",
            "λ is part of the estimator: for a fixed γ it only trades the critic's bias against sampled-reward variance",
            "with a perfect V every λ has the same expectation; λ matters because V is wrong",
            "γ is set by how long consequences take in the task; λ by how good the critic is and how noisy the returns are",
            "γλ is the decay of the GAE sum, but the bootstrap uses γ alone",
        ),
        answer=(
            "They act on different things. γ belongs to the problem: it says which discounted return we want to "
            "maximise, with an effective horizon around 1/(1 − γ). Lower it and you change which policy is "
            "optimal; a task whose payoff comes 300 steps after the decisive action needs γ close to 1. λ belongs "
            "to the estimator: for a fixed γ it chooses how to estimate that return's advantage, mixing short "
            "bootstrapped estimates (trust V) with long sampled ones (trust rewards). If V were exact, every λ "
            "would give an unbiased advantage for the same γ; λ only matters because the critic is imperfect, and "
            "it trades the critic's bias against the variance of summed rewards.\n\n"
            "So they are tuned for different reasons: γ from the time scale of the task (and sometimes lowered a "
            "little for variance, knowingly biasing the objective), λ from how reliable the critic is. In the "
            "formula they appear as the product γλ in the decay of the residuals, but γ also enters each residual "
            "on its own through γV(s_{t+1}), which is why they are not interchangeable."
        ),
        demo=Demo(_L02, "## 7. γ vs λ: what each one controls"),
    ),
    # ----------------------------------------------------------------------------- TRPO / PPO
    Question(
        id="trpo", topic="ppo", seeds=("004.A2",),
        question="What problem does TRPO solve relative to vanilla policy gradient? State its constrained objective and how it is solved.",
        checklist=(
            "vanilla PG picks a step in parameter space; the same step can barely move or completely change the policy, so one bad step can collapse it",
            "objective: maximise E[π_θ(a|s)/π_old(a|s) · Â] subject to E_s[KL(π_old(·|s) ‖ π_θ(·|s))] ≤ δ",
            "the KL measures distance between policies (distributions), not parameters; the surrogate is only trusted near π_old",
            "linearise the objective (gradient g), quadratise the KL (Fisher F): step ∝ F⁻¹g with size √(2δ / gᵀF⁻¹g) (natural gradient)",
            "F⁻¹g by conjugate gradient with Fisher-vector products (double backprop), never forming F",
            "backtracking line search to enforce the KL bound and a real improvement",
        ),
        answer=(
            "A vanilla policy-gradient step is a fixed length in parameter space, but how much a parameter change "
            "moves the policy varies enormously from one direction and state to another: the same learning rate "
            "can be useless in one place and catastrophic in another, and a collapsed policy then collects bad "
            "data to learn from. TRPO measures the step by what it does to the policy instead.\n\n"
            "It maximises the importance-weighted surrogate L(θ) = E[(π_θ(a|s)/π_old(a|s)) Â(s,a)], whose gradient at "
            "θ_old is the policy gradient, subject to a trust region E_s[KL(π_old(·|s) ‖ π_θ(·|s))] ≤ δ. The surrogate is "
            "a good model of the true improvement only near π_old, and the KL bound says how near. To solve it, "
            "linearise L (gradient g) and take the quadratic model of the KL, ½ ΔᵀFΔ with F the Fisher matrix; the "
            "solution is the natural-gradient direction F⁻¹g scaled to √(2δ / gᵀF⁻¹g). F is never built: conjugate "
            "gradient needs only products Fv, each one a double backward pass through the KL, and about ten "
            "iterations suffice. Because the quadratic model is approximate, a backtracking line search shrinks "
            "the step until the true KL is within δ and the surrogate actually improved."
        ),
        demo=Demo(_L03, "### Key equations: linearise the objective, quadratise the constraint"),
    ),
    Question(
        id="ppo-clip", topic="ppo", seeds=("004.A3", "001.F1"),
        question="Write PPO's clipped surrogate and explain, case by case, what the clip and the min prevent. "
                 "Once the ratio is no longer 1, how does this keep training stable, and what does the clip range buy?",
        checklist=(
            "ρ = π_θ(a|s)/π_old(a|s); L = E[min(ρÂ, clip(ρ, 1 − ε, 1 + ε)Â)], maximised (the loss is −L)",
            "A > 0: gain stops at ρ = 1 + ε (zero gradient beyond); A < 0: stops at ρ = 1 − ε",
            "the min keeps the unclipped term when the ratio moved the wrong way, so bad moves are always corrected: a pessimistic lower bound of the surrogate",
            "first-order stand-in for TRPO's KL constraint: several epochs of minibatch SGD per batch",
            "the clip removes the incentive, not the movement: shared parameters can still push ratios past the range; monitor approx KL and clip fraction, early-stop",
            "ε (0.1–0.3) bounds how far each batch can move the policy: too small is slow, too large is unstable",
            "the clip bounds π_θ/π_old only: it does not remove the bias of tokens sampled by another policy (an inference engine μ ≠ π_old); an importance weight π_old/μ does",
        ),
        answer=(
            "With ρ_t = π_θ(a_t|s_t)/π_old(a_t|s_t), PPO maximises L = E[min(ρ_t Â_t, clip(ρ_t, 1 − ε, 1 + ε) Â_t)]. Case by "
            "case: if Â > 0 the objective grows with ρ until 1 + ε and is flat after that, so there is no gradient "
            "pushing a good action's probability further once it has risen by ε; if Â < 0 it is flat below 1 − ε, "
            "so a bad action is not pushed down without limit. The min matters for the other side: when the ratio "
            "has moved the harmful way (Â > 0 but ρ < 1 − ε, or Â < 0 but ρ > 1 + ε) the unclipped term is smaller, "
            "so it is kept and its full gradient pulls the policy back. The result is a lower bound on the "
            "unclipped surrogate: optimism is capped, pessimism never is.\n\n"
            "That is how PPO imitates TRPO's trust region with plain first-order steps and reuses each batch for "
            "several epochs. Once the ratio is not 1 because the weights have moved (second minibatch or epoch "
            "onward), the clip "
            "stops any single sample from dragging the policy far in the direction it already went, which is "
            "what would otherwise blow up over repeated epochs. It is not a hard constraint: the ratio of a "
            "clipped sample can still drift because the parameters are shared, so approx KL and clip fraction "
            "are monitored and training stops early when they grow. ε sets the step per batch: 0.1–0.2 is "
            "typical; too small wastes data, too large brings back instability.\n\n"
            "What the clip does not do is repair a sampler mismatch. It bounds π_θ/π_old and nothing else: if an "
            "inference engine μ that differs from π_old drew the tokens, the estimator is still an expectation "
            "under the wrong distribution, and a clip centred on π_old leaves that bias where it is. Only an "
            "importance weight π_old/μ (truncated in practice) removes it; see the truncated-IS question."
        ),
        demo=Demo(_L04, "## 2. The clip, case by case"),
    ),
    Question(
        id="ppo-replay-buffer", topic="ppo", seeds=("004.F1",),
        question="PPO and TRPO are run on-policy. What breaks if you maximise the clipped objective on a large replay "
                 "buffer of old trajectories, and how does ε interact with how stale the data is?",
        checklist=(
            "the ratio π_θ/μ corrects which actions were taken, not which states were visited; the surrogate's error grows with the gap",
            "the clip is centred on the behaviour policy μ, not on the current policy",
            "old samples whose advantage agrees with how the policy moved are clipped before the first step (dead data)",
            "samples on the other side keep an unbounded ratio: high variance and large steps",
            "a larger ε revives the data but removes the trust region; staleness spends the trust region before the update",
            "fixes: staleness of 0–1 iterations, truncated importance weights (V-trace), a decoupled proximal policy, or a real off-policy method",
        ),
        answer=(
            "Storing μ(a|s) and using ρ = π_θ/μ looks like it makes old data usable, but two things fail. First, "
            "the ratio reweights actions only: the states in the buffer were visited by older policies, and the "
            "surrogate's approximation error grows with the distance between μ and π_θ, the very distance the trust "
            "region was meant to keep small. Second, the clip interval [1 − ε, 1 + ε] is centred on μ. After many "
            "updates a good share of the old samples already sit outside it before the first gradient step: those "
            "whose advantage agrees with how the policy has moved are clipped (zero gradient, wasted), while the "
            "others take the unclipped branch of the min with an importance weight nothing bounds, which means "
            "high variance and steps in stale directions.\n\n"
            "ε and staleness pull against each other: to keep the same fraction of live samples on older data you "
            "must widen ε, but ε is the trust region, so widening it removes the protection the clip provided. "
            "Staleness consumes the trust region before the update starts. In practice one keeps the lag at one "
            "iteration or so, re-centres the clip on a recent proximal policy while correcting the behaviour "
            "mismatch separately with a truncated weight min(c, π_prox/μ) (IMPALA's V-trace idea), or switches to an "
            "off-policy method such as SAC that is built for replay."
        ),
        demo=Demo(_L04, "## 7. Stale data: what breaks when π_old is several iterations old"),
    ),
    Question(
        id="ppo-actor-critic", topic="ppo", seeds=("002.1",),
        question="Describe PPO's actor-critic set-up as used for LLM fine-tuning, and how the advantage "
                 "(reward minus value) steers the update.",
        checklist=(
            "actor = the policy π_θ(a|s); critic = V_φ(s) predicting the expected return",
            "advantage = return (or GAE) − V: positive raises the action's probability, negative lowers it",
            "worked sign example: reward 0.5 with value 0.6 gives −0.1; reward 0.8 with value 0.65 gives +0.15",
            "critic trained by regression on returns; actor by the clipped surrogate",
            "RLHF uses four models: policy, critic, frozen reference, reward model; per-token KL penalty inside the reward",
            "the critic must predict success from every prefix: hard, costly, and a biased critic biases the gradient",
        ),
        answer=(
            "PPO trains two networks. The actor is the policy π_θ(a|s); for an LLM, the next-token distribution. "
            "The critic V_φ(s) predicts the expected return from state s; in RLHF it is usually a copy of the "
            "reward model with a scalar head, about as large as the policy. After a rollout, each action gets an "
            "advantage Â = (observed return or GAE estimate) − V(s). Its sign is the instruction: a reply scored 0.8 "
            "where the critic expected 0.65 gets +0.15 and becomes more likely; one scored 0.5 against an "
            "expectation of 0.6 gets −0.1 and becomes less likely, even though its reward is positive. The actor "
            "is updated with the clipped surrogate, the critic by regressing V onto the returns.\n\n"
            "In the InstructGPT-style pipeline four models are in memory: the trained policy and critic, a frozen "
            "reference (the SFT model) and the reward model; a per-token penalty −β log(π/π_ref) is added to the "
            "reward so the KL is part of the return the critic predicts. The cost of the critic is not only "
            "memory: with a single reward at the end of a completion, V must forecast success from every prefix, a "
            "moving target learned from one number per sample, and with λ < 1 its mistakes bias the gradient. "
            "That is what GRPO removes."
        ),
        demo=Demo(_L04, "## 3. The algorithm"),
    ),
    # ----------------------------------------------------------------------------- GRPO
    Question(
        id="grpo-vs-ppo", topic="grpo", seeds=("003.Q1", "002.3"),
        question="What is GRPO, how does it differ from PPO, and why do many LLM recipes prefer it?",
        checklist=(
            "same skeleton as PPO: importance ratio, clipped surrogate, KL to a frozen reference",
            "no critic: the baseline is the mean reward of G completions of the same prompt; optionally divided by the group's std",
            "one advantage per completion, shared by all its tokens (outcome reward), instead of per-token GAE",
            "KL as a separate per-token loss term (k3) rather than inside the reward",
            "why preferred: saves a policy-sized trained network; the critic is hard to learn from one end-of-sequence reward; sampling G completions of a prompt is cheap; verifiable rewards (math, code)",
            "what is lost: per-token credit assignment, signal on all-equal groups, G× generation cost",
            "GRPO removes the critic, not the reward model: DeepSeekMath's GRPO was trained on a learned reward model's scores; rule-based verifiers are a separate choice",
        ),
        answer=(
            "GRPO (Group Relative Policy Optimization, from DeepSeekMath) keeps PPO's machinery, the ratio to the "
            "sampling policy, the clipped surrogate and a KL leash to a frozen reference, and replaces the learned "
            "critic with a measurement. For every prompt it samples a group of G completions, scores each one, "
            "and sets Â_i = (r_i − mean(r)) / (std(r) + eps). That advantage is a single number for the whole "
            "completion and every token of it shares it, whereas PPO gives each token its own GAE estimate from a "
            "value network. GRPO also moves the KL out of the reward into the loss, as a per-token k3 term.\n\n"
            "The reasons it spread for LLMs: the critic in RLHF-PPO is a second model of the policy's size with its "
            "own optimizer state and backward pass; with a single end-of-sequence reward it must predict success "
            "from every prefix, which is about as hard as the task and easy to get wrong; and an LLM can generate "
            "several completions of one prompt cheaply, in one batch with a shared prompt. With verifiable rewards "
            "(a checker for math answers or unit tests for code) the group mean is a cheap, always up-to-date "
            "baseline. What it gives up: credit for individual tokens or steps, any signal from groups whose "
            "rewards are all equal, and G samples per prompt.\n\n"
            "One claim to correct if you hear it (the “GRPO in depth” question set's pipeline table makes it): GRPO does "
            "not remove the reward model. It removes the value model. DeepSeekMath's GRPO was trained on the scores "
            "of a learned reward model; using a rule-based verifier instead, as R1-Zero did, is a separate choice "
            "of reward that works with PPO just as well."
        ),
        demo=_CRITIC_05,
    ),
    Question(
        id="group-advantage-example", topic="grpo", seeds=("002.2",),
        question="Three completions of one prompt score 85, 92 and 70. Compute the GRPO advantages and say what "
                 "each one does to its completion.",
        checklist=(
            "group mean 82.33; centred values +2.67, +9.67, −12.33",
            "sample std (÷ (G − 1)) 11.24 → advantages +0.24, +0.86, −1.10; population std 9.18 → +0.29, +1.05, −1.34",
            "state which std convention you use; eps added to the std avoids 0/0",
            "positive advantages push those completions up, the negative one down; all tokens of a completion share its value",
            "only differences within the group matter: adding a constant to all three changes nothing",
        ),
        answer=(
            "The baseline is the group's mean, (85 + 92 + 70)/3 = 82.33, so the centred rewards are +2.67, +9.67 and "
            "−12.33. GRPO then divides by the group's standard deviation. With the sample std (divide by G − 1, what "
            "torch.std and most trainers use) that is √((2.67² + 9.67² + 12.33²)/2) = 11.24, giving +0.24, +0.86 "
            "and −1.10; with the population std (divide by G, numpy's default) it is 9.18 and the advantages are "
            "+0.29, +1.05 and −1.34. Say which one you use: the ranking and signs are identical, only the scale "
            "changes, and an eps is added to the std so an all-equal group gives 0 rather than 0/0.\n\n"
            "The first two completions were better than their siblings and are reinforced, the 92 most; the 70 is "
            "pushed down. Every token of a completion is multiplied by the same advantage. Note that the absolute "
            "numbers never matter: 185, 192, 170 would give exactly the same advantages, which is both the point "
            "(no reward scale to tune, no critic) and a limitation (a group of three mediocre answers still gets "
            "one answer promoted).\n\n"
            "The “PPO vs GRPO” guide this example comes from stops at the centred values +2.67, +9.67, −12.33 and "
            "calls them GRPO's advantages. That is mean-centring only, the variant Dr. GRPO recommends; the GRPO of "
            "DeepSeekMath also divides by the group's std. Say which one you compute."
        ),
        demo=Demo(_L05, "## 3. A worked example: rewards 85, 92, 70"),
    ),
    Question(
        id="group-normalisation", topic="grpo", seeds=("003.Q2",),
        question="Why does GRPO normalise rewards within each group? What does the division by the std add beyond "
                 "the mean, and what changes if you remove it?",
        checklist=(
            "subtracting the group mean = a per-prompt baseline: a Monte-Carlo estimate of V(prompt), no critic, no bias from a wrong critic",
            "the prompt's difficulty is removed: an easy prompt's answers are compared with each other, not with a hard prompt's",
            "dividing by the std makes each mixed group's update the same size whatever the reward scale",
            "cost: difficulty bias: groups with a small std (almost all right or almost all wrong) are up-weighted; at p = 0.02 a prompt weighs 1.4× a p = 0.5 prompt at G = 8 and 2.4× at G = 32 (1/√(p(1 − p)), 3.6×, only as G → ∞)",
            "removing it (Dr. GRPO, scale='none' or batch std) keeps the baseline and drops that weighting",
        ),
        answer=(
            "The mean and the std do different jobs. Subtracting the group's mean reward gives each completion a "
            "baseline computed from other answers to the same prompt: a Monte-Carlo estimate of how well the "
            "current policy does on that prompt. That removes the prompt's difficulty from the signal (a right "
            "answer to an easy prompt is not worth more than one to a hard prompt just because easy prompts score "
            "higher), cuts variance the way a critic would, and costs no parameters, with no stale or biased value "
            "network.\n\n"
            "Dividing by the group's std then rescales every group whose answers differ to unit spread. That makes "
            "the update independent of the reward's units and gives every informative prompt a similar weight. "
            "But it is not neutral. With a 0/1 reward the std is about √(p(1 − p)): 0.14 for a prompt solved 2% of "
            "the time, 0.5 for one solved half the time. Per answer, that makes the rare success large and the "
            "failures small: in a group of 50 with one success (the expected count at p = 0.02) the success gets "
            "+6.9 and each failure −0.14. What the update feels is the prompt's total weight w_G(p), the expected "
            "advantage of a success minus that of a failure (lesson 05, §4a). Relative to a p = 0.5 prompt it is "
            "1.4× at G = 8 and 2.4× at G = 32 for p = 0.02, and never more than 1.4× and 2.8× at any p; the "
            "ratio 1/√(p(1 − p)) against 2, about 3.6× at p = 0.02, is only reached as G → ∞. A difficulty "
            "weighting, then, "
            "and with noisy rewards an amplifier of tiny differences. Dr. GRPO argues for dropping it (mean-centring "
            "only, or one std for the whole batch); the baseline, which does the real variance reduction, stays.\n\n"
            "Note what normalisation is not: a ranking. Advantages stay proportional to reward differences, so "
            "rewards 85, 92, 70 and 71, 92, 70 rank the three answers the same way, yet the middle answer gets "
            "+0.24 in the first group and −0.54 in the second: pushed up in one, down in the other. A write-up that says GRPO \"focuses on relative ranking\" (the “GRPO in depth” question "
            "set does) describes a different method."
        ),
        demo=Demo(_L05, "### 4a. The std creates a difficulty bias"),
    ),
    Question(
        id="all-equal-group", topic="grpo", seeds=("003.Q3", "001.F2"),
        question="All completions of a group get the same reward. What advantage do they get, should the group be "
                 "skipped or left in with zero gradient, and what numerical safeguard avoids a division by zero?",
        checklist=(
            "every r_i − mean is exactly 0, so every advantage is 0: no policy-gradient signal from that prompt",
            "std is 0: compute (r − mean)/(std + eps) or set the advantage to 0 where std is 0; never let a NaN through (it poisons the whole batch)",
            "the KL term (if in the loss) still gives those tokens a gradient",
            "left in, the group dilutes a token-mean loss (its tokens count in the denominator); filtering it keeps the effective batch honest (DAPO dynamic sampling refills with mixed groups)",
            "monitor the zero-std fraction: high means prompts too easy or too hard, or collapsed entropy",
        ),
        answer=(
            "If all G rewards are equal, every reward equals the mean, so every advantage is exactly zero: the group "
            "says nothing about which answer was better, and its policy-gradient contribution vanishes. The danger "
            "is numerical: the std is also zero, and 0/0 gives NaN, which spreads through the loss to every "
            "parameter. The usual guard is to add a small eps to the standard deviation, (r − mean)/(std + eps), so "
            "the result is 0/eps = 0 exactly; computing the mean-centred value first and masking std == 0 works as "
            "well. Adding eps inside the square root of the variance also avoids the NaN but distorts small-spread "
            "groups more.\n\n"
            "Skip or keep? Mathematically the group adds nothing to the policy gradient (only the KL term, if it "
            "sits in the loss, still acts on its tokens). Practically, keeping it lowers the effective batch: with a "
            "token-mean loss its tokens enter the denominator and shrink everyone else's gradient, and a batch "
            "that is mostly such groups learns slowly. Filtering them, and oversampling prompts to refill the batch "
            "with mixed groups as DAPO's dynamic sampling does, keeps each step informative. Either way, log the "
            "share of zero-std groups: rising towards 1 means the prompts are too easy or too hard for the policy, "
            "or its entropy has collapsed."
        ),
        demo=Demo(_L05, "## 5. All-equal groups: zero advantage, and no NaN"),
    ),
    Question(
        id="grpo-step", topic="grpo", seeds=("001.1", "003.Q4"),
        question="Walk through one GRPO training step end to end, from sampling prompts to the optimizer step. "
                 "Label what is frozen at rollout time and what moves during the update.",
        checklist=(
            "sample a batch of prompts; generate G completions each with the current weights (π_old), at the training temperature",
            "record per-token log-probs under π_old and the completion mask (first EOS kept, padding dropped)",
            "score each completion: one scalar reward (verifier or reward model)",
            "advantage per completion (r − group mean)/(group std + eps), broadcast to its tokens, no gradient through it",
            "reference log-probs from the frozen π_ref if β > 0",
            "update: recompute log-probs with θ, ratio per token, clipped surrogate + β·k3, masked aggregation, backward, clip grad norm, optimizer step; μ times or over minibatches",
            "frozen: prompts, tokens, rewards, advantages, old and reference log-probs; moving: θ, new log-probs, ratio",
            "with μ = 1 the ratio is exactly 1 and the gradient is REINFORCE with a group baseline",
        ),
        answer=(
            "1. Sample B prompts. 2. With the current weights (this snapshot is π_old) generate G completions per "
            "prompt at the training temperature, and keep the token ids, the per-token log-probs of the sampled "
            "tokens and a completion mask that includes the first EOS and excludes padding. 3. Score each "
            "completion with the reward function: one scalar each. 4. Reshape the rewards to [B, G] and compute "
            "Â = (r − group mean) / (group std + eps); each completion's advantage is copied to all its tokens and "
            "treated as a constant. 5. If β > 0, run the frozen reference model once to get log π_ref for the same "
            "tokens.\n\n"
            "6. The update: for μ passes (or over minibatches) recompute log π_θ of the sampled tokens, form "
            "ρ = exp(log π_θ − log π_old) per token, the per-token loss −min(ρÂ, clip(ρ, 1 − ε, 1 + ε)Â) + β·k3(π_θ, π_ref), "
            "average it over the masked tokens, backpropagate, clip the gradient norm and step the optimizer.\n\n"
            "Frozen since the rollout: prompts, completions, rewards, advantages, old log-probs, reference "
            "log-probs. Moving: θ and therefore the new log-probs and the ratios. On the first minibatch ρ = 1 "
            "exactly; with μ = 1 it stays 1, the clip never acts, and the step is REINFORCE with the group "
            "baseline. The defining choice is where the baseline comes from (the group, not a critic), plus "
            "the std scaling."
        ),
        demo=_GRPO_OBJECTIVE_06,
    ),
    Question(
        id="group-size", topic="grpo", seeds=("002.5", "003.Q5"),
        question="How do you choose the group size G, and what are the trade-offs?",
        checklist=(
            "G samples estimate the prompt's baseline: larger G, better baseline, lower variance",
            "with 0/1 rewards a group is informative only if mixed: P(mixed) = 1 − p^G − (1 − p)^G; small G wastes hard and easy prompts",
            "cost grows linearly in G (generation dominates); at a fixed sample budget G trades against prompts per batch",
            "typical 4–16 (8 a common start; DeepSeekMath used 64); noisier rewards want larger G",
            "monitor the zero-std fraction and within-group reward std; raise G when most groups are all-equal",
        ),
        answer=(
            "G is how many samples estimate each prompt's baseline, so it is a variance-versus-cost knob. More "
            "samples give a better group mean (with G = 2 the baseline is just the other answer) and a more "
            "reliable std. With a pass/fail reward there is a sharper effect: a group teaches something only if it "
            "contains both a success and a failure, which happens with probability 1 − p^G − (1 − p)^G. For a prompt "
            "solved 10% of the time that is 34% at G = 4 and 81% at G = 16; small groups waste exactly the hard "
            "prompts one wants to learn.\n\n"
            "On the other side, generation is the expensive part of a step and it grows linearly with G, and at a "
            "fixed number of samples per step a larger G means fewer distinct prompts, so the gradient covers "
            "less of the data. Common values are 4 to 16, with 8 a reasonable start (DeepSeekMath used 64). Raise "
            "G when rewards are noisy or sparse, or when the dashboard shows most groups all-equal; lower it when "
            "compute-bound and most groups are already mixed. (\"k = 4–8 is typical\", as the “PPO vs GRPO” guide "
            "says, is dated: DeepSeekMath sampled 64 per question, and recent recipes commonly use 8–16 or more.)"
        ),
        demo=Demo(_L05, "## 7. Group size: a trade-off, measured"),
    ),
    Question(
        id="reference-policy", topic="grpo", seeds=("003.Q6",),
        question="What is the role of the reference policy π_ref in GRPO, and how is it different from π_old?",
        checklist=(
            "π_ref is a frozen copy of the starting (SFT) model; π_old is the policy that sampled this batch and changes every step",
            "β·KL(π_θ ‖ π_ref) is a leash: limits reward hacking and drift into regions the reward model never saw",
            "preserves fluency and general skills, slows the entropy collapse",
            "π_old serves the trust region of one update; π_ref anchors the whole run",
            "β trade-off: too small drifts, too large stalls; with exact verifiable rewards many recipes use β = 0 and drop the model (memory)",
        ),
        answer=(
            "π_ref is a frozen copy of the model RL starts from, usually the SFT checkpoint, and β·KL(π_θ ‖ π_ref) in "
            "the objective keeps the trained policy from wandering far from it. It limits reward hacking (a "
            "learned reward model is only accurate near the data it was trained on, and the KL keeps the policy "
            "there), protects fluency and abilities the reward does not measure, and slows the collapse of the "
            "distribution onto a few outputs. Do not confuse it with π_old: π_old is the policy that generated "
            "the current batch, refreshed every step, and only defines the ratio and the clip of one update; π_ref "
            "never moves and anchors the whole run.\n\n"
            "β is a dial between those forces: too small and the policy drifts or exploits the reward, too large "
            "and it cannot move away from the SFT model. With an exact verifier (math answers, unit tests) there is "
            "little to hack, and several recent recipes set β = 0, which also frees the memory and forward pass of "
            "the reference model. The KL itself is estimated per token from samples, usually with k3 = r − 1 − log r, "
            "r = π_ref/π_θ."
        ),
        demo=_KL_06,
    ),
    Question(
        id="kl-placement", topic="grpo", seeds=("001.F5",),
        question="Where should the KL-to-reference term live, folded into the reward or as a separate loss, and what "
                 "are the trade-offs?",
        checklist=(
            "in the reward (PPO-RLHF): per-token −β log(π/π_ref) becomes part of the return; a critic assigns the credit; the policy optimises the KL-regularised objective",
            "in the loss (GRPO): β·k3 per token, differentiated directly; the advantage stays a pure task-reward comparison",
            "in GRPO the reward version would mix the KL into the group normalisation and be rescaled by each group's std",
            "the direct loss has lower-variance gradients; the reward version reaches the policy only through Â∇log π",
            "k3 as a loss: ∇k3 = (1 − r)∇log π_θ with r = π_ref/π_θ; its expectation under π_θ is ∇KL(π_ref ‖ π_θ), the reverse direction of the objective's KL: still a pull towards π_ref, zero at π_θ = π_ref",
            "k1 = log π_θ − log π_ref as a loss has zero expected gradient (E[∇log π_θ] = 0): noise, no pull; the “GRPO in depth” set's pseudocode does exactly that; k1 belongs in the reward, detached",
            "after the first inner step the tokens come from π_old, not π_θ: without an importance weight π_θ/π_old the estimate is biased; the loss version also ignores a token's effect on later tokens' KL",
        ),
        answer=(
            "Both are used. In PPO-RLHF the penalty sits in the reward: each token gets −β log(π_θ/π_ref), the final "
            "token also gets the reward model's score, and the critic with GAE turns that into advantages. The KL "
            "is then part of the return, so the policy optimises the KL-regularised objective properly, including "
            "how a token changes the KL of later tokens, but the penalty reaches the weights only through the "
            "noisy Â∇log π estimator, and a critic is needed to spread it over tokens.\n\n"
            "GRPO puts β·k3 per token directly in the loss. The advantage then stays a clean comparison of task "
            "rewards; if the KL were in the reward it would enter the group mean and be divided by each group's "
            "std, a penalty scaled differently in every group. The direct term's gradient has much lower variance "
            "and needs no critic. Its price lies in what the gradient of a sampled estimate really is. With "
            "r = π_ref/π_θ, k3 = r − 1 − log r has gradient (1 − r)∇log π_θ, and its expectation over tokens drawn "
            "from π_θ is ∇KL(π_ref ‖ π_θ): the reverse direction of the KL(π_θ ‖ π_ref) written in the objective. It "
            "still pulls towards the reference and vanishes at π_θ = π_ref, so it is a fine leash, but say which "
            "divergence it follows. The naive choice is worse: k1 = log π_θ − log π_ref used as a loss has gradient "
            "∇log π_θ, whose expectation is exactly zero, so the penalty adds noise and no pull. The pseudocode of "
            "the “GRPO in depth” question set (kl_div = logp_new − logp_ref; loss += β·mean(kl_div)) does exactly that "
            "without a word of warning; k1 belongs in the reward, detached, where it acts through Â∇log π.\n\n"
            "Two more caveats. After the first inner step the tokens were sampled by π_old, not π_θ, so without an "
            "importance weight π_θ/π_old the estimate and its gradient are biased. And a per-token loss sees only "
            "the local divergence, not a token's effect on the KL of the tokens after it. Both matter little while "
            "the policy stays close to π_old and π_ref, which is the regime the penalty is for."
        ),
        demo=_KL_06,
    ),
    Question(
        id="exploration", topic="grpo", seeds=("003.Q7",),
        question="How does GRPO handle exploration versus exploitation?",
        checklist=(
            "only exploration: sampling the policy's own distribution (temperature, top-p); no bonus, no off-policy data",
            "it can reinforce only what it already samples: prompts never solved give all-wrong groups and no signal",
            "GRPO sharpens: entropy falls, pass@1 rises while pass@k at large k can drop (measured)",
            "levers: sampling temperature, larger G, clip-higher (larger upper ε lets rare tokens grow), KL to a higher-entropy reference, entropy bonus with care, prompt curriculum, better SFT",
            "watch entropy and zero-std fraction",
        ),
        answer=(
            "GRPO explores only by sampling its own policy: the temperature and the G independent completions "
            "per prompt are the whole exploration mechanism. It has no exploration bonus and, being on-policy, "
            "no outside data. That has a sharp consequence: it can only promote answers it already produces with "
            "some probability. A prompt the model never solves gives an all-wrong group, zero advantage and no "
            "gradient, so it stays unsolved.\n\n"
            "In practice GRPO exploits: it moves probability onto answers that worked, entropy drops, pass@1 goes "
            "up, and pass@k for large k can end lower than the starting model's because diversity was spent. The "
            "levers are a training temperature around 1, larger groups (more chances of one success on a hard "
            "prompt), an asymmetric clip with a higher upper bound so low-probability tokens can grow faster "
            "(DAPO), a KL to the more diverse reference, a small entropy bonus if collapse is fast, and a "
            "curriculum that keeps prompts at a difficulty where groups are mixed. Entropy and the zero-std "
            "fraction on the dashboard tell you when exploration is running out."
        ),
        demo=Demo(_L06, "## 10. GRPO vs best-of-N"),
    ),
    Question(
        id="debug-not-improving", topic="grpo", seeds=("003.Q8",),
        question="Your GRPO run is not improving. How do you debug it?",
        checklist=(
            "check invariants before hyperparameters: ratio exactly 1 on the first minibatch, KL 0 at step 0, sampler-trainer log-prob gap tiny",
            "rewards: inspect samples by hand, reward distribution, share of all-equal (zero-std) groups",
            "advantages: zero mean per group, no NaN, right sign, detached; each group is the same prompt",
            "the gradient reaches the weights: grad norm non-zero, parameters change, loss sign right",
            "alignment and masks: logits at t score token t + 1; padding excluded, first EOS included",
            "overfit one prompt; compare with best-of-N of the starting model; then tune lr, β, ε, G, temperature",
        ),
        answer=(
            "First rule out bugs, because a broken loop looks exactly like a bad hyperparameter. With the "
            "current weights and no update, the recomputed log-probs should match the sampler's (ratio 1 up to "
            "float noise) and the KL to the reference should be 0 at step 0; a large gap means wrong alignment, "
            "temperature or mask. Then look at the reward: read a few high- and low-scored samples, plot the "
            "reward distribution, and log the fraction of groups whose rewards are all equal; if nearly every "
            "group is all-wrong or all-right there is simply no signal (prompts too hard or easy, G too small, "
            "temperature too low).\n\n"
            "Next the advantages: per-group mean zero, no NaN, positive for the better answers, detached, and "
            "grouped by the right prompt (a reshape with the wrong layout silently compares answers to different "
            "prompts). Check the gradient actually flows: non-zero grad norm, parameters changing, the loss with "
            "the right sign. Then make the problem trivially small: a single prompt repeated must be learned in a "
            "few dozen steps. Only then tune: learning rate, β (KL stuck at 0 with β > 0 means nothing moves, a "
            "large KL means too much), clip fraction, G and temperature, and compare against best-of-N of the "
            "starting model to know what is achievable."
        ),
        demo=Demo(_L07, "## 3. Detections: one invariant each"),
    ),
    Question(
        id="memory", topic="grpo", seeds=("003.Q9",),
        question="What are the memory requirements of GRPO training, and how do they compare with PPO?",
        checklist=(
            "trained policy: weights + gradients + Adam moments (+ fp32 master): about 16 bytes per parameter in mixed precision",
            "frozen reference: weights only (~2 bytes/param), forward only; absent if β = 0; can be offloaded or be the base model with LoRA adapters disabled",
            "no critic: PPO adds a second trained model of similar size (another ~16 bytes/param) plus its activations",
            "old and reference log-probs: one float per generated token, not a copy of the old weights",
            "activations ∝ batch × G × sequence length × hidden × layers (gradient checkpointing); logits B·T·V in fp32 are large (chunk the log-softmax)",
            "generation KV cache: 2 · layers · KV heads · head dim · tokens · bytes",
        ),
        answer=(
            "The trained policy dominates: in mixed precision each parameter costs about 16 bytes (bf16 weights and "
            "gradients, an fp32 master copy and two fp32 Adam moments), roughly 110 GB for a 7B model before "
            "sharding. The reference model is frozen and needs weights only, about 2 bytes per parameter and a "
            "forward pass; it can be offloaded, shared with the policy when training LoRA adapters (disable the "
            "adapters to get π_ref), or dropped with β = 0. π_old costs no weights: its log-probs are recorded "
            "per token at sampling time. PPO would add a critic of similar size, trained, so another full set of "
            "optimizer state and activations; that is GRPO's main saving.\n\n"
            "The variable part is activations and generation. Activations scale with prompts × G × sequence length "
            "× hidden size × layers, so long completions and large groups are what run out of memory; gradient "
            "checkpointing and micro-batches help. The logits tensor, batch × length × vocabulary in fp32, is "
            "often the largest single tensor, so compute the log-softmax of the chosen tokens in chunks. During "
            "generation the KV cache takes 2 · layers · KV heads · head dim · tokens · bytes per element.\n\n"
            "Two corrections to the usual checklist (the “GRPO in depth” question set lists both): π_old needs no "
            "stored logits, only one log-prob per sampled token, since a [batch, length, vocabulary] tensor would "
            "be the largest thing in memory; and dropping the critic does not halve memory. It removes one "
            "trained model's state, while the frozen reference, the reward model, and the activations and KV "
            "cache of G completions per prompt remain."
        ),
        demo=Demo(_L10, "**Q9. Why does the KV cache matter so much for GRPO training in particular?**"),
    ),
    Question(
        id="implement-grpo", topic="grpo", seeds=("003.Q10",),
        question="How would you implement GRPO from scratch? Name the key components and the details that are easy to get wrong.",
        checklist=(
            "sampler: G completions per prompt, record token ids, sampler log-probs and completion masks",
            "reward function(s) and group advantages with a stated std convention and eps",
            "log-prob function: logits at t score token t + 1, same temperature as sampling, masked",
            "loss: per-token ratio, clip, k3 KL, an explicit aggregation (token mean, per-sequence mean or a constant normaliser)",
            "frozen reference in eval mode; old log-probs detached; gradient clipping",
            "tests: ratio 1 with μ = 1, KL 0 at step 0, all-equal group gives zero gradient, tokens after EOS inert, reward rises on a toy task",
            "not β·mean(logp − ref_logp) in the loss (the “GRPO in depth” set's pseudocode): k1 as a loss has zero expected gradient; use per-token k3",
            "a dashboard: reward, zero-std fraction, entropy, length, clip fraction, KL, grad norm, sampler-trainer gap",
        ),
        answer=(
            "Components: (1) a sampler that generates G completions for each prompt in one batch (KV cache, "
            "temperature) and returns the token ids, the log-prob of each sampled token and a completion mask built "
            "by position, keeping the first EOS; (2) reward functions returning one float per completion; (3) group "
            "advantages with a stated std convention and an eps; (4) a log-prob function where the logits at "
            "position t score token t + 1, divided by the same temperature the sampler used; (5) the loss: ratio, "
            "clipped surrogate, β·k3 against a frozen reference kept in eval mode, and an explicit choice of how to "
            "average over tokens; (6) the optimizer step with gradient clipping, repeated μ times per batch.\n\n"
            "The details that break silently: an off-by-one in the alignment, padding counted or the EOS dropped "
            "when pad == eos, grouping the rewards with the wrong layout, advantages that carry gradient, old "
            "log-probs recomputed after the step (the ratio is then always 1), and a reference model that shares "
            "weights with the policy (the KL is then always 0). Each has a cheap test: ratio 1 with μ = 1, KL 0 at "
            "step 0, zero gradient from an all-equal group, tokens after EOS that do not affect the loss, and a "
            "reward that rises on a toy task. Finally a dashboard, because GRPO problems show up as trends.\n\n"
            "One trap comes straight from a popular write-up (the “GRPO in depth” question set): its pseudocode adds "
            "β·mean(logp_new − logp_ref) to the loss. That is the k1 estimator used as a loss, and its gradient, "
            "∇log π_θ, has expectation zero: the KL term adds noise and never pulls towards the reference. Use "
            "k3 = r − 1 − log r per token with r = π_ref/π_θ (lesson 06, §7), or put k1 into the reward, detached."
        ),
        demo=_GRPO_OBJECTIVE_06,
    ),
    Question(
        id="preference-data", topic="alignment", seeds=("003.Q11",),
        question="Can GRPO work with preference data (A is better than B) instead of absolute rewards?",
        checklist=(
            "GRPO needs a scalar per completion; a fixed dataset of pairs gives neither scalars nor on-policy samples",
            "route 1: fit a reward model on the pairs (Bradley-Terry, P(A ≻ B) = σ(r_A − r_B)), then run GRPO on its scores",
            "route 2: a pairwise judge inside each group, reward = win rate against the siblings (only relative values matter to GRPO anyway)",
            "route 3: optimise the pairs directly offline with DPO or IPO",
            "a learned reward model invites reward hacking: keep the KL, monitor held-out preference accuracy",
            "group normalisation does not need absolute rewards: adding a constant (and, with the std, any positive scale) leaves the advantages unchanged; only differences within a group matter",
        ),
        answer=(
            "Not directly. GRPO needs one number per completion of the current policy, while preference data is a "
            "fixed set of comparisons between answers some other model wrote. There are three sensible routes. "
            "The standard one is to fit a reward model on the pairs with the Bradley-Terry model, P(A ≻ B) = "
            "σ(r(A) − r(B)), and use its score as GRPO's reward. Because GRPO only uses differences within a group, "
            "the arbitrary offset of a Bradley-Terry score does not matter.\n\n"
            "A second route fits GRPO's group structure well: score each completion by comparing it with its "
            "siblings using a pairwise judge (a preference model or an LLM judge) and use its win rate as the "
            "reward. One often-repeated claim is wrong here (the “GRPO in depth” question set makes it): group "
            "normalisation does not require absolute rewards. Subtracting the group mean removes any constant "
            "offset and dividing by the group std removes any positive scale, so rewards r and a·r + b (a > 0) give "
            "identical advantages; what GRPO needs is one comparable number per completion of the current policy. "
            "The third route is to skip RL and optimise the pairs offline with DPO. With a learned judge, reward "
            "hacking becomes the main risk, so keep the KL to the reference, check the judge on held-out pairs, and "
            "read samples."
        ),
        demo=Demo(_L09, "## 11. Reward hacking"),
    ),
    Question(
        id="grpo-vs-dpo", topic="alignment", seeds=("003.Q12",),
        question="Compare GRPO with DPO.",
        checklist=(
            "DPO: offline, a fixed dataset of preference pairs, a classification-like loss on log-ratios to the reference; no sampling, no reward model",
            "DPO's loss comes from the closed-form optimum of the KL-regularised reward objective",
            "GRPO: online, samples from the current policy, needs a scalar reward (often a verifier), explicit KL term",
            "DPO is cheap and stable but limited to its data's distribution; GRPO explores and can exceed its data but pays for generation",
            "choose DPO for human preference pairs, GRPO for verifiable tasks; online/iterative DPO sits between",
        ),
        answer=(
            "Both target the same KL-regularised objective (maximise reward, stay close to π_ref) from opposite "
            "ends. DPO notices that the optimum of that objective can be written in closed form, so the reward can "
            "be expressed through log π/π_ref; plugging that into a Bradley-Terry likelihood gives a loss on "
            "preference pairs, −log σ(β[log π/π_ref(chosen) − log π/π_ref(rejected)]). It is offline: no sampling, no "
            "reward model, no RL loop, just supervised passes over a fixed dataset. That makes it cheap and stable, "
            "but it only sees answers someone else generated, and it needs pairs.\n\n"
            "GRPO is online RL: it samples from the current policy, scores with a scalar reward, often a program "
            "that checks the answer, and updates with a clipped ratio and a KL term. It costs generation at every "
            "step, but it learns from its own mistakes and can go beyond the data. Rule of thumb: human preference "
            "pairs and a tight budget, DPO; a verifiable reward such as maths or code, GRPO. Iterative or online "
            "DPO, which regenerates pairs from the current policy, sits in between."
        ),
        demo=_WRONG_TOOL_05,
    ),
    Question(
        id="multi-turn", topic="alignment", seeds=("003.Q13",),
        question="What would you change to use GRPO on a multi-turn dialogue or agent task?",
        checklist=(
            "a group must start from the same state: G rollouts of the whole conversation from the same context (needs a resettable user/environment simulator)",
            "credit assignment: one trajectory-level advantage blurs good and bad turns; per-turn rewards normalised across the group at the same turn, or a critic/GAE for long horizons",
            "mask every token the policy did not generate (user, tool, environment) out of the loss and KL",
            "long contexts: memory and truncation; decide how truncated episodes are scored",
            "reward design: final outcome plus per-turn shaping; beware hacking of shaped rewards",
        ),
        answer=(
            "The unit of a group becomes a whole interaction: G rollouts that start from the same conversation "
            "state and continue for several turns, which requires a user or environment simulator that can be "
            "reset to that state and is itself stochastic or fixed. The reward can be the final outcome (task "
            "solved) plus optional per-turn terms, and that is where GRPO's weakness shows: one advantage for the "
            "whole trajectory credits a bad turn and a good one alike. Remedies are per-turn advantages "
            "(normalise the turn-k rewards across the group, sum the ones that follow), or reintroducing a "
            "critic with GAE when episodes are long.\n\n"
            "Implementation changes: only tokens the policy generated may enter the loss, the ratio and the KL, "
            "so user messages and tool outputs get mask 0; contexts grow quickly, so watch memory, cache the "
            "shared prefix, and decide how a conversation cut at the context limit is scored (truncated, not "
            "failed, if the outcome is unknown). Smaller G is often forced by the cost of each rollout."
        ),
        demo=Demo(_L02, "## 5. Experiment: bias and variance of GAE, measured"),
    ),
    Question(
        id="continual-learning", topic="alignment", seeds=("003.Q14",),
        question="How would you adapt GRPO for continual or lifelong learning over a sequence of tasks?",
        checklist=(
            "risks: forgetting earlier tasks, reward scales differing between tasks, the reference going stale",
            "mix prompts from earlier tasks into each batch (completions are regenerated, so it stays on-policy)",
            "per-prompt group normalisation already absorbs reward-scale differences between tasks",
            "KL to a reference: keep the original as an anchor, or refresh it to a recent checkpoint (stability vs flexibility); per-task β",
            "evaluate every task's held-out set throughout; parameter-efficient adapters per task; lower learning rates",
        ),
        answer=(
            "Three things go wrong when tasks arrive one after another: the policy forgets earlier tasks, the tasks' "
            "rewards live on different scales, and the fixed reference becomes an old model that anchors the policy "
            "to the wrong place. GRPO helps with the second for free: advantages are normalised per prompt, so a "
            "task whose rewards run from 0 to 100 does not drown one scored 0/1.\n\n"
            "Against forgetting, keep a pool of prompts from earlier tasks and mix them into every batch. Because "
            "completions are generated fresh, this replays prompts, not old samples, and stays on-policy. Keep the KL "
            "to a reference as a stabiliser and choose deliberately which reference: the original model protects "
            "old skills but resists new ones, so a common compromise is to refresh it to a recent good checkpoint "
            "after each task and use a larger β where retention matters. Add per-task adapters (LoRA) if tasks "
            "conflict, lower learning rates, and track held-out scores of every past task so forgetting is seen "
            "when it starts."
        ),
        demo=Demo(_L09, "**The KL to the base model, measured.**"),
    ),
    Question(
        id="failure-modes", topic="grpo", seeds=("003.Q15",),
        question="What are GRPO's failure modes, and how do you detect each one?",
        checklist=(
            "reward hacking: reward up while held-out or human evaluation goes down; read samples, tighten the reward, keep the KL",
            "entropy / mode collapse: entropy towards 0, zero-std fraction rising, pass@k falling",
            "length drift: completion length trending (aggregation bias), format reward falling",
            "KL blow-up: sudden jump in KL to the reference; lower lr or raise β",
            "instability: grad-norm spikes, clip fraction and max ratio large, NaN; lower lr, clip gradients, check eps",
            "no signal: most groups all-equal, flat reward; fix prompt difficulty, G, temperature, or a bug",
            "sampler-trainer mismatch: log-prob gap large, ratio ≠ 1 on the first minibatch",
        ),
        answer=(
            "Each failure has a signature on a well-built dashboard. Reward hacking: the training reward climbs "
            "while held-out accuracy or human judgement does not; read top-scored samples, harden the reward, keep "
            "a KL. Entropy or mode collapse: entropy heads to zero, completions look alike, the zero-std fraction "
            "rises and pass@k at large k falls; raise temperature, use clip-higher, add β. Length drift: mean "
            "completion length trends up or down, often from the per-sequence averaging bias; switch to a token "
            "sum with a constant normaliser.\n\n"
            "KL blow-up: a sudden jump in the KL to the reference means the policy left the region it was in; lower "
            "the learning rate or raise β. Optimisation instability: gradient-norm spikes, a high clip fraction, a "
            "huge maximum ratio, NaNs; check eps, clip gradients, lower the learning rate. No signal: a flat reward "
            "with most groups all-equal; change the prompt mix, G or temperature, or look for a bug. Sampler-trainer "
            "mismatch: the first-minibatch ratio is not 1 and the log-prob gap is far above float noise; match "
            "the sampling transforms and precision, or correct with importance weights."
        ),
        demo=_DASHBOARD_06,
    ),
    Question(
        id="grpo-vs-reinforce", topic="grpo", seeds=("003.Q16",),
        question="When would you choose GRPO over plain REINFORCE? What exactly does GRPO add?",
        checklist=(
            "REINFORCE: ∇J = E[∇log π(a|s)(R − b)], one gradient step per batch, any baseline not depending on the action",
            "GRPO adds: a per-prompt baseline from G samples, std scaling, the clipped ratio (several updates per batch), a KL to a reference",
            "with μ = 1 and β = 0 GRPO's gradient is REINFORCE with the group mean as baseline",
            "the group mean includes the answer's own reward: (G − 1)/G shrinkage; RLOO (leave-one-out) is unbiased",
            "choose GRPO when several samples of the same state are cheap (prompts); REINFORCE with a batch or learned baseline when they are not",
            "REINFORCE does not use one sample per update (a claim in the “GRPO in depth” question set): it averages over a batch of episodes; what it lacks is several samples of the same state; and GRPO's variance reduction comes from the group mean, not from the std",
        ),
        answer=(
            "REINFORCE estimates ∇J = E[∇log π(a|s)(R − b)] from samples and takes one step per batch; any baseline b "
            "that does not depend on the sampled action keeps it unbiased. GRPO is REINFORCE with four additions: "
            "the baseline is the mean reward of G samples of the same prompt (a per-state Monte-Carlo value "
            "estimate), the advantages are divided by the group's std, a clipped importance ratio lets one batch "
            "serve several updates safely, and a KL term ties the policy to a reference. Set μ = 1 and β = 0 and "
            "the ratio is 1, the clip is inactive and the gradient is exactly REINFORCE with a group baseline and "
            "std scaling.\n\n"
            "A subtlety: the group mean contains the answer's own reward, which shrinks the expected gradient by "
            "(G − 1)/G; the leave-one-out version (RLOO) averages only the others and is unbiased. Prefer GRPO when "
            "you can cheaply draw several samples from the same state, as with prompts, and want data reuse and a "
            "reference leash; plain REINFORCE with a batch-mean or learned baseline is the choice when each state "
            "can be sampled only once (most environments without resets) or the task is tiny.\n\n"
            "Two claims from the “GRPO in depth” question set to correct out loud. \"REINFORCE uses one sample per update\" "
            "is false: it averages ∇log π·(R − b) over a batch of episodes, as many as you like; the difference is "
            "that GRPO draws several samples of the same state, which is what makes a per-state baseline possible. "
            "And \"GRPO lowers variance through normalisation\" credits the wrong part: the group mean is the "
            "baseline that removes variance; dividing by the std only rescales each group."
        ),
        demo=Demo(_L05, "### 6b. Learning curves at an equal sample budget"),
    ),
    Question(
        id="grpo-risk", topic="grpo", seeds=("002.4",),
        question="What is the main risk of GRPO?",
        checklist=(
            "the signal comes only from reward differences within a group: too few samples or a reward that cannot separate answers gives no or noisy signal",
            "sparse rewards and prompts that are too hard or too easy produce all-equal groups",
            "std scaling amplifies small, noisy differences; a weak learned reward model gets exploited (hacking)",
            "no critic: a single credit per completion, weak for long-horizon tasks",
            "mitigations: enough samples per prompt, prompt difficulty curation, a verifiable or well-validated reward, KL, monitoring",
        ),
        answer=(
            "Everything GRPO learns comes from reward differences between siblings, so its main risk is a group "
            "that cannot tell its members apart. With too few samples, or prompts the policy always solves or "
            "never solves, groups come back all-equal and the step is wasted. With a weak or noisy reward model the "
            "differences exist but are noise, and dividing by a small group std blows that noise up to unit-size "
            "advantages; the policy then learns the reward model's quirks (reward hacking) instead of the task.\n\n"
            "A second, structural risk is the missing critic: every token of a completion gets the same credit, "
            "which is fine for a short answer checked at the end and poor for long multi-step episodes. The "
            "defences follow: enough samples per prompt, prompts of the right difficulty, a verifiable reward or "
            "a reward model validated on held-out data, a KL to the reference, and a dashboard that tracks the "
            "zero-std fraction and held-out quality."
        ),
        demo=_WRONG_TOOL_05,
    ),
    Question(
        id="outcome-vs-process", topic="grpo", seeds=("001.F4",),
        question="How does a GRPO loop change with process supervision (per-step rewards) versus outcome supervision "
                 "(one scalar per completion)?",
        checklist=(
            "outcome: one reward per completion, normalised in the group, the same advantage broadcast to every token",
            "process: a reward per reasoning step; normalise step rewards across the whole group, each token gets the sum of normalised rewards of the steps from its own onward",
            "needs step boundaries aligned to token positions; masks must follow them",
            "process rewards give denser credit assignment but need a process reward model: costly and hackable",
            "alternatives for per-step credit: a critic with GAE; outcome rewards with verifiers dominate in practice",
        ),
        answer=(
            "With outcome supervision each completion has one reward, the group turns it into one advantage, and "
            "that value is broadcast to every completion token: the advantage tensor is [B·G] expanded over the "
            "time axis. With process supervision each reasoning step gets its own reward. DeepSeekMath's recipe "
            "normalises all step rewards of the group together (mean and std over every step of every sibling), "
            "and gives each token the sum of the normalised rewards of its own step and the steps after it, a "
            "reward-to-go; so tokens of a good early step are credited differently from a bad later step.\n\n"
            "Practical changes: the trainer must know where each step ends in token positions, the advantage is "
            "now a [B·G, T] tensor rather than a broadcast scalar, and masks must agree with the step "
            "segmentation. The benefit is finer credit assignment for long reasoning; the costs are a process "
            "reward model to train and run, which is expensive and which the policy can learn to please. That is "
            "why verifiable outcome rewards dominate GRPO practice, and why per-step credit, when needed, often "
            "comes back through a critic and GAE instead."
        ),
        demo=Demo(_L07, "**Q7. Process vs outcome supervision: how are advantages broadcast over tokens?**"),
    ),
    # ----------------------------------------------------------------------------- debugging GRPO (lesson 07)
    Question(
        id="clarifying-questions", topic="debugging", seeds=("001.clarify",),
        question="Before debugging someone's GRPO loop, which clarifying questions do you ask, and why does each answer matter?",
        checklist=(
            "outcome or process reward: decides how advantages are broadcast over tokens",
            "optimizer steps / epochs per rollout batch: with more than one, ratio ≠ 1 is expected",
            "same forward path for sampling and scoring, or a separate inference engine: decides whether a log-prob mismatch is possible",
            "sampling transforms (temperature, top-p/top-k, penalties, logit bias) and whether scoring applies the same ones",
            "KL to a reference: β, folded into the reward or in the loss, which estimator",
            "precision and attention kernels on each path; asynchronous or stale weights; how the loss is aggregated",
        ),
        answer=(
            "The answers tell you which anomalies are expected and which are bugs, so ask them first. Outcome or "
            "process reward: it decides whether one advantage is copied to every token or each token has its own. "
            "How many optimizer steps per rollout batch: with one, the ratio must be exactly 1; with several "
            "minibatches or epochs, drift after the first step is normal. Does the same code path generate and "
            "score, or does an inference engine generate while the trainer recomputes log-probs? Only in the "
            "second case is a numerical mismatch expected.\n\n"
            "Which sampling settings are used (temperature, top-p or top-k, repetition penalty, logit bias), and are "
            "the same transforms applied when the trainer scores? Is there a KL to a frozen reference, with what β, "
            "in the reward or in the loss? Which precision and attention kernel does each path use, are generation "
            "weights synced after every step or allowed to lag, and how is the per-token loss averaged? With "
            "those answered you can state the invariant the loop should satisfy and test it."
        ),
        demo=Demo(_L07, "## 1. The invariant: when is the ratio exactly 1?"),
    ),
    Question(
        id="three-bugs", topic="debugging", seeds=("001.2",),
        question="Name three common, easy-to-miss bugs in a GRPO/PPO-style training loop. For each, how do you detect it and how do you fix it?",
        checklist=(
            "log-prob alignment: logits at t scored against token t instead of t + 1, or the sampling temperature left out; detect: before any step recomputed log-probs must equal the sampler's (ratio 1 to ~1e-6); fix: logits[:, P−1:T−1] gathered at tokens[:, P:], divided by the temperature",
            "masking: prompt or padding tokens counted, tokens after EOS included, or the real EOS dropped when pad == eos; detect: change tokens after EOS and the loss must not move, compare mask sums with completion lengths; fix: build the mask by position and use it in the loss numerator, denominator, KL and sums",
            "advantages: wrong grouping (whole batch, strided layout), sign flipped, missing eps (NaN), or gradient flowing through them; detect: per-group mean 0, an all-equal group gives exactly 0, a unit test with known rewards; fix: reshape to [prompts, G] in the sampling order, detach, eps on the std",
            "mixing policies: old log-probs taken after the update or from the reference, or a reference that shares weights with the policy; detect: ratio always 1 with μ > 1, KL always 0 with β > 0; fix: snapshot old log-probs at rollout under no_grad, deep-copy and freeze the reference",
            "every bug gets a concrete detection method and a concrete fix, not just a name",
        ),
        answer=(
            "1. Log-prob alignment. In a causal LM the logits at position t are the distribution of token t + 1. "
            "Scoring completion token t with logits[t] (off by one), or forgetting to divide by the sampling "
            "temperature, gives log-probs of the wrong distribution and a meaningless ratio. Detection: take a "
            "freshly sampled batch and, before any update, recompute log-probs in the trainer; they must equal the "
            "sampler's to float precision, so the ratio is 1. An off-by-one shows errors of order 1. Fix: "
            "log_softmax(logits[:, P−1:T−1] / temperature) gathered at tokens[:, P:].\n\n"
            "2. Masking. Prompt tokens or padding enter the loss, tokens after the first EOS are counted, or the "
            "sampled EOS is masked out because pad == eos, so the model is never taught to stop. Detection: "
            "overwrite everything after EOS with random tokens and check the loss does not change; compare the "
            "mask's row sums with the true completion lengths. Fix: build the mask by position (a token counts if "
            "no EOS came before it) and use it in the numerator and denominator of the loss, in the KL, and in any "
            "log-prob sum.\n\n"
            "3. Advantages. Statistics over the whole batch instead of per prompt, a reshape that does not match "
            "how completions were ordered, a flipped sign, no eps (an all-equal group gives NaN), or advantages "
            "that carry gradient. Detection: assert each group's advantages average to 0, feed an all-equal group "
            "and expect exact zeros, unit-test with rewards you computed by hand. Fix: reshape to [prompts, G] in "
            "sampling order, add eps to the std, detach. A fourth classic is mixing policies: old log-probs "
            "recomputed after the optimizer step (ratio always 1 even with μ > 1, the clip never acts) or a "
            "reference that shares weights with the policy (KL always 0); snapshot old log-probs at rollout "
            "time and deep-copy the reference."
        ),
        demo=Demo(_L07, "### Bug by bug: symptom → detection → fix"),
    ),
    Question(
        id="ratio-not-one", topic="debugging", seeds=("001.3",),
        question="The loop is meant to be strictly on-policy, yet ratio = exp(log π_θ − log π_old) is not always 1. "
                 "Why? List the likely causes and, for each, what to check.",
        checklist=(
            "state the invariant: ratio = 1 exactly iff both log-probs come from the same weights, inputs, masks, numerics and sampling transforms",
            "by design: after the first optimizer step on a batch (several minibatches or epochs) the weights moved; check: first minibatch exactly 1, drift grows with the step index",
            "mismatch: a separate inference engine (different kernels, bf16 vs fp32, batch-dependent reductions); check: recompute on the same sequences right after a weight sync and look at the size and sign of |Δ log p|",
            "staleness: generation weights not synced (or intentionally lagged); check: weight checksums, deviation correlated with steps since sync",
            "transforms applied only at sampling: temperature, top-p/top-k, repetition penalty, logit bias; check: toggle them off and the gap disappears",
            "train-mode dropout, different padding or position ids, MoE routing differences; check: model.eval(), same padding side, per-position pattern",
            "read size and shape: below ~1e-5 is float32 rounding; a symmetric spread up to ~1e-1 can be precision or kernels (lesson 07 measures max |log ρ| 0.04 for bf16 scoring, 0.03 for two bf16 attention kernels); a systematic shift (every token moved the same way) is a logic mismatch, whatever its size",
        ),
        answer=(
            "Start from the invariant: the ratio is exactly 1 only if log π_θ and log π_old are computed with the "
            "same weights, on the same token ids with the same masks and positions, with the same numerics, and "
            "for the same distribution (same temperature and truncation). Every cause is one of those conditions "
            "failing, and they fall into two families.\n\n"
            "Expected by design: the loop takes more than one optimizer step per rollout batch (several minibatches "
            "or PPO epochs). The first minibatch sees ratio 1; after that the weights have moved and the ratios "
            "drift, which is what the clip is for. Check: log ratio statistics per minibatch index; the first must "
            "be 1 to float precision. Asynchronous pipelines that deliberately sample with slightly older weights "
            "also belong here, provided the lag is accounted for.\n\n"
            "Actual mismatch or staleness: (a) generation in a separate engine whose kernels, precision (bf16 "
            "sampler vs fp32 trainer) or batch-dependent reductions differ: recompute log-probs for a few hundred "
            "sequences right after a weight sync and look at Δ log p per token, its size and its sign. Below "
            "about 1e-5 it is float32 rounding. A symmetric spread around 0 of up to about 1e-1 can come from "
            "precision or kernels alone: lesson 07 measures up to 0.04 per token when bf16 rescores fp32 samples "
            "and 0.03 between two bf16 attention kernels, and on GPUs decode and prefill kernels differ more. A "
            "systematic shift, every token moved the same way, is a logic mismatch whatever its size. (b) Weights not synced to the engine: compare "
            "checksums; the gap grows with steps since the last sync. (c) Sampling-only transforms (temperature, "
            "top-p/top-k, repetition penalty, logit bias) missing from the trainer's log-prob: switch each off and "
            "see the gap vanish. (d) Dropout on in the trainer's forward pass, different padding side or position "
            "ids, MoE routing that differs between engines: call eval(), compare the pattern by position. The first "
            "family is handled by the clip; the second must be fixed or corrected with importance weights."
        ),
        demo=Demo(_L07, "## 6. Why the ratio is not 1: the study"),
    ),
    Question(
        id="truncated-is", topic="debugging", seeds=("001.F3",),
        question="In a generate-then-train stack the engine-vs-trainer log-prob mismatch cannot be removed. What is the "
                 "principled correction, and why is 'just pretend it is on-policy' wrong?",
        checklist=(
            "the tokens were drawn from the engine's distribution μ, not from the trainer's π_old: the data is slightly off-policy",
            "pretending: the ratio is taken against the trainer's π_old, so the estimator's expectation is over the wrong distribution (biased), and the clip is centred on a policy that never sampled",
            "correction: importance weight w = π_old(trainer) / μ(engine) per token (or per sequence), detached, multiplying the loss",
            "truncate it: min(w, C) with C ≈ 2: bounded variance for a small bias (truncated importance sampling); or mask tokens with extreme weights",
            "needs the engine's log-probs recorded at sampling time; monitor the weight's distribution",
            "reduce the gap at the source too: matched precision for the head, same transforms, synced weights",
        ),
        answer=(
            "The sampled tokens come from μ, the inference engine's distribution, while the loss treats them as "
            "samples from π_old, the trainer's computation of the same weights. The two differ by numerics (other "
            "kernels, bf16), sometimes a lot on rare tokens or with mixture-of-experts routing. Pretending they are "
            "equal means the policy gradient is an expectation under the wrong distribution, a bias that is "
            "invisible in the loss and that can grow as training pushes into regions where the engines disagree; "
            "the PPO clip does not help because it is centred on π_old, a policy that never generated the data.\n\n"
            "The principled fix is importance sampling between the two: record the engine's log-prob of every "
            "sampled token and multiply each token's loss by w = π_old(token)/μ(token), computed without gradient. "
            "Raw weights can be huge where μ assigned tiny probability, so truncate them, min(w, C) with C around "
            "2: that caps the variance for a small bias (truncated importance sampling); masking tokens whose "
            "weight is extreme is a variant. The ratio and clip then work as before relative to π_old. Monitor the "
            "weights' distribution, and shrink the gap itself where possible: fp32 for the output layer, identical "
            "sampling transforms, and weights synced after every step."
        ),
        demo=Demo(_L07, "## 7. The principled correction: truncated importance sampling"),
    ),
    # ----------------------------------------------------------------------------- diffusion (lessons 08, 09)
    Question(
        id="diffusion-grpo", topic="diffusion", seeds=("000.main",),
        question="You have a pretrained text-to-image diffusion model and a scalar reward. How would you set up GRPO-style "
                 "fine-tuning, and how does it differ from basic REINFORCE?",
        checklist=(
            "treat the denoising chain as an episode: each denoising step is a stochastic action with a Gaussian log-prob",
            "needs a stochastic sampler (DDPM, DDIM with η > 0, or an SDE version of a flow model); a deterministic ODE sampler has no usable log-prob",
            "per prompt, G images from different noise; reward on the final image; group-normalised advantage shared by all steps of its chain",
            "loss: clipped per-step ratio of the recorded transitions, averaged over steps (or a subset of steps), optional KL to the frozen model",
            "differences from REINFORCE: a per-prompt group baseline instead of raw reward or a learned baseline, std scaling, ratio + clip so a batch can serve several updates, KL leash",
            "practical: small clip range, classifier-free guidance applied identically when sampling and scoring, reward hacking checks",
        ),
        answer=(
            "Treat generation as a short episode. The sampler runs T denoising steps; each step draws x_{t−1} from a "
            "Gaussian whose mean the network predicts from (x_t, t, prompt), so each step is an action with an "
            "exact log-probability, even though the probability of the final image is intractable. That needs a "
            "stochastic sampler: DDPM, DDIM with η > 0, or an SDE form of a flow-matching sampler; a deterministic "
            "ODE sampler gives no usable policy. The reward (an aesthetic or preference model, CLIP similarity, "
            "a detector count) is computed once on the final image.\n\n"
            "For each prompt, sample G images from different initial noise with the current model, recording "
            "every latent of every chain and each step's log-prob. Normalise the G rewards within the group and "
            "give the advantage to every step of that chain. The loss is PPO's clipped surrogate applied per "
            "denoising step, with ratio exp(log p_θ(x_{t−1}|x_t, c) − log p_old(x_{t−1}|x_t, c)), averaged over steps "
            "(often a random subset of steps to save compute), plus an optional KL to the frozen pretrained model "
            "to limit reward hacking.\n\n"
            "Against basic REINFORCE, which would weight Σ_t ∇log p_θ by the raw reward or a global baseline and "
            "take one step, GRPO adds: a per-prompt baseline from the group (no value network for images), std "
            "scaling so prompts with different reward ranges count alike, the clipped ratio so each expensive batch "
            "of chains can serve several updates, and a KL leash. Keep classifier-free guidance identical in "
            "sampling and scoring, use a small clip range, and look at images, since reward models are easy to game.\n\n"
            "One assumption in the question needs correcting: you do not have the log-probability of a sampled "
            "image, not even approximately in a usable form; p_θ(x_0|c) is an integral over every chain that could "
            "have produced it. What you have, exactly, is the log-probability of each denoising step of the chain "
            "that was sampled, and that is all the policy gradient needs."
        ),
        demo=Demo(_L09, "## 10. Why not REINFORCE on the final image?"),
    ),
    Question(
        id="diffusion-mdp", topic="diffusion", seeds=("000.a",),
        question="For RL on a diffusion model, define the states, actions, transitions and rewards.",
        checklist=(
            "state: (prompt, timestep t, noisy latent x_t)",
            "action: the next latent x_{t−1}, drawn from N(μ_θ(x_t, t, c), σ_t² I): the policy is the denoiser's Gaussian",
            "transition: deterministic: the action becomes the next state's latent, t decreases by one",
            "initial state: x_T ~ N(0, I) with the prompt; horizon T steps (10–50)",
            "reward: zero at intermediate steps, r(x_0, c) on the decoded final image; γ = 1",
            "per-step log-probs are tractable although log p(x_0) is not",
        ),
        answer=(
            "The state at step t is the triple (prompt c, timestep t, current noisy latent x_t). The action is the "
            "next latent x_{t−1}: the denoiser predicts a mean μ_θ(x_t, t, c) and the sampler adds noise with a "
            "scheduled variance σ_t², so the policy π_θ(a|s) is the Gaussian N(μ_θ, σ_t² I) and its log-density is "
            "a squared distance divided by 2σ_t² plus a constant. The transition is deterministic: the chosen "
            "latent simply becomes the next state, with the timestep decreased by one. The episode starts from "
            "pure noise x_T ~ N(0, I) and ends after T steps at x_0.\n\n"
            "The reward is zero at every intermediate step and r(decode(x_0), c) at the end, with no discount. "
            "Formulating it step by step is what makes policy gradients possible: the likelihood of a final image "
            "under a diffusion model is intractable, but the likelihood of each denoising step is an explicit "
            "Gaussian, and the chain's log-probability is their sum."
        ),
        demo=Demo(_L09, "## 2. The denoising chain as an MDP"),
    ),
    Question(
        id="diffusion-sampling", topic="diffusion", seeds=("000.b",),
        question="For GRPO on a diffusion model, how do you sample trajectories and compute the advantages?",
        checklist=(
            "for each prompt in the batch, G chains from independent initial noise (and step noise), with the current weights as π_old",
            "store every latent x_T … x_0 (and timesteps, the prompt embedding, guidance scale) and each step's log-prob",
            "decode x_0 and score it: one scalar reward per image",
            "A_i = (r_i − group mean)/(group std + eps), one per image, shared by every step of its chain",
            "all-equal groups give 0; per-prompt statistics (or running per-prompt stats) rather than a batch baseline",
            "memory: T latents per image; subsample timesteps for the update",
        ),
        answer=(
            "Take a batch of prompts and, for each, run the stochastic sampler G times from independent starting "
            "noise with the current weights, which play the role of π_old. Keep the whole trajectory: every latent "
            "x_T, …, x_0, the timesteps, the prompt embedding and the guidance setting, plus each step's log-prob "
            "under the sampling weights (or enough to recompute it: the means and the σ_t). Decode the final latent "
            "and score the image to get one reward per chain.\n\n"
            "The advantages follow GRPO exactly: within each prompt's group, A_i = (r_i − mean)/(std + eps), one "
            "number per image, copied to all T steps of its chain. The group compares images of the same prompt, "
            "so prompts that are simply easier to score well on do not dominate; DDPO reached a similar effect "
            "with per-prompt running statistics. An all-equal group gives zero. Storing T latents per image is the "
            "memory cost, and many implementations train on a random subset of the timesteps of each chain."
        ),
        demo=Demo(_L09, "## 4. Trajectories and their log-probs"),
    ),
    Question(
        id="diffusion-loss", topic="diffusion", seeds=("000.c",),
        question="What loss do you optimise for GRPO on a diffusion model, and how does it relate to the policy gradient?",
        checklist=(
            "per-step ratio ρ_{i,t} = exp(log p_θ(x_{t−1}|x_t,c) − log p_old(x_{t−1}|x_t,c)); Gaussian log-probs, the constants cancel",
            "L = −mean over images and steps of min(ρA_i, clip(ρ, 1 ± ε)A_i) + β·KL to the pretrained model",
            "at ρ = 1 the gradient is −A_i Σ_t ∇log p_θ(x_{t−1}|x_t): REINFORCE on the chain, valid because the chain's density factorises over steps",
            "KL between two Gaussians with the same σ_t is ‖μ_θ − μ_ref‖²/(2σ_t²): closed form per step",
            "ε depends on how the step's log-density is reduced: DDPO averages over the D latent dimensions, which makes every log-ratio D times smaller (ρ_mean = ρ_sum^(1/D)), so ε must shrink by about D (DDPO: 1e-4); lesson 09 measures mean vs sum at D = 256",
        ),
        answer=(
            "For image i of a group and denoising step t, the ratio is ρ_{i,t} = exp(log p_θ(x_{t−1}|x_t, c) − "
            "log p_old(x_{t−1}|x_t, c)), where both terms are Gaussian log-densities −‖x_{t−1} − μ(x_t, t, c)‖²/(2σ_t²) plus "
            "a constant that cancels. The loss is the clipped surrogate averaged over images and steps, "
            "L = −mean_{i,t} min(ρ_{i,t}A_i, clip(ρ_{i,t}, 1 − ε, 1 + ε)A_i), optionally plus β times a KL to the "
            "frozen pretrained model; for two Gaussians with the same variance that KL is ‖μ_θ − μ_ref‖²/(2σ_t²) per "
            "step, exact rather than sampled.\n\n"
            "Relation to policy gradients: the chain's density is a product of step densities, so ∇ log p_θ(chain) = "
            "Σ_t ∇log p_θ(x_{t−1}|x_t), and the policy-gradient theorem gives ∇J = E[A · Σ_t ∇log p_θ(x_{t−1}|x_t)]. At "
            "ρ = 1 (the first update after sampling) the surrogate's gradient is exactly that, with the group "
            "baseline inside A; the ratio and clip only matter when the batch is reused.\n\n"
            "The clip range needs care, and the reason is often told backwards. A step's log-density is a sum over "
            "the D latent dimensions; DDPO, like most implementations, averages it instead. That leaves the "
            "direction of the gradient at ρ = 1 unchanged (it is divided by D, which Adam undoes) but makes every "
            "log-ratio D times smaller: ρ_mean = ρ_sum^(1/D). The same ε then describes a trust region D times "
            "wider in log-ratio, so ε must shrink by about D to mean the same thing; that is why DDPO pairs the "
            "mean with ε = 1e-4. Lesson 09 measures it at D = 256: after the same few steps with ε = 1e-3, the "
            "largest |log ρ| is 0.011 with the mean and 2.8 with the sum, and ε = 0.2 on the mean never clips. "
            "Copying ε = 0.2 from an LLM recipe onto a per-pixel mean switches the clip off."
        ),
        demo=Demo(_L09, "## 6. The objective, and why it is a policy gradient over the chain"),
    ),
    Question(
        id="diffusion-pseudocode", topic="diffusion", seeds=("000.d",),
        question="Give high-level pseudocode for one GRPO training iteration on a diffusion model.",
        checklist=(
            "sample prompts; for each, G chains with the current model under no_grad, recording latents and step log-probs",
            "decode final latents, compute rewards, group-normalised advantages",
            "for each update epoch: for minibatches of (chain, step) pairs, recompute log-probs with grad, ratio, clipped loss, optional KL",
            "backward, gradient clipping, optimizer step",
            "log reward mean/std, clip fraction, approx KL, zero-std share; periodically look at images",
        ),
        answer=(
            "```\n"
            "prompts = sample_prompts(B)\n"
            "with no_grad:                                     # rollout: these weights are π_old\n"
            "    for c in prompts, for i in 1..G:\n"
            "        x = randn(latent_shape)\n"
            "        for t = T..1:\n"
            "            mean, sigma = denoiser_mean(model, x, t, c)      # same CFG as later\n"
            "            x_next = mean + sigma * randn_like(x)\n"
            "            store(c, t, x, x_next, logp_old=gauss_logp(x_next, mean, sigma))\n"
            "            x = x_next\n"
            "        reward[c, i] = reward_fn(decode(x), c)\n"
            "adv = (reward - reward.mean(1)) / (reward.std(1) + eps)          # per prompt\n"
            "for epoch in 1..K:\n"
            "    for batch of stored (c, t, x, x_next, logp_old, adv) (optionally a subset of t):\n"
            "        mean, sigma = denoiser_mean(model, x, t, c)\n"
            "        ratio = exp(gauss_logp(x_next, mean, sigma) - logp_old)\n"
            "        loss = -min(ratio * adv, clip(ratio, 1 - eps_clip, 1 + eps_clip) * adv).mean()\n"
            "        loss += beta * ((mean - ref_mean(x, t, c)) ** 2).sum() / (2 * sigma ** 2)   # optional KL\n"
            "        loss.backward(); clip_grad_norm_(model); opt.step(); opt.zero_grad()\n"
            "log(reward stats, clip fraction, approx KL, zero-std share); save sample images\n"
            "```\n\n"
            "The rollout is gradient-free and records everything the update needs; the update recomputes only the "
            "step log-probs of stored transitions, so its cost is one network call per (chain, step) used."
        ),
        demo=Demo(_L09, "## 7. Training"),
    ),
    # ----------------------------------------------------------------------------- attention (lesson 10)
    Question(
        id="linear-attention", topic="attention", seeds=("004.B1",),
        question="Why is linear attention called linear, what structural change does it make to softmax attention, "
                 "and what is lost relative to exact softmax?",
        checklist=(
            "softmax attention forms the n × n score matrix: O(n² d) time, and O(n) cache per generated token",
            "replace exp(q·k) by a kernel φ(q)·φ(k) (a positive feature map such as elu + 1) and drop the softmax",
            "re-associate: φ(Q)(φ(K)ᵀV) with a d × d state computed once: O(n d²), linear in sequence length n",
            "causal form is a recurrence with a fixed-size state: constant memory and time per generated token",
            "lost: the exponential's sharp, normalised competition between keys; weak exact retrieval and copying",
            "the real limit is the fixed d × d_v state (plus a d-vector normaliser) through which the whole past must pass, whatever n",
            "\"low-rank attention\" holds only without the causal mask: φ(Q)φ(K)ᵀ has rank ≤ d, but its lower triangle is generally full rank",
        ),
        answer=(
            "Softmax attention computes, for every query, scores against every key, exp(q_i·k_j/√d), normalises "
            "them and averages the values. Building that n × n matrix costs O(n²d) time, quadratic in the sequence "
            "length n, and at inference each new token reads the whole growing KV cache. Linear attention replaces "
            "the exponential kernel by a dot product of feature maps, sim(q, k) = φ(q)·φ(k) with for instance "
            "φ = elu + 1, and drops the softmax. Then out_i = φ(q_i)ᵀ(Σ_j φ(k_j)v_jᵀ) / φ(q_i)ᵀ(Σ_j φ(k_j)): by "
            "computing the d × d summary Σ φ(k)vᵀ first, instead of the n × n matrix, the cost becomes O(n d²), linear "
            "in n. In the causal case the summary is a running sum, so the model is an RNN with a fixed-size state: "
            "constant memory and time per generated token.\n\n"
            "What is lost is what made softmax good at lookup. The exponential makes keys compete: one very "
            "relevant key can take almost all the weight; a feature-map kernel spreads weight more evenly. And "
            "the whole past must pass through the fixed d × d_v state S_t = Σ φ(k_s)v_sᵀ (with the d-vector "
            "z_t = Σ φ(k_s) for the normaliser), whatever the context length, so exact recall of a specific "
            "earlier token (copying, associative lookup, needle in a haystack) degrades as the context grows. "
            "Linear attention is often called low-rank attention; that is true only without the causal mask. "
            "φ(Q)φ(K)ᵀ has rank at most d, but keeping only its lower triangle generally makes it full rank, so "
            "for the causal model that matters in LLMs the rank is not the limit: the fixed-size state is."
        ),
        demo=Demo(_L10, "## 2. Linear attention: re-associate the matmuls"),
    ),
    Question(
        id="gqa", topic="attention", seeds=("004.B2",),
        question="In grouped-query attention, what is shared between heads, why does it help inference and the KV "
                 "cache, what are the quality trade-offs, and how does it relate to MHA and MQA?",
        checklist=(
            "H_q query heads, H_kv < H_q key/value heads; each group of H_q/H_kv query heads shares one K and V head",
            "KV cache ∝ layers · H_kv · head dim · tokens: it shrinks by H_q/H_kv",
            "decoding is memory-bandwidth bound (the cache is read for every token): smaller cache, faster steps, larger batches and longer contexts",
            "spectrum: MHA (H_kv = H_q, most capacity, largest cache) → GQA → MQA (H_kv = 1, smallest cache, largest quality risk)",
            "GQA keeps quality close to MHA; existing MHA checkpoints can be converted by mean-pooling KV heads and briefly uptraining",
            "unchanged: the number of query heads and the query-side compute; changed: the query heads of a group score the same keys and average the same values, so their patterns are no longer independent; K/V projection parameters shrink",
        ),
        answer=(
            "GQA keeps all H_q query heads but gives them only H_kv key/value heads: the query heads are split "
            "into H_kv groups and each group attends with the same K and V projections. The KV cache stores keys "
            "and values per KV head, so its size, 2 · layers · H_kv · head_dim · tokens · bytes, falls by a factor "
            "H_q/H_kv. That matters because autoregressive decoding is limited by memory bandwidth: every new token "
            "reads the entire cache. A smaller cache means faster decoding steps, more sequences per batch, and "
            "longer contexts in the same memory. What stays the same is the number of query heads and the "
            "query-side compute: each query head still computes its own scores. What changes is that the query "
            "heads of a group score the same keys and average the same values, so their attention patterns are "
            "no longer independent; they differ only through their queries.\n\n"
            "It sits on a spectrum. Multi-head attention (H_kv = H_q) has the most capacity and the largest cache. "
            "Multi-query attention (H_kv = 1) has the smallest cache but forces every head to read the same keys "
            "and values, which costs quality and was reported to make training less stable. GQA with, say, 8 KV "
            "heads lands close to MHA quality at a fraction of the cache. An MHA checkpoint can be converted by "
            "averaging the K and V heads of each group and uptraining for a small share of the original compute."
        ),
        demo=Demo(_L10, "## 6. GQA and MQA: share keys and values across query heads"),
    ),
    Question(
        id="softmax-still-wins", topic="attention", seeds=("004.F3",),
        question="Linear attention promises O(n) scaling but does not dominate frontier LLMs. Give two concrete reasons "
                 "exact softmax attention with FlashAttention-style kernels still wins.",
        checklist=(
            "quality: exact softmax does sharp content-based retrieval (in-context recall, copying); a fixed-size state cannot hold everything, and recall benchmarks show the gap",
            "FlashAttention computes exact attention tile by tile in fast on-chip memory: no n × n matrix in memory, far fewer memory reads, tensor-core friendly",
            "per token, projections and MLP cost about 24·d_model² FLOPs and causal attention about 2·n·d_model: attention passes half only at n ≈ 12·d_model (49,152 tokens for d_model = 4096), so below that the asymptotic win buys little",
            "linear attention's causal form (prefix sums, small state updates) is harder to run at full hardware utilisation; ecosystem: paged KV caches, kernels, pretrained checkpoints",
            "the middle ground in practice: hybrids with a few full-attention layers, sliding windows",
        ),
        answer=(
            "First, quality where it counts. Much of what makes LLMs useful is precise retrieval from the context: "
            "quoting a line, finding a name mentioned 20,000 tokens ago, copying code. Softmax lets a query put "
            "nearly all its weight on one key; linear attention compresses the whole history into a fixed-size "
            "state, and recall-heavy evaluations show it falling behind as contexts lengthen. Being exact also "
            "means the model behaves the same with any kernel, which matters for reproducibility and for reusing "
            "existing checkpoints.\n\n"
            "Second, the cost argument is weaker than O(n²) suggests. FlashAttention computes exact attention in "
            "tiles kept in on-chip memory, never materialising the n × n matrix, so memory is linear and the "
            "kernel runs near peak on tensor cores. At the context lengths most requests use, attention is a "
            "minority of a layer's FLOPs: per token, the projections and the MLP cost about 24·d_model² FLOPs "
            "and causal attention about 2·n·d_model, so attention passes half only at n ≈ 12·d_model, 49,152 "
            "tokens for d_model = 4096 (lesson 10, §5). So the "
            "asymptotic saving is small, while linear attention's causal recurrence is harder to run at full "
            "utilisation. Serving stacks are also built around KV caches (paging, prefix sharing). Hence the "
            "current compromise: mostly exact attention, GQA to shrink the cache, and hybrids that interleave a "
            "few full-attention layers with linear or state-space layers."
        ),
        demo=Demo(_L10, "## 5. Why exact softmax with a fused kernel still wins at moderate lengths"),
    ),
    Question(
        id="kv-cache-4x", topic="attention", seeds=("004.F4",),
        question="You must cut KV-cache memory by 4x on a serving model with 32 query heads. Compare GQA with 8 KV heads, "
                 "multi-query attention (1 KV head) and a linear-attention layer. What would you measure to choose?",
        checklist=(
            "KV bytes = 2 · layers · KV heads · head dim · tokens · batch · bytes per element: 32 → 8 KV heads is exactly 4x; MQA is 32x",
            "worked number: 32 layers, head dim 128, 4096 tokens, bf16: 2 GiB per sequence with 32 KV heads, 512 MiB with 8, 64 MiB with 1",
            "GQA-8: closest to the current quality; needs a conversion (mean-pool KV heads) plus uptraining, not a drop-in swap",
            "MQA: more saving than required, more quality risk; linear attention: constant state, biggest change, needs retraining/distillation, worst recall",
            "alternatives with no retraining: KV quantisation (16 → 4 bits is 4x), sliding-window layers",
            "measure: task quality incl. long-context retrieval, perplexity; memory per sequence, max batch, throughput, time-to-first-token and per-token latency at target lengths; conversion cost",
        ),
        answer=(
            "Compute first. The cache holds 2 (K and V) × layers × KV heads × head_dim × tokens × batch × bytes. With "
            "32 layers, head_dim 128, 4,096 tokens and bf16, one sequence needs 2 GiB with 32 KV heads, 512 MiB with 8 "
            "and 64 MiB with one. So GQA with 8 KV heads gives exactly the 4x; MQA gives 32x, more than asked, at "
            "more quality risk; a linear-attention layer has a state whose size does not grow with the context, a "
            "large saving only at long contexts, but it changes the model the most and is the weakest at exact "
            "recall. None is a drop-in change to a trained model: GQA needs the KV heads of each group averaged and "
            "a short uptraining, MQA the same with a bigger loss, linear attention retraining or distillation. If "
            "retraining is off the table, quantising the cache from 16 to 4 bits is another 4x.\n\n"
            "To choose, measure quality and serving together: the evaluation suite and perplexity, with "
            "long-context retrieval tests (which the cheaper options hurt first); bytes of cache per token, the "
            "largest batch that fits at the target context, throughput in tokens per second, time to first token "
            "and per-token latency at the real request lengths; and the compute needed for the conversion. My "
            "default is GQA-8: it hits the target with the smallest expected quality loss."
        ),
        demo=Demo(_L10, '## 8. "Cut KV-cache memory 4× on a serving model with 32 query heads"'),
    ),
)

_BY_ID = {q.id: q for q in QUESTIONS}
TOPICS: tuple[str, ...] = tuple(dict.fromkeys(q.topic for q in QUESTIONS))


def get(question_id: str) -> Question:
    """The question with this id; a ValueError that lists the ids otherwise."""
    try:
        return _BY_ID[question_id]
    except KeyError:
        raise ValueError(f"no interview question {question_id!r}; ids: {', '.join(_BY_ID)}") from None


def by_topic(topic: str | None) -> list[Question]:
    """The questions of one topic (all of them for None), in bank order."""
    if topic is None:
        return list(QUESTIONS)
    if topic not in TOPICS:
        raise ValueError(f"no interview topic {topic!r}; topics: {', '.join(TOPICS)}")
    return [q for q in QUESTIONS if q.topic == topic]


def for_seed(seed: str) -> list[Question]:
    """The entries that answer one seed question (e.g. "001.F3")."""
    if seed not in SEED_QUESTIONS:
        raise ValueError(f"unknown seed question {seed!r}")
    return [q for q in QUESTIONS if seed in q.seeds]
