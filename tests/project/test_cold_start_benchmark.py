"""``benchmarks/cold_start.py`` runs on a CPU (torch backend) and writes its JSON.  Slow: it
starts four Python processes, each importing torch."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from helpers.fixtures_loading import tiny_config, write_tiny_gguf
from paged_tutorial.loading.models import random_model

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "cold_start.py"


@pytest.mark.slow
def test_cold_start_writes_both_processes_of_cli_and_api(tmp_path):
    spec = importlib.util.spec_from_file_location("cold_start", SCRIPT)
    cold_start = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cold_start)
    model = write_tiny_gguf(tmp_path / "tiny.gguf", random_model(tiny_config(), seed=0))
    assert cold_start.main(["--backend", "torch", "--model", str(model), "--prompt", "abc",
                            "--max-tokens", "3", "--no-chat", "--skip-gguf", "--out",
                            str(tmp_path / "out")]) == 0
    written = list((tmp_path / "out").glob("cold-start-*.json"))
    assert len(written) == 1
    data = json.loads(written[0].read_text())
    assert data["device"] and data["backend"] == "torch"
    for kind in ("cli", "api"):
        for process in ("first_process", "second_process"):
            run = data[kind][process]
            assert run["import_torch_s"] > 0 and run["first_token_after_torch_s"] > 0, run
    cli = data["cli"]["second_process"]
    assert cli["loaded_in_s"] > 0
    # the CLI's phases, from the moments its stderr lines start
    assert cli["import_torch_s"] < cli["backend_ready_s"] < cli["engine_ready_s"] \
        < cli["first_token_s"], cli
    assert cli["engine_ready_s"] - cli["backend_ready_s"] >= cli["loaded_in_s"] - 0.01, cli
    assert data["options"]["skip_gguf"] is True and data["options"]["max_tokens"] == 3
    assert data["api"]["first_process"]["engine_ready_s"] >= \
        data["api"]["first_process"]["loaded_s"]
    assert "met" in data["target"]
