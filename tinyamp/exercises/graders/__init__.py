"""One grader per exercise, built on tinyamp.testing; graders/<module>.py grades myamp/<module>.py.

Each ``grade_<name>(fn, examples)`` raises AssertionError with the first counterexample in
words, and lets NotImplementedError through (the stub is not started).  They import
hypothesis; ``tinyamp.exercises.grading`` imports them only when it grades.
"""
