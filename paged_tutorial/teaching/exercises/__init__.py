"""Exercises and puzzles of the notebooks, behind one checker.

    import paged_tutorial as pt
    pt.exercises.names()                         # every exercise and puzzle, e.g. "03.k_index"
    pt.exercises.check("05.q_index", 581)        # prints a verdict, returns True / False
    pt.exercises.reveal("05.q_index")            # the worked solution: a value, or its code
    print(pt.exercises.puzzle("03.k_index").describe())   # a puzzle's signature and hint
    pt.exercises.set_language("ko")              # prompts, hints and verdicts in Korean
    kernel = pt.exercises.your_kernel()          # the kernel built from the puzzles you solved
    pt.exercises.grade_notebook("notebooks/06_block_lifetime.ipynb")   # a notebook as left
    pt.exercises.progress()                      # every chapter: solved / not yet

The same grading from a shell: ``python -m paged_tutorial.teaching.exercises grade
notebooks/06_block_lifetime.ipynb`` (exit status 0 only when all are solved).
``progress()`` reads the verdicts of this process and of a small record file in the user's
cache folder (``progress.py`` says where, and how to move or turn it off).

*Exercises* (each chapter's ``exercises.py``, ``paged_tutorial.teaching.chapters``) ask for
numbers; their right answers are computed from the package, and answers are compared without
coercion (``answers.py``: a float or a string for an integer is wrong, a bool is not an
integer, real numbers count to 4 significant digits, tuples and lists element by element).
*Puzzles* (in the same chapter folders) ask for a function that the grader runs inside the
article's kernel or a real engine.  Worked solutions live in
``solutions.py``, never in the notebooks, and no grader imports them.  A puzzle answer that
``check`` finds right is remembered (``solved.py``), and ``your_kernel()``
(``your_kernel.py``) assembles the decode-attention kernel from the remembered ones.
"""

from __future__ import annotations

from paged_tutorial.teaching.exercises.notebook_grading import grade_notebook, progress
from paged_tutorial.teaching.exercises.registry import check, expected_answer, get, grade, names
from paged_tutorial.teaching.exercises.solutions import reveal
from paged_tutorial.teaching.language import set_language
from paged_tutorial.teaching.exercises.your_kernel import (Serving, UnsolvedParts, YourKernel,
                                                           which_part_changed, which_part_differs,
                                                           your_kernel)
from paged_tutorial.teaching.chapters.ch06_block_lifetime.allocator import AllocatorBase
from paged_tutorial.teaching.verdict import Verdict


def puzzle(name: str):
    """The ``Puzzle`` called ``name``: ``.describe()``, ``.stub()``, ``.signature``, ``.hint``."""
    from paged_tutorial.teaching.chapters import puzzle as find

    return find(name)


__all__ = ["AllocatorBase", "Serving", "UnsolvedParts", "Verdict", "YourKernel", "check",
           "expected_answer", "get", "grade", "grade_notebook", "names", "progress", "puzzle",
           "reveal", "set_language", "which_part_changed", "which_part_differs",
           "your_kernel"]
