"""course_utils.runtime.env: the environment table and the backend plan."""
import sys

import pytest

import course_utils.runtime.launch as L
from course_utils.runtime import env


def test_table_lists_machine_and_plan():
    text = env.table((1, 4))
    for label in ("running in", "python", "torch", "CPU cores", "GPUs", "ranks start by",
                  "demo, 1 rank", "demo, 4 ranks"):
        assert label in text
    assert "gloo on CPU" in text
    assert len(text.splitlines()) == 9


def test_detect_reads_this_machine():
    import torch

    e = env.detect()
    assert e.torch == torch.__version__ and e.cpu_count >= 1
    assert e.gpu_count == len(e.gpus) == torch.cuda.device_count()
    assert not torch.cuda.is_initialized()  # reading the environment must not init CUDA


def test_plan_follows_the_gpu_count(monkeypatch):
    monkeypatch.setattr(L, "gpu_count", lambda: 4)
    assert env.plan((1, 4, 8)) == [(1, "nccl"), (4, "nccl"), (8, "gloo")]
    monkeypatch.setattr(L, "gpu_count", lambda: 0)
    assert env.plan(2) == [(2, "gloo")]
    with pytest.raises(TypeError):
        env.plan(None)
    with pytest.raises(ValueError):
        env.plan((0,))


def test_colab_is_detected(monkeypatch):
    assert env.in_colab() is False
    monkeypatch.setitem(sys.modules, "google.colab", object())
    assert env.in_colab() is True
    assert env.detect().where == "Google Colab"


def test_table_shows_gpus_by_name():
    e = env.Environment("x", "3.11", "2.13", "Linux", 16, 2, ("NVIDIA H100", "NVIDIA H100"), "fork")
    assert "2 (NVIDIA H100, NVIDIA H100)" in env.table((1,), env=e)
