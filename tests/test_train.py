"""course_utils.harness.train: the torchrun training script reproduces experiments.run("single")."""
import json
import os
import subprocess
import sys

import pytest

from course_utils.harness import experiments
from course_utils.harness import strategies
from course_utils.harness import train
from course_utils.course.badges import ROOT

ENV = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
            "-m", "course_utils.harness.train"]


def _close(a, b, rel=1e-6):
    return len(a) == len(b) and all(abs(x - y) <= rel * abs(y) for x, y in zip(a, b))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Three jobs at once (each rank is one thread; they share the cores): torchrun ddp and
    zero2 on 2 ranks, and "single" as one plain process. name -> (stdout, json or None)."""
    tmp = tmp_path_factory.mktemp("train")
    cmds = {s: TORCHRUN + ["--strategy", s, "--steps", "3", "--json", str(tmp / f"{s}.json")]
            for s in ("ddp", "zero2")}
    cmds["single"] = [sys.executable, "-m", "course_utils.harness.train", "--strategy", "single",
                      "--steps", "2"]
    procs = {name: subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, env=ENV, cwd=ROOT) for name, cmd in cmds.items()}
    results = {"expected": experiments.run("single", 1, steps=3)[0].losses}  # meanwhile
    try:
        for name, proc in procs.items():
            stdout, stderr = proc.communicate(timeout=120)
            assert proc.returncode == 0, (name, stderr[-3000:])
            path = tmp / f"{name}.json"
            results[name] = (stdout, json.loads(path.read_text()) if path.exists() else None)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    return results


@pytest.mark.parametrize("strategy", ["ddp", "zero2"])
def test_torchrun_matches_single(runs, strategy):
    stdout, result = runs[strategy]
    expected = runs["expected"]
    assert f"{strategy}: 2 ranks, gloo on CPU" in stdout, stdout
    assert stdout.count("step 3 loss") == 1, stdout          # rank 0 logs, once
    assert result["world_size"] == 2 and result["strategy"] == strategy
    assert _close(result["losses"], expected), (strategy, result["losses"], expected)
    assert set(result["state_bytes"]) == {"params", "grads", "optimizer"}
    if strategy == "ddp":
        assert result["comm_bytes"]["all_reduce"] > 0
    else:
        assert result["comm_bytes"]["reduce_scatter"] > 0
        assert result["comm_bytes"]["all_gather"] > 0


def test_single_process_without_torchrun(runs):
    stdout, _ = runs["single"]
    assert "1 process on CPU" in stdout, stdout
    assert "step 2 loss 4.5562" in stdout, stdout
    assert "model states on rank 0" in stdout


def test_unknown_strategy_names_the_known_ones(capsys):
    with pytest.raises(SystemExit) as e:
        train.parse_args(["--strategy", "zero9"])
    assert e.value.code != 0
    err = capsys.readouterr().err
    assert "zero9" in err
    for name in strategies.strategies():
        assert name in err


def test_help_documents_torchrun(capsys):
    with pytest.raises(SystemExit) as e:
        train.parse_args(["--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    assert "torchrun --standalone --nproc-per-node" in text
    assert "--nnodes 2" in text and "--rdzv-endpoint" in text


def test_bad_arguments_fail_clearly(capsys):
    with pytest.raises(SystemExit):
        train.parse_args(["--strategy", "ddp", "--steps", "0"])
    assert "--steps must be >= 1" in capsys.readouterr().err
