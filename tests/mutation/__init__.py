"""Mutation testing of the puzzles' graders: mutants of every worked solution go through the
real grader (``Puzzle.grade``, what ``pt.exercises.check`` runs); each one the grader calls
correct goes through a slow, wide deep oracle.  A mutant the grader passes and the deep oracle
refuses is a hole in the grader; one both pass is equivalent and must be listed, with a reason,
in ``equivalent.json``.  ``python -m tests.mutation`` runs every mutant and writes
``report.json``; the test suite runs a seeded sample (``tests/mutation/test_mutation.py``)."""
