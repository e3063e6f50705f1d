"""Two real torchrun agents on this machine (``--nnodes 2 --node-rank 0/1``, static rendezvous on
127.0.0.1, gloo), each with its own simulated host name: every rank records its node, local rank and node
rank, and a node whose ranks are all slow is named once as a node straggler."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers.components import free_port

pytest.importorskip("torch.distributed.run")

from gpudash import load_run
from gpudash.analysis.facts import run_facts
from gpudash.analysis.ranks import node_stragglers, rank_nodes
from gpudash.server.layouts.pages import build_run_page
from gpudash.server.metrics import metrics_registry
from gpudash.store.reader import RunReader

STEPS = 10
SCRIPT = textwrap.dedent('''
    import os, sys, time
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from gpudash import Monitor

    run_dir, slow_node, slow_s, steps = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
    dist.init_process_group("gloo")
    slow = os.environ["GPUDASH_HOSTNAME"] == slow_node
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 4)
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    with Monitor(run_dir, handle_signals=False, host_hz=0.0) as mon:
        mon.watch(model, opt)
        for _ in range(steps):
            with mon.step(samples=8):
                with mon.phase("data"):
                    x = torch.randn(8, 16)
                    if slow:
                        time.sleep(slow_s)
                with mon.phase("forward"):
                    loss = ddp(x).square().mean()
                with mon.phase("backward"):
                    loss.backward()  # the all-reduce: node-a's ranks wait here for node-b's
                with mon.phase("optimizer"):
                    opt.step()
                    opt.zero_grad(set_to_none=True)
    dist.destroy_process_group()
''')


@pytest.mark.slow
def test_two_torchrun_agents_two_nodes(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    run_dir = tmp_path / "runs" / "two-nodes"
    port = free_port()
    agents = []
    for node_rank, host in ((0, "node-a"), (1, "node-b")):
        env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "GPUDASH_HOSTNAME": host}
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node_rank),
               "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(port),
               str(script), str(run_dir), "node-b", "0.05", str(STEPS)]
        agents.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for a in agents:
        out, err = a.communicate(timeout=240)
        assert a.returncode == 0, err[-3000:]

    run = load_run(run_dir)
    try:
        assert run.ranks == [0, 1, 2, 3] and run.status == "finished"
        got = {r: (m["node"], m["node_rank"], m["local_rank"], m["hostname"]) for r, m in run.rank_meta.items()}
        assert got == {0: ("node-a", 0, 0, "node-a"), 1: ("node-a", 0, 1, "node-a"),
                       2: ("node-b", 1, 0, "node-b"), 3: ("node-b", 1, 1, "node-b")}
        assert all(m["local_world_size"] == 2 for m in run.rank_meta.values())
        assert rank_nodes(run.rank_meta) == {0: "node-a", 1: "node-a", 2: "node-b", 3: "node-b"}
        s = node_stragglers(run)
        assert s["node_stragglers"] == ["node-b"] and s["rank_stragglers"] == []
        facts = run_facts(run)
        assert facts.nodes == 2 and facts.node_stragglers == ("node-b",) and facts.rank_stragglers == ()
        assert facts.to_json()["node_stragglers"] == ["node-b"]
    finally:
        run.close()
    reader = RunReader(run_dir)
    try:
        page = str(build_run_page("two-nodes", reader))
    finally:
        reader.close()
    assert "nodes-table" in page and "node node-b: all 2 ranks (2–3)" in page
    # Prometheus: every rank's series carries its node
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    text = generate_latest(metrics_registry(run_dir.parent)).decode()
    nodes = {s.labels["rank"]: s.labels["node"] for f in text_string_to_metric_families(text) for s in f.samples
             if s.name == "gpudash_step"}
    assert nodes == {"0": "node-a", "1": "node-a", "2": "node-b", "3": "node-b"}
