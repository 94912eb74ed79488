"""Course tooling, kept apart from the algorithms.

- `minigrpo.course.grading`: the exercise checks and `minigrpo grade`.
- `minigrpo.course.interview`: the interview question bank and practice modes.
- `minigrpo.course.progress`: where grades and practice history are kept.

Nothing in the algorithm modules (`minigrpo.losses`, `minigrpo.control`, `minigrpo.llm`, ...)
imports from here.
"""
