"""``python -m paged_tutorial`` and the installed ``paged-tutorial`` command
(``paged_tutorial/cli/``): answer prompts, chat, or ``serve``.

Run as a program, the first statement takes Ctrl-C over, before anything else is imported:
from the first instant a Ctrl-C is one line and exit status 130 (``cli/ctrl_c.py``)."""

import sys

if __name__ == "__main__":
    from paged_tutorial.cli import ctrl_c

    ctrl_c.take_over()

from paged_tutorial.cli.main import main  # noqa: E402 - after Ctrl-C is taken over

if __name__ == "__main__":
    sys.exit(main())
