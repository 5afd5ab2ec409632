"""``python -m paged_tutorial.serving [options]``: the same as ``python -m paged_tutorial serve``."""

import sys

from paged_tutorial.cli.main import main

sys.exit(main(["serve", *sys.argv[1:]]))
