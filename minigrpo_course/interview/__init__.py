"""Interview practice: the question bank, spaced review, and the ``minigrpo interview`` command.

    from minigrpo_course.interview import QUESTIONS, get
    q = get("grpo-step")
    q.question, q.checklist, q.answer, q.followups, q.demo.notebook, q.demo.fragment

The questions are Markdown files in ``minigrpo_course/interview/questions/`` (one per topic), loaded when
this package is imported.
"""

from minigrpo_course.interview.bank import (
                                            QUESTIONS,
                                            SEED_QUESTIONS,
                                            TOPIC_TITLES,
                                            TOPICS,
                                            Demo,
                                            FollowUp,
                                            Question,
                                            by_topic,
                                            for_seed,
                                            get,
                                            )
from minigrpo_course.interview.schedule import Progress
from minigrpo_course.interview.seeds import SEED_SETS, seed_label

__all__ = ["QUESTIONS", "SEED_QUESTIONS", "SEED_SETS", "TOPICS", "TOPIC_TITLES", "Demo", "FollowUp", "Progress",
           "Question", "by_topic", "for_seed", "get", "seed_label"]
