"""Every benchmark whose result the README cites runs from a fresh clone: each is run here, as a
script from the repository root, with its smallest setting (on the CPU; the GPU-only ones are
skipped without a GPU), and writes its JSON."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]

#: result stem the README cites -> (script, smallest arguments, needs a GPU)
SMALLEST = {
    "cpu-generate": ("benchmarks/cpu_generate.py",
                     ["--repeats", "1", "--new-tokens", "1", "--threads", "1"], False),
    "gpu-tests": ("benchmarks/gpu_tests.py",
                  ["--timeout", "300", "--only", "tests/measure/test_benchmark_names.py"], False),
    "decode-trees": ("benchmarks/decode_trees.py", ["here=.", "again=.", "--rounds", "1"],
                     True),
    "decode": ("benchmarks/decode.py", ["--skip-hf", "--skip-variants", "--skip-smollm2"],
               True),
    "attention": ("benchmarks/attention.py", ["--cases", "1:1024", "--skip-prefill"], True),
    "serve": ("benchmarks/serve_load.py", ["--backend", "torch", "--clients", "2",
                                           "--max-tokens", "2", "--io", "auto,python"], False),
}


def cited_stems() -> set[str]:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    return set(re.findall(r"benchmarks/results/([a-z-]+?)-\d{4}-\d{2}-\d{2}\.json", readme))


def test_every_benchmark_the_readme_cites_has_a_smallest_setting_here():
    assert cited_stems() <= set(SMALLEST)


@pytest.mark.slow
@pytest.mark.parametrize("stem", sorted(SMALLEST))
def test_a_cited_benchmark_runs_at_its_smallest_setting(stem, tmp_path):
    script, args, needs_gpu = SMALLEST[stem]
    if needs_gpu and not torch.cuda.is_available():
        pytest.skip(f"{script} runs on a GPU")
    done = subprocess.run([sys.executable, script, *args, "--out", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    written = sorted(tmp_path.glob(f"{stem}-*.json"))
    assert written, f"{script} wrote no {stem}-<date>.json"
    result = json.loads(written[-1].read_text())
    assert result["rows"] if stem == "cpu-generate" else result
