"""Measuring the engine: the timing and result-writing code behind ``benchmarks/*.py`` and
notebook 08's "time it on your GPU".

- ``gpu_timers.py``: median milliseconds of a GPU function, by CUDA events or by replaying a
  captured CUDA graph on rotating inputs.
- ``wall_clock.py``: host time: one call, the median of synchronized calls, a burst of calls,
  the fastest of several runs by CPU time.
- ``gpu_machine.py``: the GPU being measured (name, memory, versions) and its two ceilings, the
  copy bandwidth and the bf16 matmul rate, measured in the same run.
- ``comparison.py``: the relative error of one result against a reference.
- ``result_files.py``: where a run's JSON goes.
- ``sanitizer_report.py``: compute-sanitizer's racecheck report read as data.
- ``racecheck.py``: compute-sanitizer's racecheck over the article's kernel layouts (and hers).
- ``table_copy.py``: the article's whole-table copies against changed-entries-only sync.
- ``decode_ladder.py``: the whole engine's decode (and prefill) beside HF on the GPU, and the
  decode ladder, from host launches to the engine, that notebook 08 draws.
- ``attention_bench.py``: paged decode and prefill attention, every kernel beside the copy floor.
- ``kernel_bench.py``: the small kernels and the GEMV against bandwidth and cuBLAS.
- ``step_profile.py``: one engine step's kernels (torch.profiler) and the host's cost per launch.
- ``prefix_sharing_workload.py``, ``prefix_sharing_bench.py``: requests sharing a system
  prompt, with prefix caching off and on.

The scripts in ``benchmarks/`` parse their arguments and call these.
"""
