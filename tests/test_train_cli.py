"""course_utils.harness.train_cli: the torchrun training script reproduces experiments.run("single"),
on one node and as README's two-node command (two torchrun agents on loopback)."""
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest

from course_utils.harness import experiments
from course_utils.harness import strategies
from course_utils.harness import train_cli
from course_utils.course.badges import ROOT
from course_utils.runtime.launch import loopback_interface

ENV = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
            "-m", "course_utils.harness.train_cli"]


def _close(a, b, rel=1e-6):
    return len(a) == len(b) and all(abs(x - y) <= rel * abs(y) for x, y in zip(a, b))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Three jobs at once (each rank is one thread; they share the cores): torchrun ddp and
    zero2 on 2 ranks, and "single" as one plain process. name -> (stdout, json or None)."""
    tmp = tmp_path_factory.mktemp("train")
    cmds = {s: TORCHRUN + ["--strategy", s, "--steps", "3", "--json", str(tmp / f"{s}.json")]
            for s in ("ddp", "zero2")}
    cmds["single"] = [sys.executable, "-m", "course_utils.harness.train_cli", "--strategy", "single",
                      "--steps", "2"]
    results = {"expected": experiments.run("single", 1, steps=3)[0].losses}
    for name, (code, stdout, stderr) in _run_all(cmds, ENV, tmp, timeout=180).items():
        assert code == 0, (name, stderr[-3000:])
        path = tmp / f"{name}.json"
        results[name] = (stdout, json.loads(path.read_text()) if path.exists() else None)
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
        train_cli.parse_args(["--strategy", "zero9"])
    assert e.value.code != 0
    err = capsys.readouterr().err
    assert "zero9" in err
    for name in strategies.strategies():
        assert name in err


def test_help_documents_torchrun(capsys):
    with pytest.raises(SystemExit) as e:
        train_cli.parse_args(["--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    assert "torchrun --standalone --nproc-per-node" in text
    assert "--nnodes 2" in text and "--rdzv-endpoint" in text


def test_bad_arguments_fail_clearly(capsys):
    with pytest.raises(SystemExit):
        train_cli.parse_args(["--strategy", "ddp", "--steps", "0"])
    assert "--steps must be >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        train_cli.parse_args(["--strategy", "ddp", "--shards", "8"])
    assert "--shards is for torch-hsdp, not 'ddp'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        train_cli.parse_args(["--strategy", "torch-hsdp", "--shards", "0"])
    assert "--shards must be >= 1" in capsys.readouterr().err
    assert train_cli.parse_args(["--strategy", "torch-hsdp", "--shards", "8"]).shards == 8


def test_the_help_commands_divide_their_global_batch():
    """Each torchrun line of --help gives a global batch its ranks divide (16 ranks: not 12)."""
    import re
    for block in re.split(r"\n  (?=\S)", train_cli.EPILOG):
        ranks = re.search(r"--nproc-per-node (\d+)", block)
        if ranks:
            nodes = int(m.group(1)) if (m := re.search(r"--nnodes (\d+)", block)) else 1
            batch = re.search(r"--global-batch (\d+)", block)
            assert int(batch.group(1) if batch else 12) % (nodes * int(ranks.group(1))) == 0, block


MULTINODE = ("torch-hsdp", "torch-fsdp")
MULTINODE_REL = 1e-5   # float32 losses; measured gap to one process: < 2e-7 relative


def _free_ports(n: int) -> list[int]:
    """n distinct free ports of 127.0.0.1 (all held open until all are chosen)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


def _run_all(cmds: dict, env: dict, logs, timeout: float) -> dict:
    """Start every command at once (stdout, stderr to files in ``logs``), wait for all, at most
    ``timeout`` s together; name -> (returncode, stdout, stderr). Whatever is still alive then
    is killed: the agents' process groups and the workers seen under them (torchrun starts
    each worker in a session of its own, so the agent's group does not hold them)."""
    procs, workers = {}, {}
    deadline = time.monotonic() + timeout
    try:
        for name, cmd in cmds.items():
            with open(logs / f"{name}.out", "w") as out, open(logs / f"{name}.err", "w") as err:
                procs[name] = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, cwd=ROOT,
                                               start_new_session=True)
        while any(p.poll() is None for p in procs.values()) and time.monotonic() < deadline:
            for p in procs.values():
                with contextlib.suppress(psutil.Error):
                    workers.update((c.pid, c) for c in psutil.Process(p.pid).children(recursive=True))
            time.sleep(0.2)
    finally:
        for p in procs.values():
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
        for w in workers.values():
            with contextlib.suppress(psutil.Error):
                w.kill()
        for p in procs.values():
            p.wait(timeout=30)
    return {name: (p.returncode, (logs / f"{name}.out").read_text(), (logs / f"{name}.err").read_text())
            for name, p in procs.items()}


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    """README's two-node command on loopback: per strategy, two torchrun agents
    (``--nnodes 2 --nproc-per-node 2``, c10d rendezvous on a free port of 127.0.0.1), both
    strategies at once, and "single" as one process. Each agent gets its own --json path:
    only global rank 0 writes, and c10d numbers the nodes by arrival, so either may."""
    tmp = tmp_path_factory.mktemp("nnodes")
    env = dict(ENV)
    if (lo := loopback_interface()) is not None:
        env["GLOO_SOCKET_IFNAME"] = lo            # gloo's sockets on loopback too
    train = ["-m", "course_utils.harness.train_cli", "--steps", "3", "--timeout", "60"]
    cmds = {"single": [sys.executable, *train, "--strategy", "single", "--json", str(tmp / "single.json")]}
    for strategy, port in zip(MULTINODE, _free_ports(len(MULTINODE))):
        for node in (0, 1):
            cmds[f"{strategy}-{node}"] = [
                sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2",
                "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                "--rdzv-conf", "join_timeout=60", "--local-addr", "127.0.0.1",
                *train, "--strategy", strategy, "--json", str(tmp / f"{strategy}-{node}.json"),
                *(["--shards", "2"] if strategy == "torch-hsdp" else [])]     # one node's 2 ranks
    runs = _run_all(cmds, env, tmp, timeout=240)
    for name, (code, _, err) in runs.items():
        assert code == 0, (name, code, err[-3000:])
    return tmp, runs


@pytest.mark.skipif(os.name != "posix", reason="torchrun's multi-node agents: POSIX only here")
@pytest.mark.parametrize("strategy", MULTINODE)
def test_two_torchrun_agents_match_one_process(two_nodes, strategy):
    tmp, runs = two_nodes
    header = f"{strategy}: 4 ranks on 2 nodes, gloo on CPU"
    printed = [node for node in (0, 1) if header in runs[f"{strategy}-{node}"][1]]
    written = [node for node in (0, 1) if (tmp / f"{strategy}-{node}.json").exists()]
    assert len(printed) == 1 and written == printed, (printed, written)   # rank 0: on one agent
    result = json.loads((tmp / f"{strategy}-{written[0]}.json").read_text())
    expected = json.loads((tmp / "single.json").read_text())["losses"]
    assert result["world_size"] == 4 and len(expected) == 3
    assert _close(result["losses"], expected, rel=MULTINODE_REL), (result["losses"], expected)
