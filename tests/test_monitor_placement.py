"""Rank, world size and local rank from the launcher's environment: one reading for the Monitor,
the trainer and the device collector; a bad value is a recorded state, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

import gpudash
from gpudash.collectors.env import Placement, describe_environment, placement

LAUNCH_VARS = ("RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID", "WORLD_SIZE", "PMI_SIZE",
               "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS", "LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK",
               "GROUP_RANK", "SLURM_NODEID", "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE")


@pytest.fixture(autouse=True)
def _no_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    for n in LAUNCH_VARS:
        monkeypatch.delenv(n, raising=False)


def test_each_launcher_is_read() -> None:
    assert placement({}) == Placement(rank=0, world_size=1)
    assert placement({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "GROUP_RANK": "1",
                      "LOCAL_WORLD_SIZE": "2"}) == Placement(3, 8, 1, 1, 2)
    assert placement({"SLURM_PROCID": "5", "SLURM_NTASKS": "6", "SLURM_LOCALID": "1", "SLURM_NODEID": "2"}) \
        == Placement(5, 6, 1, 2)
    assert placement({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4",
                      "OMPI_COMM_WORLD_LOCAL_RANK": "0"}) == Placement(2, 4, 0)
    assert placement({"PMI_RANK": " 1 ", "PMI_SIZE": "2"}) == Placement(1, 2)  # spaces are fine
    assert placement({"RANK": "", "PMI_RANK": "4"}).rank == 4  # an empty variable is not set


@pytest.mark.parametrize("env", [{"RANK": "abc"}, {"RANK": "-1"}, {"RANK": "1.5"}, {"RANK": "٣"},
                                 {"WORLD_SIZE": "0"}, {"LOCAL_RANK": "x"}])
def test_a_bad_value_is_one_line_naming_it_never_an_exception(env: dict[str, str]) -> None:
    p = placement(env)
    (name, value), = env.items()
    assert len(p.problems) == 1
    line = p.problems[0]
    assert "\n" not in line and line.startswith(f"{name}={value!r} is not a") and "unset it" in line
    assert (p.rank, p.world_size, p.local_rank) == (0, 1, None)  # the value is skipped, not guessed


def test_a_bad_value_falls_through_to_the_next_launcher() -> None:
    p = placement({"RANK": "abc", "SLURM_PROCID": "3"})
    assert p.rank == 3 and "records rank 3" in p.problems[0]
    assert p.bad == (("RANK", "RANK='abc' is not a rank (a whole number >= 0)"),)


def test_the_run_meta_records_what_the_launcher_said(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("SLURM_NODEID", "2")
    env = describe_environment()
    assert env["local_rank"] == 1 and env["node_rank"] == 2 and "local_world_size" not in env


def test_the_monitor_records_a_bad_rank_and_carries_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("RANK", "abc")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with gpudash.Monitor(tmp_path / "r", host_hz=0) as m:
        assert (m.rank, m.world_size) == (0, 2)
        with m.step():
            pass
    err = [line for line in capsys.readouterr().err.splitlines() if "RANK" in line]
    assert err == ["gpudash: RANK='abc' is not a rank (a whole number >= 0): ignored, this process records "
                   "rank 0; fix the launcher's RANK or unset it"]
    run = gpudash.load_run(tmp_path / "r")
    assert run.ranks == [0] and len(run.steps) == 1
    ev = run.events[run.events["kind"] == "bad_environment"]
    assert ev["message"].tolist() == [err[0].removeprefix("gpudash: ")]


def test_explicit_rank_wins_over_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "3")
    with gpudash.Monitor(tmp_path / "r", rank=1, world_size=4, host_hz=0) as m:
        assert (m.rank, m.world_size) == (1, 4)
    assert gpudash.load_run(tmp_path / "r").ranks == [1]


def test_the_trainer_reads_the_same_placement(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    from gpudash.trainer.config import TrainConfig
    from gpudash.trainer.loop import Trainer

    monkeypatch.setenv("RANK", "abc")  # one process: skipped (the Monitor records it), the run goes on
    t = Trainer(TrainConfig(steps=1, batch=1, seq_len=8, device="cpu"))
    assert (t.rank, t.world) == (0, 1)
    monkeypatch.setenv("WORLD_SIZE", "2")  # several: torch.distributed would choke on it, so say it up front
    with pytest.raises(ValueError, match=r"^RANK='abc' is not a rank \(a whole number >= 0\): torch.distributed "
                                         r"reads it to start 2 processes; fix the launcher's RANK$"):
        Trainer(TrainConfig(steps=1, batch=1, seq_len=8, device="cpu"))
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "bad")
    with pytest.raises(ValueError, match=r"^LOCAL_RANK='bad' is not a local rank"):
        Trainer(TrainConfig(steps=1, batch=1, seq_len=8, device="cpu"))
