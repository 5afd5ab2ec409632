"""``measure.racecheck`` and ``measure.sanitizer_report``: the reading of compute-sanitizer's
racecheck report (both report modes, on lines of the real ``attention.py``), and the dry run,
which runs the article's layout and the port's in the simulator through the same child
processes the GPU run uses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from paged_tutorial.backends.numba_cuda.kernels import attention
from paged_tutorial.measure import racecheck
from paged_tutorial.measure import sanitizer_report


def line_of(code: str) -> int:
    lines = Path(attention.__file__).read_text().splitlines()
    return next(i for i, line in enumerate(lines, start=1) if code in line)


def analysis_report(kernel="paged_attention_kernel",
                    where="/site/paged_tutorial/backends/numba_cuda/kernels/attention.py"):
    publish = line_of("dot_products[thread_id // WARP_SIZE] = qk")
    read = line_of("return dot_products[0]")
    write_back = line_of("dot_products[0] = combine_warps(")
    return f"""========= COMPUTE-SANITIZER
========= Error: Race reported between Write access at {kernel}+0x1a0 in {where}:{publish}:{kernel}
=========     and Read access at {kernel}+0x2f0 in {where}:{read}:{kernel} [192 hazards]
=========
========= Error: Race reported between Write access at {kernel}+0x220 in {where}:{write_back}:{kernel}
=========     and Read access at {kernel}+0x2f0 in {where}:{read}:{kernel} [64 hazards]
=========
========= RACECHECK SUMMARY: 2 hazards displayed (2 errors, 0 warnings)
"""


def test_analysis_mode_counts_hazards_per_shared_cell():
    parsed = sanitizer_report.parse_report(analysis_report(), sanitizer_report.kernel_source_lines())
    assert parsed["summary"] == {"displayed": 2, "errors": 2, "warnings": 0}
    assert parsed["hazards"] == 256 and parsed["counted_from"].startswith("races")
    assert parsed["by_cell"] == {"dot_products[0]": 256}
    first = parsed["races"][0]
    assert first["first"]["op"] == "Write" and first["second"]["op"] == "Read"
    assert first["second"]["code"] == "return dot_products[0]"
    assert first["first"]["file"] == "attention.py"


def test_hazard_mode_names_the_element_from_the_writing_thread():
    publish = line_of("dot_products[thread_id // WARP_SIZE] = qk")
    read = line_of("return dot_products[0]")
    text = "\n".join(
        f"""========= Error: Potential WAR hazard detected at __shared__ 0x{byte} in block (1,7,0) :
=========     Read Thread (40,0,0) at paged_attention_kernel+0x2f0 in attention.py:{read}:k
=========     Write Thread (0,0,0) at paged_attention_kernel+0x1a0 in attention.py:{publish}:k
=========     Current Value : 0, Incoming Value : 0""" for byte in range(4))
    text += "\n========= RACECHECK SUMMARY: 4 hazards displayed (4 errors, 0 warnings)\n"
    parsed = sanitizer_report.parse_report(text, sanitizer_report.kernel_source_lines())
    assert parsed["hazards"] == 4 and parsed["counted_from"].startswith("single")
    assert parsed["by_cell"] == {"dot_products[0]": 4}
    assert parsed["single_hazard_kinds"] == {"WAR": 4}
    assert set(parsed["single_hazard_offsets"]) == {"0x0", "0x1", "0x2", "0x3"}
    example = parsed["single_hazard_examples"][0]
    assert example["block"] == [1, 7, 0] and example["accesses"][1]["thread"] == [0, 0, 0]


def test_warp_level_warnings_are_read_too():
    read = line_of("return dot_products[0]")
    publish = line_of("dot_products[thread_id // WARP_SIZE] = qk")
    text = f"""========= WARN:(Warp Level Programming) Potential WAR hazard detected at __shared__ 0x0 in block (0, 0, 0) :
