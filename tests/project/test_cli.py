"""The command line (``python -m paged_tutorial``): defaults, help, streaming, and one
``error:`` line with exit status 2 for every failure a user can cause.

Models are tiny GGUF files written here (byte-level tokenizer, 2 layers), so string prompts work
and a run takes well under a second; hub failures are simulated by replacing
``huggingface_hub.snapshot_download`` (no network).
"""

from __future__ import annotations

import inspect
import io
import re

import pytest
import torch

import paged_tutorial as pt
from helpers.fixtures_loading import tiny_config, write_tiny_gguf
from paged_tutorial.cli import answers, main, options, timing
from paged_tutorial.backends import BACKEND_NAMES
from paged_tutorial.backends.numba_cuda import SIMULATING
from paged_tutorial.loading.models import random_model

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "tiny.gguf"
    return write_tiny_gguf(path, random_model(tiny_config(vocab_size=320), seed=3))


def run_cli(capsys, *argv):
    """(exit status, stdout, stderr lines)."""
    status = main.main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err.splitlines()


def assert_one_error_line(err_lines, *fragments):
    errors = [line for line in err_lines if line.startswith("error:")]
    assert len(errors) == 1, err_lines
    assert not any("Traceback" in line for line in err_lines), err_lines
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
    return errors[0]


# --- defaults and help -------------------------------------------------------------------------

def test_defaults_are_the_apis():
    args = options.parse(["hi"])
    params = pt.SamplingParams()
    engine = inspect.signature(pt.Engine.__init__).parameters
    assert args.max_tokens == params.max_tokens == 64
    assert args.temperature == params.temperature
    assert args.top_p == params.top_p
    assert args.seed is params.seed is None
    assert args.max_slots == engine["max_slots"].default
    assert args.max_seq_len == engine["max_seq_len"].default
    assert args.backend == "auto" and args.model == "smollm2-135m"


