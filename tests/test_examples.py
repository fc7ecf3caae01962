"""examples/fsdp2_train.py, the standalone FSDP2 script, under torchrun on gloo ranks: it trains, it
resumes from its DCP checkpoint where it stopped, and 2 ranks match 1 on the same global batch."""
import ast
import os
import re
import subprocess
import sys

import pytest
import torch

from course_utils.course.badges import ROOT

SCRIPT = ROOT / "examples" / "fsdp2_train.py"
ENV = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
STEP = re.compile(r"^step (\d+) loss (\S+) ", re.MULTILINE)
HEADER = re.compile(r"^world \d+ device \w+ backend \w+ (bf16|fp32) params \d+ from step \d+$", re.MULTILINE)
OWN = re.compile(rf"{HEADER.pattern}|^step \d+ loss \S+ grad_norm \S+$", re.MULTILINE)


def _torchrun(ranks: int, *args: str) -> list[str]:
    # port 0: the rendezvous store listens on a port the OS picks (as --standalone does), so runs at once never clash
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(ranks),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0", str(SCRIPT), *args]


def _start(cmd: list[str]) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, cwd=ROOT)


def _result(name: str, proc: subprocess.Popen) -> tuple[str, dict, str]:
    """The script's header line, its losses {step: the loss as printed}, and everything the run printed.
    Read by pattern, not by position: torch 2.10's gloo prints its own connection lines first."""
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, (name, stderr[-3000:])
    headers = [m.group(0) for m in HEADER.finditer(stdout)]
    assert len(headers) == 1, (name, stdout)
    return headers[0], {int(s): loss for s, loss in STEP.findall(stdout)}, stdout + stderr


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Five runs, four at once (each rank is one thread): the resumed one starts when the stopped one is done."""
    ckpt = str(tmp_path_factory.mktemp("fsdp2") / "ckpt")
    procs = {"stopped": _start(_torchrun(2, "--steps", "3", "--save-every", "1", "--ckpt", ckpt)),
             "bf16": _start(_torchrun(2, "--steps", "4")),
             "fp32": _start(_torchrun(2, "--steps", "4", "--fp32")),
             "fp32 one rank": _start(_torchrun(1, "--steps", "4", "--fp32"))}
    try:
        out = {"stopped": _result("stopped", procs["stopped"])}
        procs["resumed"] = _start(_torchrun(2, "--steps", "4", "--resume", "--ckpt", ckpt))
        out.update({name: _result(name, proc) for name, proc in procs.items() if name != "stopped"})
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    return out


def test_the_script_imports_torch_only():
    tree = ast.parse(SCRIPT.read_text())
    roots = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    roots |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert roots == {"argparse", "os", "datetime", "torch"}


def test_four_steps_on_two_ranks(runs):
    header, losses, _ = runs["bf16"]
    assert header.startswith("world 2 device cpu backend gloo bf16 params "), header
    assert list(losses) == [1, 2, 3, 4]
    assert float(losses[4]) < float(losses[1]), losses     # it learns


def test_resume_continues_where_the_checkpoint_stopped(runs):
    full, stopped, resumed = runs["bf16"][1], runs["stopped"][1], runs["resumed"][1]
    assert runs["resumed"][0].endswith("from step 3")      # the highest of step-1, step-2, step-3
    assert stopped == {1: full[1], 2: full[2], 3: full[3]}
    assert resumed == {4: full[4]}                        # to every printed digit


@pytest.mark.skipif(tuple(int(v) for v in torch.__version__.split(".")[:2]) < (2, 13),
                    reason="torch 2.10's gloo prints its own '[Gloo] Rank r is connected' lines (the script's docstring says so)")
def test_the_script_prints_only_its_own_lines(runs):
    for name, (_, _, printed) in runs.items():          # stdout and stderr of every rank: no warning at a save
        assert not OWN.sub("", printed).strip(), (name, printed)


def test_two_ranks_match_one_on_the_same_global_batch(runs):
    two, one = runs["fp32"][1], runs["fp32 one rank"][1]
    assert runs["fp32 one rank"][0].startswith("world 1 device cpu backend gloo fp32 ")
    assert list(two) == list(one) == [1, 2, 3, 4]
    assert all(abs(float(two[s]) - float(one[s])) <= 1e-5 * abs(float(one[s])) for s in one), (two, one)
