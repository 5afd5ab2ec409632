"""``python -m paged_tutorial.serving [options]``: the same as ``python -m paged_tutorial serve``."""

import sys

from paged_tutorial.serving.cli import serve_main

sys.exit(serve_main(sys.argv[1:]))
