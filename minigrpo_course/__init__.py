"""minigrpo_course: the course built on the minigrpo library, kept apart from the algorithms.

- `minigrpo_course.cli`: the `minigrpo` command (list, run, grade, make-exercises, interview; its `train` is the
  library's, from `minigrpo.cli`).
- `minigrpo_course.grading`: the exercise checks and `minigrpo grade`.
- `minigrpo_course.interview`: the interview question bank (Markdown data in `interview/questions/`) and practice modes.
- `minigrpo_course.progress`: where grades and practice history are kept.
- `minigrpo_course.provenance`: which code a committed notebook's outputs were made with.
- `minigrpo_course.experiments`: the lessons' experiment helpers (studies, tables, figures).
- `minigrpo_course.debugging`: lesson 07's teaching copy of a GRPO step with planted bugs, and its studies.

This package imports `minigrpo`; nothing in `minigrpo` imports from here.
"""
