"""Experiment plumbing for the lessons: the loops, toy tasks and tables whose code would crowd a notebook
cell. The ideas stay in the notebooks and the algorithms in the library (``minigrpo``); these modules only wire
them into the measurements a lesson shows (one module per lesson topic, e.g. ``attention`` for lesson 10).
"""
