"""nbval runs these notebooks as regression tests: make their choices reproducible.

Notebook 07 uses Llama-3.2-1B-Instruct when it finds the weights (a folder or a Hugging Face
login); its stored outputs are the embedded SmolLM2's, so the test suite asks for that one.
The notebooks run as they ship, with no puzzle solved: the answers a learner got right
(``exercises/solved.py``) are looked for in an empty folder of this run, not in hers.
The kernels nbval starts inherit this environment."""

import os
import tempfile

os.environ.setdefault("PAGED_TUTORIAL_MODEL", "smollm2-135m")
os.environ["PAGED_TUTORIAL_SOLVED"] = tempfile.mkdtemp(prefix="paged_tutorial_solved_")
