"""Measuring the engine: the timing and result-writing code behind ``benchmarks/*.py`` and
notebook 08's "time it on your GPU".

- ``gpu_timers.py``: median milliseconds of a GPU function, by CUDA events or by replaying a
  captured CUDA graph.
- ``gpu_machine.py``: the GPU being measured (name, memory, versions) and its two ceilings, the
  copy bandwidth and the bf16 matmul rate, measured in the same run.
- ``comparison.py``: the relative error of one result against a reference.
- ``result_files.py``: where a run's JSON goes.
- ``decode_ladder.py``: the whole engine's decode (and prefill) beside HF on the GPU, and the
  decode ladder, from host launches to the engine, that notebook 08 draws.

The scripts in ``benchmarks/`` parse their arguments and call these.
"""
