"""The command line's serving-tool options: ``--json``, prompts from ``-f FILE`` and standard
input, ``--system``; parsing without heavy imports (so ``--help`` and option errors answer at
once); its own name as ``paged-tutorial``; the ``serve`` subcommand; a standard error that
cannot be written; the decode rate as a plain number; the loading line only for a model that
is there.

Models are tiny GGUF files (2 layers, byte-level tokenizer) with a small chat template."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import paged_tutorial as pt
from helpers.child_env import child_env
from helpers.fixtures_loading import tiny_config, write_tiny_gguf
from paged_tutorial.cli import main, options, timing
from paged_tutorial.loading.models import random_model

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}assistant: {% endif %}")
FAST = ["--backend", "torch", "--dtype", "float32", "--no-progress", "--seed", "0"]
HEAVY = ("torch", "numpy", "numba", "transformers", "tokenizers", "jinja2")


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli_options") / "tiny.gguf"
    return write_tiny_gguf(path, random_model(tiny_config(vocab_size=320), seed=3),
                           metadata={"tokenizer.chat_template": TEMPLATE})


@pytest.fixture(scope="module")
def engine(tiny_gguf):
    return pt.Engine(pt.load_model(tiny_gguf, "float32"), backend="torch", max_slots=2)


def env() -> dict:
    return child_env(LC_ALL="C.UTF-8", PYTHONUTF8="0")


def cli(*argv, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "paged_tutorial", *argv], capture_output=True,
                          text=True, env=env(), timeout=300, cwd=ROOT, **kwargs)


# --- nothing heavy before the arguments are parsed ---------------------------------------------

def imported_modules(*argv) -> set[str]:
    """The top-level modules ``python -X importtime -m paged_tutorial ARGV`` imported."""
    run = subprocess.run([sys.executable, "-X", "importtime", "-m", "paged_tutorial", *argv],
                         capture_output=True, text=True, env=env(), timeout=120, cwd=ROOT)
    lines = [line.split("|")[-1] for line in run.stderr.splitlines()
             if line.startswith("import time:")]
    return {line.strip().split(".")[0] for line in lines}


@pytest.mark.parametrize("argv", [["--help"], ["hi", "--temperature", "nan"], ["--chat", "x"],
                                  [], ["hi", "--backend", "tpu"]],
                         ids=["help", "bad-number", "bad-combination", "no-prompt",
                              "bad-choice"])
def test_help_and_option_errors_import_nothing_heavy(argv):
    modules = imported_modules(*argv)
    assert "paged_tutorial" in modules and "argparse" in modules, modules
    assert not modules & set(HEAVY), modules & set(HEAVY)


def test_parsing_in_process_leaves_heavy_modules_unimported():
    code = ("import sys; from paged_tutorial.cli import options; "
            "options.parse(['hi', '--json', '--max-slots', '3']); "
            f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env(), timeout=120, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"


def test_defaults_read_from_source_equal_the_imported_apis():
    import dataclasses
    import inspect

    engine = inspect.signature(pt.Engine.__init__).parameters
    fields = {f.name: f.default for f in dataclasses.fields(pt.SamplingParams)}
    assert options.api_defaults() == {
        "max_slots": engine["max_slots"].default, "max_seq_len": engine["max_seq_len"].default,
        **{name: fields[name] for name in ("max_tokens", "temperature", "top_p", "seed")}}


def test_backend_help_is_the_registrys():
    from paged_tutorial.backends import BACKENDS

    assert options.backend_help() == {name: entry.help for name, entry in BACKENDS.items()}


# --- its name --------------------------------------------------------------------------------

def test_usage_line_names_the_installed_command():
    code = ("import sys; sys.argv[0] = '/somewhere/bin/paged-tutorial'; "
            "from paged_tutorial.__main__ import main; sys.exit(main())")
    run = subprocess.run([sys.executable, "-c", code, "--help"], capture_output=True,
                         text=True, env=env(), timeout=120, cwd=ROOT)
    assert run.returncode == 0 and run.stdout.startswith("usage: paged-tutorial "), run.stdout
    assert "python -m" not in run.stdout
    run = cli("--help")
    assert run.stdout.startswith("usage: python -m paged_tutorial "), run.stdout


@pytest.mark.skipif(shutil.which("paged-tutorial") is None, reason="the package's console "
                    "script is not installed in this environment")
def test_the_installed_command_says_its_own_name():
    run = subprocess.run(["paged-tutorial", "--no-such-option"], capture_output=True,
                         text=True, env=env(), timeout=120, cwd=ROOT)
    assert run.returncode == 2
    assert run.stderr.startswith("usage: paged-tutorial "), run.stderr
    assert "paged-tutorial: error: unrecognized arguments: --no-such-option" in run.stderr


# --- serve ------------------------------------------------------------------------------------

def test_serve_options_reach_the_server(monkeypatch):
    """``serve`` is parsed by the same parser module as the main command: engine options,
    limits and backends alike; the server's own options arrive as the parsed namespace."""
    from paged_tutorial.cli import serve as serve_command

    seen = []
    monkeypatch.setattr(serve_command, "run_serve", lambda args, err=None: seen.append(args) or 7)
    monkeypatch.setenv(options.API_KEY_ENV, "from-env")
    assert main.main(["serve", "--port", "0", "--model", "x", "--threads", "3",
                      "--max-body-bytes", "2048", "--limit-concurrency", "9",
                      "--timeout-keep-alive", "2.5", "--body-timeout", "4"]) == 7
    args, = seen
    assert (args.command, args.port, args.model, args.threads) == ("serve", 0, "x", 3)
    assert (args.max_body_bytes, args.limit_concurrency, args.timeout_keep_alive,
            args.body_timeout) == (2048, 9, 2.5, 4.0)
    assert args.api_key == "from-env"
    assert options.parse(["serve", "--api-key", "k"]).api_key == "k"
    defaults = options.parse(["serve"])
    assert (defaults.max_body_bytes, defaults.limit_concurrency, defaults.timeout_keep_alive,
            defaults.body_timeout, defaults.max_slots) == (2 ** 20, 512, 5.0, 30.0, 8)