def test_help_lists_backends_models_and_defaults(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main.main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for name in BACKEND_NAMES:
        assert f"\n  {name} " in text, name          # one described line per backend
    assert "(default: 64)" in text and "(default: auto)" in text
    assert "(default: smollm2-135m)" in text
    assert "kanana-nano-2.1b" in text and "qwen2.5-0.5b" in text and "Qwen3ForCausalLM" in text


# --- generating --------------------------------------------------------------------------------

def test_one_prompt_streams_piece_by_piece(tiny_gguf):
    writes = []

    class Recorder(io.StringIO):
        def write(self, text):
            writes.append(text)
            return super().write(text)

    args = options.parse(
        ["abc", "--model", str(tiny_gguf), "--backend", "torch", "--dtype", "float32",
         "--no-chat", "--max-tokens", "6", "--seed", "0"])
    out, err = Recorder(), io.StringIO()
    assert answers.run(args, args.prompt, out, err) == 0
    engine = pt.Engine(pt.load_model(tiny_gguf, "float32"), backend="torch")
    expected = engine.generate(["abc"], max_tokens=6, chat=False, seed=0)[0]
    assert out.getvalue() == expected.text + "\n"      # nothing held back is lost
    assert len([w for w in writes if w.strip()]) >= 2     # written as tokens came, not at once
    assert f"[{len(expected.token_ids)} tokens, finish_reason=" in err.getvalue()
    device = "cuda" if torch.cuda.is_available() else "cpu"     # the torch backend's choice
    assert err.getvalue().startswith(f"loading {tiny_gguf} on {device} in float32: asked for")


def test_the_loading_line_says_which_dtype_and_why_and_the_timing_is_split(tiny_gguf):
    args = options.parse(
        ["abc", "--model", str(tiny_gguf), "--backend", "torch", "--no-chat",
         "--max-tokens", "4", "--seed", "0"])
    err = io.StringIO()
    assert answers.run(args, args.prompt, io.StringIO(), err) == 0
    text = err.getvalue()
    if not torch.cuda.is_available():
        assert text.startswith(f"loading {tiny_gguf} on cpu in float32: the CPU's default")
    report = text.strip().splitlines()[-1]
    assert re.search(r"loaded in [0-9.]+ s, first token after [0-9.]+ s, [0-9.]+ tok/s decode]",
                     report), report


def test_kernels_compiled_before_the_run_are_not_reported_as_its_own(tiny_gguf, monkeypatch):
    """In a process that compiled kernels before (a notebook, a test session), the report
    counts only what this run compiled: here nothing, on the torch backend."""
    from paged_tutorial.backends.numba_cuda.runtime import kernel_cache

    monkeypatch.setattr(kernel_cache, "COMPILE_STATS",
                        kernel_cache.CompileStats(loaded=21, compiled=15, compile_seconds=35.0))
    args = options.parse(
        ["abc", "--model", str(tiny_gguf), "--backend", "torch", "--no-chat",
         "--max-tokens", "4", "--seed", "0"])
    err = io.StringIO()
    assert answers.run(args, args.prompt, io.StringIO(), err) == 0
    report = err.getvalue().strip().splitlines()[-1]
    assert "compiled in" not in report and "kernels" not in report, report


def test_decode_rate_leaves_out_compile_time():
    from types import SimpleNamespace

    start = timing.StartTiming()
    start.load_s = 1.0
    result = SimpleNamespace(token_ids=list(range(11)), time_to_first_token_s=0.5,
                             total_time_s=3.5)                     # 10 decode steps in 3 s
    stats = SimpleNamespace(compiled=3, loaded=2, seconds=2.5)
    text = start.report(result, compiling_while_decoding=2.0, stats=stats)
    assert text == (", loaded in 1.00 s, compiled in 2.50 s (3 kernels compiled, 2 from the "
                    "cache), first token after 0.500 s, 10 tok/s decode")


def test_several_prompts_print_labelled_answers_as_each_finishes(tiny_gguf, monkeypatch):
    events = []
    real_step = pt.Engine.step

    def step(self):
        events.append("step")
        return real_step(self)

    monkeypatch.setattr(pt.Engine, "step", step)

    class Recorder(io.StringIO):
        def write(self, text):
            events.append(text)
            return super().write(text)

    prompts = ["ab", "xyz", "q"]
    args = options.parse(
        [*prompts, "--model", str(tiny_gguf), "--backend", "torch", "--dtype", "float32",
         "--no-chat", "--max-tokens", "4", "--max-slots", "1"])
    out = Recorder()
    assert answers.run(args, args.prompt, out, io.StringIO()) == 0
    monkeypatch.setattr(pt.Engine, "step", real_step)
    engine = pt.Engine(pt.load_model(tiny_gguf, "float32"), backend="torch", max_slots=1)
    expected = engine.generate(prompts, max_tokens=4, chat=False)
    text = out.getvalue()
    for i, (prompt, result) in enumerate(zip(prompts, expected)):
        assert f"--- [{i}] {prompt!r}\n{result.text}\n" in text
    # with one slot, answer 0 is printed before the steps that serve prompts 1 and 2
    first_answer = next(k for k, e in enumerate(events) if e.startswith("--- [0]"))
    later_steps = events[first_answer + 1:].count("step")
    assert later_steps >= 2, events              # at least a prefill each for prompts 1 and 2
    assert events.index("step") < first_answer  # and answer 0 came after its own steps


def test_progress_line_and_bar_while_loading(tiny_gguf, capsys):
    pt.load_model(tiny_gguf, "float32", progress=True)
    bar = capsys.readouterr().err
    assert "loading tiny.gguf" in bar and "tensor" in bar       # tqdm's bar on stderr
    pt.load_model(tiny_gguf, "float32")
    assert capsys.readouterr().err == ""                         # silent by default (notebooks)


@pytest.mark.skipif(not SIMULATING, reason="this process runs numba on the GPU: numba-sim is "
                    "refused here (Numba picks one mode per process); checked on a CPU")
def test_numba_sim_warns_that_it_is_slow(tiny_gguf, capsys):
    status, out, err = run_cli(capsys, "ab", "--model", str(tiny_gguf), "--backend",
                               "numba-sim", "--no-chat", "--max-tokens", "2")
    assert status == 0
    warning = [line for line in err if line.startswith("warning: numba-sim")]
    assert len(warning) == 1 and "Python thread" in warning[0]
    assert "--backend torch" in warning[0] and "2 layers" in warning[0]


# --- every user-caused failure: one error line, exit status 2 -----------------------------------

def _never_load(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("weights were loaded")
    monkeypatch.setattr(pt, "load_model", fail)


def test_missing_path(tmp_path, capsys):
    status, out, err = run_cli(capsys, "hi", "--model", str(tmp_path / "missing.gguf"))
    assert status == 2 and out == ""
    assert_one_error_line(err, "missing.gguf", "no model at")


def test_folder_without_config(tmp_path, capsys):
    status, _, err = run_cli(capsys, "hi", "--model", str(tmp_path))
    assert status == 2
    assert_one_error_line(err, "config.json")


def _hub_failure(kind):
    from huggingface_hub import errors

    if kind == "offline":
        return errors.LocalEntryNotFoundError("connection refused")
    exc = errors.GatedRepoError.__new__(errors.GatedRepoError)   # skip the HTTP-response init
    Exception.__init__(exc, "401 Client Error: access to model is restricted")
    return exc


@pytest.mark.parametrize("kind, fragments", [
    ("offline", ("cannot download", "local model folder")),
    ("gated", ("gated", "hf auth login")),
])
def test_hub_failures(monkeypatch, capsys, kind, fragments):
    import huggingface_hub

    def fail(*args, **kwargs):
        raise _hub_failure(kind)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fail)
    status, out, err = run_cli(capsys, "hi", "--model", "meta-llama/Llama-3.2-1B-Instruct",
                               "--backend", "torch")
    assert status == 2 and out == ""
    assert_one_error_line(err, "meta-llama/Llama-3.2-1B-Instruct", *fragments)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a CUDA GPU")
def test_numba_without_gpu_fails_before_loading(monkeypatch, capsys):
    _never_load(monkeypatch)
    status, out, err = run_cli(capsys, "hi", "--backend", "numba")
    assert status == 2 and out == ""
    line = assert_one_error_line(err, "backend 'numba' cannot run here", "needs an NVIDIA GPU",
                                 "--backend torch")
    assert "numba-sim" in line
    assert not any(e.startswith("loading") for e in err)


def test_numba_gpu_problem_fails_before_loading(monkeypatch, capsys):
    """A GPU that numba cannot start on (old driver, no NVVM): refused before loading."""
    from paged_tutorial.backends import availability

    _never_load(monkeypatch)
    monkeypatch.setattr(availability, "torch_gpu_problem", lambda: None)      # a GPU is there
    monkeypatch.setattr(availability, "numba_gpu_problem",
                        lambda: "CUDA_ERROR_UNSUPPORTED_PTX_VERSION: driver too old")
    status, _, err = run_cli(capsys, "hi", "--backend", "numba")
    assert status == 2
    assert_one_error_line(err, "driver too old", "cu12")


def test_bad_option_values(tiny_gguf, capsys):
    status, _, err = run_cli(capsys, "hi", "--model", str(tiny_gguf), "--backend", "torch",
                             "--kv-cache-mib", "0.0001", "--no-chat")
    assert status == 2
    assert_one_error_line(err)


def test_ctrl_c(monkeypatch, capsys):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(pt, "load_model", interrupted)
    status, _, err = run_cli(capsys, "hi", "--backend", "torch")
    assert status == 130
    assert_one_error_line(err, "interrupted")


def test_a_korean_prompt_to_an_english_only_model_gets_a_pointer(tiny_gguf, capsys):
    status, _, err = run_cli(capsys, "한국의 수도는?", "--model", str(tiny_gguf), "--backend",
                             "torch", "--no-chat", "--max-tokens", "1")
    assert status == 0
    notes = [line for line in err if "kanana-nano-2.1b" in line]
    assert len(notes) == 1 and notes[0].startswith("warning:")
    status, _, err = run_cli(capsys, "abc", "--model", str(tiny_gguf), "--backend", "torch",
                             "--no-chat", "--max-tokens", "1")
    assert not any("kanana" in line for line in err)