=========     Read Thread (33, 0, 0) at 0x00000170 in /x/attention.py:{read}:paged_attention_kernel
=========     Write Thread (0, 0, 0) at 0x000001a8 in /x/attention.py:{publish}:paged_attention_kernel
=========     Current Value : 0, Incoming Value : 0
========= RACECHECK SUMMARY: 1 hazard displayed (0 errors, 1 warning)
"""
    parsed = sanitizer_report.parse_report(text, sanitizer_report.kernel_source_lines())
    assert parsed["summary"] == {"displayed": 1, "errors": 0, "warnings": 1}
    assert parsed["by_cell"] == {"dot_products[0]": 1}
    assert parsed["single_hazard_examples"][0]["severity"] == "WARN"


def test_a_clean_report_and_other_kernels():
    clean = "========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)\n"
    parsed = sanitizer_report.parse_report(clean, sanitizer_report.kernel_source_lines())
    assert parsed["hazards"] == 0 and parsed["by_cell"] == {}
    assert parsed["summary"]["displayed"] == 0
    other = sanitizer_report.parse_report(analysis_report(kernel="reduce_kernel", where="Reduce.cuh"),
                                   sanitizer_report.kernel_source_lines())
    assert other["by_cell"] == {sanitizer_report.OUTSIDE: 256}
    assert sanitizer_report.parse_report("no summary at all", {})["summary"] is None


def test_the_gpu_command_names_both_layouts():
    assert racecheck.LAYOUTS == {"article": "article", "port": "own"}
    for layout in racecheck.LAYOUTS:
        command = racecheck.sanitizer_command(layout)
        assert command.startswith("compute-sanitizer --tool racecheck")
        assert command.endswith(f"--child {layout}")


MY_PART = '''
def my_score(q_val, k, thread_id, scale, dot_products, score):
    qk = q_val * k
    for offset in (16, 8, 4, 2, 1):
        qk += cuda.shfl_down_sync(WARP_FULL_MASK, qk, offset)
    if thread_id % WARP_SIZE == 0:
        dot_products[thread_id // WARP_SIZE] = qk
    cuda.syncthreads()
    if thread_id == 0:
        total = float32(0.0)
        for w in range(NUM_WARPS):
            total += dot_products[w]
        score[0] = total * scale
    cuda.syncthreads()
    return score[0]
'''


def test_a_readers_part_is_loaded_from_its_file(tmp_path):
    mine = tmp_path / "mine.py"
    mine.write_text(MY_PART)
    name, fn = racecheck.load_part(f"{mine}:my_score=token_score")
    assert name == "token_score" and fn.__name__ == "my_score"
    assert racecheck.load_part(f"{mine}:my_score")[0] == "my_score"
    with pytest.raises(SystemExit, match="FILE.py:FUNCTION"):
        racecheck.load_part("mine:my_score")
    with pytest.raises(SystemExit, match="no function 'other'"):
        racecheck.load_part(f"{mine}:other")
    command = racecheck.sanitizer_command("yours", part=f"{mine}:my_score=token_score")
    assert command.endswith(f"--child yours --part {mine}:my_score=token_score")
    assert "mine.py" in sanitizer_report.kernel_source_lines(f"{mine}:my_score")


def test_dry_run_runs_both_layouts_and_a_readers_part_in_the_simulator(tmp_path):
    mine = tmp_path / "mine.py"
    mine.write_text(MY_PART)
    part = f"{mine}:my_score=token_score"
    returned = racecheck.run(dry_run=True, part=part, out=tmp_path)
    assert racecheck.failed_layouts(returned) == []
    (path,) = tmp_path.glob("racecheck-dryrun-*.json")
    data = json.loads(path.read_text())
    assert data == returned
    assert data["dry_run"] is True and data["sanitizer"] is None
    assert set(data["layouts"]) == {"article", "port", "yours"} and data["part"] == part
    assert data["layouts"]["yours"]["parts_replaced"] == ["token_score"]
    assert data["layouts"]["article"]["parts_replaced"] == ["token_score"]
    assert data["layouts"]["port"]["parts_replaced"] == []
    for name, layout in data["layouts"].items():
        assert layout["returncode"] == 0, layout
        assert layout["device"] == "simulator" and layout["agrees_with_oracle"], layout
        assert layout["hazards"] is None and "dry run" in layout["note"]
    assert data["layouts"]["article"]["score_cell"] == "article"
    assert data["layouts"]["port"]["score_cell"] == "own"


def test_a_notebook_function_becomes_a_part_spec(tmp_path):
    from paged_tutorial.teaching.chapters.ch05_online_softmax.races import part_spec

    namespace = {}
    exec(compile(MY_PART, str(tmp_path / "cell.py"), "exec"), namespace)
    (tmp_path / "cell.py").write_text(MY_PART)        # inspect reads the source from the file
    spec = part_spec(namespace["my_score"], tmp_path)
    assert spec.endswith("reader_part.py:my_score=token_score")
    name, fn = racecheck.load_part(spec)
    assert name == "token_score" and fn.__name__ == "my_score"
