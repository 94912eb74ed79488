"""Interview practice: the question bank, spaced review, and the ``minigrpo interview`` command.

    from minigrpo.interview import QUESTIONS, get
    q = get("grpo-step")
    q.question, q.checklist, q.answer, q.demo.notebook, q.demo.fragment
"""

from minigrpo.interview.bank import QUESTIONS, SEED_QUESTIONS, TOPICS, Demo, Question, by_topic, for_seed, get
from minigrpo.interview.schedule import Progress

__all__ = ["QUESTIONS", "SEED_QUESTIONS", "TOPICS", "Demo", "Progress", "Question", "by_topic", "for_seed", "get"]
