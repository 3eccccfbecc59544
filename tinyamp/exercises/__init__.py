"""Coursework: exercises students implement, graders that tell them precisely whether they are right.

    tinyamp exercises list [DIR]        the exercises, their tutorials, and how far each is in DIR
    tinyamp exercises init DIR          a workspace: the package myamp/ of stubs, one module per tutorial
    tinyamp exercises check DIR         grade it: passed / not started / failed, the first counterexample

* ``catalog``: the exercises as data (id, stub, grader, tutorial);
* ``stubs/``: the stubs a workspace gets, one module per tutorial, which ``holes`` cuts from the
  reference solutions where comments mark each answer (as minitorch puts holes in its real
  modules); the solutions themselves are not in the package: they live in the repository's
  ``tests/exercise_solutions/`` (``init --solutions`` in a checkout);
* ``graders/``: one grader per exercise, built on ``tinyamp.testing``;
* ``grading``: loading a student's code, checking it is theirs, running its grader;
* ``isolation``: each exercise's code run in a contained child process, on a throwaway copy, with time
  and memory limits, and its grader in another process that never runs student code;
* ``remote``: the calls between the two, as plain data (JSON, arrays as .npy bytes), and the verdict's
  values checked in the grader's process; ``student_lines``: the student's line a failure names;
* ``reports``: the grades as JSON records and as Gradescope's results.json;
* ``workspace``: the files ``init`` writes; ``command``: the ``tinyamp exercises`` command.

Importing this package imports neither hypothesis nor the graders.
"""
