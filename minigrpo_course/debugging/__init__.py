"""Lesson 07: debugging a GRPO loop — a teaching copy of the step with planted bugs, detections that
catch them, and the study of why the importance ratio of an "on-policy" loop is not 1.

Nothing here is imported by the real trainer (``minigrpo.llm.grpo``); a test checks it.
"""
