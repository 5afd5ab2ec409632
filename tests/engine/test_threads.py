"""torch's CPU thread count (``threads.py``): the user's choice wins, the automatic one leaves the
cores other processes use, the engine sets it in whichever thread steps it, and bad input is
refused.  Each scenario runs in a fresh interpreter, since torch's count is process-wide."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from paged_tutorial import threads


def run_fresh(code: str, **env) -> str:
    environ = {k: v for k, v in os.environ.items()
               if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    environ.update(env)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=300, env=environ)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip()


@pytest.mark.parametrize("cores, busy, want", [
    (2, 0.0, 2), (2, 0.1, 2), (2, 1.0, 1), (2, 0.5, 1), (2, 2.5, 1),
    (4, 1.0, 3), (16, 1.0, threads.MOST_AUTOMATIC), (1, 0.0, 1)])
def test_the_automatic_count_leaves_the_cores_others_keep_busy(cores, busy, want):
    assert threads.threads_for(cores, busy) == want


@pytest.mark.parametrize("bad, error", [(0, ValueError), (-2, ValueError), ("2", TypeError),
                                        (1.5, TypeError), (True, TypeError)])
def test_a_thread_count_that_is_not_a_positive_whole_number_is_refused(bad, error):
    with pytest.raises(error, match="threads"):
        threads.configure_threads(bad)


def test_the_busy_cores_counted_are_the_others_not_ours(monkeypatch):
    """Others' load is the cores' busy time less this process's own, per second of wall time:
    our own threads never count against us."""
    clock = iter([10.0, 12.0, 13.0])
    busy = iter([100.0, 103.0, 104.0])          # the cores' busy seconds since boot
    own = iter([5.0, 6.0, 7.0])                 # this process's CPU seconds
    monkeypatch.setattr(threads.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(threads, "cpu_busy_seconds", lambda cores: next(busy))
    monkeypatch.setattr(threads, "own_cpu_seconds", lambda: next(own))
    watch = threads.CoreWatch()
    assert watch.busy_elsewhere() == pytest.approx((3 - 1) / 2)    # a busy core beside us
    assert watch.busy_elsewhere() == pytest.approx(0.0)            # only our own work


def test_the_cores_busy_time_is_read_from_proc_stat():
    seconds = threads.cpu_busy_seconds(threads.usable_cores())
    if seconds is None:
        pytest.skip("no /proc/stat on this system")
    assert seconds > 0


def test_an_argument_is_kept_and_set_in_the_thread_that_steps_the_engine():
    out = run_fresh("""
        import threading, torch
        import paged_tutorial as pt
        from paged_tutorial.threads import current_choice
        llm = pt.LLM("smollm2-135m", threads=1)
        seen = []
        def step():
            llm.generate("Hi", pt.SamplingParams(max_tokens=2))
            seen.append(torch.get_num_threads())
        worker = threading.Thread(target=step)
        worker.start(); worker.join()
        llm.generate("Hi", pt.SamplingParams(max_tokens=2))
        print(current_choice().source, seen[0], torch.get_num_threads())
    """)
    assert out == "argument 1 1"


def test_the_environment_and_an_explicit_torch_call_are_respected():
    env_out = run_fresh("""
        import torch
        from paged_tutorial.threads import configure_threads, current_choice
        print(configure_threads(), current_choice().source)
    """, OMP_NUM_THREADS="1")
    assert env_out == "1 environment"
    # the user's count differs from the automatic one (which depends on the machine's load)
    # and from torch's defaults: only such a call can be told from none
    call_out = run_fresh("""
        import torch
        from paged_tutorial import threads
        chosen = threads.configure_threads()
        mine = min(n for n in range(2, 64) if n != chosen and n not in threads.torch_defaults())
        torch.set_num_threads(mine)
        threads.adapt_threads()
        print(torch.get_num_threads() == mine, threads.current_choice().source)
    """)
    assert call_out == "True torch.set_num_threads"


def test_a_count_set_before_the_package_chose_is_kept_unless_it_is_torchs_default():
    """A notebook's ``torch.set_num_threads`` before loading a model: kept when it is a choice
    (a count torch would not start with), replaced by the automatic choice when it is torch's
    own default."""
    chosen = next(n for n in (3, 5, 7) if n not in threads.torch_defaults())
    out = run_fresh(f"""
        import torch
        torch.set_num_threads({chosen})
        import paged_tutorial as pt
        from paged_tutorial.threads import configure_threads, current_choice
        print(configure_threads(), current_choice().source)
    """)
    assert out == f"{chosen} torch.set_num_threads"
    default = max(threads.torch_defaults())
    out = run_fresh(f"""
        import torch
        torch.set_num_threads({default})
        from paged_tutorial.threads import configure_threads, current_choice
        print(current_choice(), configure_threads() >= 1, current_choice().source)
    """)
    assert out == "None True automatic"


def test_a_cpu_engine_chooses_automatically_and_is_followed_before_steps():
    out = run_fresh("""
        import torch
        import paged_tutorial as pt
        from paged_tutorial import threads
        threads.LOOK_EVERY_S = 0.0
        looks = []
        automatic = threads.POLICY.automatic
        threads.POLICY.automatic = lambda: looks.append(1) or automatic()
        model = pt.load_model("smollm2-135m", dtype="float32", device="cpu")
        engine = pt.Engine(model, backend="torch", device="cpu", max_slots=1, max_seq_len=64)
        choice = threads.current_choice()
        engine.generate(["Hi"], pt.SamplingParams(max_tokens=3))
        print(choice.source, 1 <= choice.threads <= len(threads.usable_cores()), len(looks) > 2)
    """)
    assert out == "automatic True True"


def test_fixed_threads_holds_a_count_for_a_block_and_gives_the_choice_back():
    """Inside the block every engine step runs on the fixed count, whatever was chosen; after
    it the previous choice is in force again, as the user's or the package's, not as a count
    someone set by hand."""
    out = run_fresh("""
        import torch
        import paged_tutorial as pt
        from paged_tutorial import threads
        engine = pt.Engine(pt.random_model(pt.ModelConfig(vocab_size=32, hidden_size=16,
            intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
            num_key_value_heads=1, head_dim=8, max_position_embeddings=64), seed=0),
            backend="torch", max_slots=1, max_seq_len=32)
        threads.configure_threads(3)
        seen = []
        with threads.fixed_threads(2) as n:
            engine.generate([[1, 2, 3]], max_tokens=2,
                            on_step=lambda report: seen.append(torch.get_num_threads()))
        engine.generate([[1, 2, 3]], max_tokens=1)
        print(n, set(seen), torch.get_num_threads(), threads.current_choice())
    """)
    assert out == "2 {2} 3 ThreadChoice(threads=3, source='argument')"


def test_a_grader_runs_on_one_thread():
    """Graders compare engine runs bit for bit, and two-thread GEMMs may differ in the last
    bit from run to run: every grading runs on one thread, and the count is given back."""
    out = run_fresh("""
        import dataclasses, torch
        from paged_tutorial import threads
        from paged_tutorial.teaching.chapters import puzzle
        threads.configure_threads(3)
        seen = []
        counting = dataclasses.replace(
            puzzle("06.allocator"),
            grader=lambda answer: seen.append(torch.get_num_threads()) or "ok")
        verdict = counting._run_grader(lambda: None)
        print(verdict.status, seen, torch.get_num_threads())
    """)
    assert out == "correct [1] 3"