@pytest.mark.parametrize("argv", [["serve", "--max-seq-len", str(2 ** 24 + 1)],
                                  ["serve", "--backend", "tpu"], ["serve", "--threads", "0"],
                                  ["hi", "--threads", "0"]])
def test_serve_and_the_main_command_share_their_limits(argv, capsys):
    with pytest.raises(SystemExit) as info:
        options.parse(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    prog = "python -m paged_tutorial" + (" serve" if argv[0] == "serve" else "")
    assert err.startswith(f"usage: {prog} ")


def test_serve_help_names_the_subcommand_and_every_backend():
    """Run as the installed command, ``serve --help`` says ``paged-tutorial serve``; its
    backends are the registry's, with the registry's help; it answers without torch."""
    code = ("import sys, time; sys.argv[0] = '/somewhere/bin/paged-tutorial'; "
            "from paged_tutorial.__main__ import main\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            f"print('HEAVY', sorted(m for m in {HEAVY!r} if m in sys.modules))")
    run = subprocess.run([sys.executable, "-c", code, "serve", "--help"], capture_output=True,
                         text=True, env=env(), timeout=120, cwd=ROOT)
    assert run.stdout.startswith("usage: paged-tutorial serve "), run.stdout
    assert "HEAVY []" in run.stdout
    from paged_tutorial.backends import BACKENDS

    flat = " ".join(run.stdout.split())
    for name, entry in BACKENDS.items():
        assert f"{name} {' '.join(entry.help.split())}" in flat, name
    for option in ("--threads", "--api-key", "--max-body-bytes", "--limit-concurrency",
                   "--timeout-keep-alive", "--body-timeout", "--drain-timeout"):
        assert option in run.stdout


def test_serve_is_dispatched_lazily(monkeypatch):
    """The dispatch imports the server only for ``serve`` (a prompt "serve" is no prompt: it
    is the subcommand, as for vllm and llama.cpp's server)."""
    calls = []
    monkeypatch.setattr(main, "serve", lambda argv: calls.append(argv) or 0)
    assert main.main(["serve", "--help"]) == 0 and calls == [["--help"]]


# --- --json, -f FILE, standard input, --system ------------------------------------------------

def test_json_is_one_object_per_answer(tiny_gguf, engine, capsys):
    status = main.main(["ab", "xyz", "--json", "--no-chat", "--model", str(tiny_gguf), *FAST,
                        "--max-tokens", "5"])
    out, err = capsys.readouterr()
    assert status == 0, err
    lines = out.splitlines()
    objects = [json.loads(line) for line in lines]
    expected = engine.generate(["ab", "xyz"], max_tokens=5, chat=False, seed=0)
    assert sorted(o["index"] for o in objects) == [0, 1] and len(lines) == 2
    for o in objects:
        result = expected[o["index"]]
        assert o["prompt"] == ["ab", "xyz"][o["index"]]
        assert o["text"] == result.text and o["token_ids"] == result.token_ids
        assert o["finish_reason"] == result.finish_reason
        assert o["prompt_tokens"] == len(result.prompt_token_ids) and o["seed"] == 0
        t = o["timings"]
        assert set(t) == {"load_s", "compile_s", "first_token_s", "total_s",
                          "decode_tokens_per_s"}
        assert t["load_s"] > 0 and t["first_token_s"] > 0 and t["total_s"] >= t["first_token_s"]


def test_prompt_from_a_file_and_from_standard_input(tiny_gguf, engine, tmp_path):
    prompt = "a prompt\nover two lines"
    (tmp_path / "prompt.txt").write_text(prompt + "\n", encoding="utf-8")
    expected = engine.generate([prompt], max_tokens=4, chat=False, seed=0)[0].text
    by_file = cli("-f", str(tmp_path / "prompt.txt"), "--no-chat", "--model", str(tiny_gguf),
                  *FAST, "--max-tokens", "4")
    by_stdin = cli("-", "--no-chat", "--model", str(tiny_gguf), *FAST, "--max-tokens", "4",
                   input=prompt + "\n")
    by_stdin_f = cli("-f", "-", "--no-chat", "--model", str(tiny_gguf), *FAST,
                     "--max-tokens", "4", input=prompt)
    for run in (by_file, by_stdin, by_stdin_f):
        assert run.returncode == 0, run.stderr
        assert run.stdout == expected + "\n"


def test_prompt_files_that_cannot_be_read(tmp_path, capsys):
    (tmp_path / "latin1.txt").write_bytes(b"caf\xe9")
    for argv, words in [(["-f", str(tmp_path / "missing.txt")], "missing.txt: no such file"),
                        (["-f", str(tmp_path)], "is a folder"),
                        (["-f", str(tmp_path / "latin1.txt")], "not UTF-8 text (byte 0xE9 at "
                                                               "offset 3)")]:
        assert main.main([*argv, "--backend", "torch"]) == 2
        err = capsys.readouterr().err
        errors = [line for line in err.splitlines() if "error:" in line]
        assert len(errors) == 1 and words in errors[0], err
        assert not any(line.startswith("loading") for line in err.splitlines())


def test_system_message_goes_through_the_chat_template(tiny_gguf, engine):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    ids = engine.model.tokenizer.apply_chat_template(messages)
    expected = engine.generate([ids], max_tokens=4, seed=0)[0].text
    run = cli("hi", "--system", "be brief", "--model", str(tiny_gguf), *FAST,
              "--max-tokens", "4")
    assert run.returncode == 0, run.stderr
    assert run.stdout == expected + "\n"
    assert engine.model.tokenizer.decode(ids).startswith("system: be brief\nuser: hi\n")


@pytest.mark.parametrize("argv, words", [
    (["--chat", "hi"], "--chat reads its prompts from the terminal"),
    (["--chat", "--json"], "--json prints one object per answer"),
    (["--chat", "--no-chat"], "--chat needs the chat template"),
    (["hi", "--system", "x", "--no-chat"], "--system is a message for the chat template"),
    (["-", "-f", "-"], "standard input ('-') can give only one prompt"),
    ([], "no prompt"),
])
def test_combinations_that_cannot_work_are_argparse_errors(capsys, argv, words):
    with pytest.raises(SystemExit) as info:
        main.main(argv)
    assert info.value.code == 2
    assert words in capsys.readouterr().err


# --- standard error that cannot be written ----------------------------------------------------

@pytest.mark.parametrize("stderr", ["/dev/full", "closed"])
def test_an_unwritable_stderr_still_answers(tiny_gguf, engine, stderr):
    expected = engine.generate(["abc"], max_tokens=6, chat=False, seed=0)[0].text
    command = " ".join([sys.executable, "-m", "paged_tutorial", "abc", "--no-chat", "--model",
                        str(tiny_gguf), *FAST, "--max-tokens", "6"])
    redirect = "2>/dev/full" if stderr == "/dev/full" else "2>&-"
    run = subprocess.run(["bash", "-c", f"{command} {redirect}"], capture_output=True,
                         text=True, env=env(), timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    assert run.stdout == expected + "\n"
    assert run.stderr == ""


def test_diagnostics_are_dropped_once_stderr_fails():
    from paged_tutorial.cli.streams import Diagnostics

    class Full(io.StringIO):
        def write(self, text):
            raise OSError(28, "No space left on device")

    err = Diagnostics(Full())
    assert err.write("one\n") == 4 and err.broken and not err.isatty()
    err.write("two\n")
    err.flush()
    assert Diagnostics(None).write("x") == 1


# --- the figures after an answer --------------------------------------------------------------

@pytest.mark.parametrize("rate, text", [(1110.4, "1110"), (123456.0, "123456"), (690.2, "690"),
                                        (12.34, "12.3"), (10.0, "10"), (0.25, "0.25"),
                                        (0.00001, "0.0000")])
def test_the_decode_rate_is_a_plain_number(rate, text):
    assert timing.plain_rate(rate) == text
    result = SimpleNamespace(token_ids=list(range(11)), time_to_first_token_s=0.5,
                             total_time_s=0.5 + 10 / rate)
    assert timing.StartTiming().report(result).endswith(f", {text} tok/s decode")


def test_the_loading_line_comes_only_after_the_model_is_found(tmp_path, capsys):
    status = main.main(["hi", "--model", str(tmp_path / "missing.gguf"), "--backend", "torch"])
    err = capsys.readouterr().err
    assert status == 2
    assert not any(line.startswith("loading") for line in err.splitlines()), err
    assert "no model at" in err
