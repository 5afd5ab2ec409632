"""``measure.step_profile`` on the CPU: kernel names shortened and the profiler's events summed
per kernel (the profiling itself needs a GPU)."""

from __future__ import annotations

import types

import pytest
import torch

from paged_tutorial.measure import step_profile


def test_numba_names_are_cut_to_the_python_function():
    mangled = "_ZN6cudapy14paged_tutorial8backends22paged_attention_kernelB3v12E5ArrayIfLi1E"
    assert step_profile.short_name(mangled) == "numba:paged_attention_kernel"
    assert step_profile.short_name("_ZN8rms_normE") == "numba:rms_norm"
    demangled = "cudapy::paged_tutorial::backends::rms_norm_kernel[abi:v1](Array<float>)"
    assert step_profile.short_name(demangled) == "numba:rms_norm_kernel"
    assert step_profile.short_name("ampere_bf16_gemm" + "x" * 200) == ("ampere_bf16_gemm"
                                                                       + "x" * 104)


def event(name, us, device=torch.autograd.DeviceType.CUDA):
    return types.SimpleNamespace(name=name, device_type=device,
                                 time_range=types.SimpleNamespace(elapsed_us=lambda: us))


def test_the_kernel_table_sums_gpu_events_per_kernel_and_sorts_by_total(monkeypatch):
    monkeypatch.setattr(step_profile, "TOP", 2)
    events = [event("_ZN4gemvE", 10.0), event("_ZN4gemvE", 30.0), event("sdpa", 25.0),
              event("_ZN8rms_normE", 1.5), event("aten::mm", 500.0, torch.autograd.DeviceType.CPU)]
    table = step_profile.kernel_table(types.SimpleNamespace(events=lambda: events))
    assert table["by_kernel"] == [
        {"name": "numba:gemv", "calls": 2, "total_us": 40.0, "mean_us": 20.0},
        {"name": "sdpa", "calls": 1, "total_us": 25.0, "mean_us": 25.0}]
    assert table["other_kernels_us"] == 1.5                # past TOP, counted apart
    assert table["kernels"] == 4 and table["kernel_ms"] == pytest.approx(0.0665)
