"""nbval runs these notebooks as regression tests: make their choices reproducible.

Notebook 07 uses Llama-3.2-1B-Instruct when it finds the weights (a folder or a Hugging Face
login); its stored outputs are the embedded SmolLM2's, so the test suite asks for that one.
The notebooks run as they ship, with no puzzle solved: the answers a learner got right
(``exercises/solved.py``) are looked for in an empty folder of this run, and the verdicts the
notebooks' checks print are recorded in a file of that run (``exercises/progress.py``), never
in her records.
The kernels nbval starts inherit this environment."""

import os
import tempfile

os.environ.setdefault("PAGED_TUTORIAL_MODEL", "smollm2-135m")
_RUN_RECORDS = tempfile.mkdtemp(prefix="paged_tutorial_records_")
os.environ["PAGED_TUTORIAL_SOLVED"] = os.path.join(_RUN_RECORDS, "solved")
os.environ["PAGED_TUTORIAL_PROGRESS"] = os.path.join(_RUN_RECORDS, "progress.json")
