"""compat: the oldest torch, and what differs between the torch versions supported."""
import subprocess
import sys

import pytest
import torch

from course_utils.runtime import compat


@pytest.mark.parametrize("version", ["2.10.0", "2.10.0+cu128", "2.13.0+cpu", "2.14.0a0+git1234",
                                     "3.0.0", "nightly"])
def test_supported_or_unreadable_versions_pass(version):
    compat.require_supported_torch(version)


@pytest.mark.parametrize("version", ["2.9.1", "2.6.0+cu124", "1.13.1"])
def test_an_older_torch_gets_one_sentence_naming_the_torch_to_install(version):
    with pytest.raises(ImportError) as info:
        compat.require_supported_torch(version)
    message = str(info.value)
    assert f"this is torch {version}" in message
    assert "pip install 'torch>=2.10'" in message and message.count(". ") == 0


def test_this_torch_is_supported_and_bad_input_is_a_type_error():
    compat.require_supported_torch()
    assert compat.MIN_TORCH == (2, 10)
    with pytest.raises(TypeError, match="version must be a string"):
        compat.require_supported_torch((2, 9))


def test_importing_the_package_on_an_older_torch_fails_at_once():
    code = "import torch; torch.__version__ = '2.9.1'; import course_utils"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last == ("ImportError: ZeRO to FSDP needs torch >= 2.10, and this is torch 2.9.1: "
                    "run `pip install 'torch>=2.10'` and restart the kernel.")


def test_collective_names_are_those_of_this_torch():
    import torch.distributed as dist

    assert hasattr(dist, compat.ALL_GATHER_NAME) and hasattr(dist, compat.REDUCE_SCATTER_NAME)
    assert compat.HAS_SINGLE_NAMES == (compat.ALL_GATHER_NAME == "all_gather_single")
    assert torch.__version__ >= "2.13" or not compat.HAS_SINGLE_NAMES


def test_fsdp2_param_group_reads_both_torch_layouts(monkeypatch):
    """torch 2.13 keeps a list of param groups on a fully_shard state, torch 2.11 (Colab's) one
    group or None: both give the unit's group (07's labs read it on Colab's torch)."""
    from types import SimpleNamespace

    from torch.distributed.fsdp import fully_shard

    group = object()
    for state, want in ((SimpleNamespace(_fsdp_param_groups=[group]), group),
                        (SimpleNamespace(_fsdp_param_groups=[]), None),
                        (SimpleNamespace(_fsdp_param_group=group), group),
                        (SimpleNamespace(_fsdp_param_group=None), None)):
        monkeypatch.setattr(fully_shard, "state", lambda module, s=state: s)
        assert compat.fsdp2_param_group(torch.nn.Linear(1, 1)) is want
