"""`athanor compile`'s run flags: `--resume` takes them from the stored run, refuses ones that disagree, and a
mistake creates nothing."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

from athanor.cli import main
from athanor.commands.compile import settle_run_flags, stored_run
from athanor.errors import ConfigError
from athanor.loop import CompileConfig
from athanor.loop.session import Session
from athanor.store import open_store


def _stored_run(out: Path) -> str:
    out.mkdir()
    with open_store(out) as store:
        run = store.add_run("tiny-dense", "preset:code", "cpu",
                            config={"budget_s": 90.0, "agents": ["variant"], "seed": 3, "precision": "exact"})
    return run.id


def _args(out: Path, **given: object) -> argparse.Namespace:
    flags = {"model": None, "traffic": None, "budget": None, "agents": None, "seed": None, "device": None,
             "store": ""}
    return argparse.Namespace(out=str(out), resume=True, **{**flags, **given})


def test_resume_takes_the_runs_model_traffic_budget_agents_seed_and_device(tmp_path: Path) -> None:
    _stored_run(tmp_path / "run")
    args = _args(tmp_path / "run", budget="1.5m")  # the same budget, spelled otherwise, is no conflict
    settle_run_flags(args)
    assert (args.model, args.traffic, args.budget, args.agents, args.seed, args.device) == (
        "tiny-dense", "preset:code", "90.0s", "variant", 3, "cpu")


@pytest.mark.parametrize(("flag", "value", "said"), [
    ("--model", "smollm2-135m", "was compiled with --model tiny-dense"),
    ("--traffic", "preset:chat", "was compiled with --traffic preset:code"),
    ("--budget", "2m", "was compiled with --budget 90s"),
    ("--seed", "1", "was compiled with --seed 3"),
])
def test_resume_refuses_a_flag_that_disagrees_with_the_run(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                           flag: str, value: str, said: str) -> None:
    _stored_run(tmp_path / "run")
    assert main(["compile", "--resume", "--out", str(tmp_path / "run"), flag, value]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and said in err[0] and f"resume without {flag}" in err[0], err


def test_resume_of_a_missing_run_creates_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nothing-here"
    assert main(["compile", "--resume", "--out", str(missing)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds no run to resume" in err[0]
    assert not missing.exists()


def test_out_naming_a_file_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    afile = tmp_path / "report.txt"
    afile.write_text("mine\n")
    assert main(["compile", "--model", "tiny-dense", "--budget", "10s", "--out", str(afile)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is a file; name a directory" in err[0]
    assert afile.read_text() == "mine\n"


def test_a_shared_store_holds_each_run_directorys_own_run(tmp_path: Path) -> None:
    """A team's store (`--store`) holds many runs: a run directory starts its own beside them, and `--resume`
    continues that one."""
    team = str(tmp_path / "team")
    configs = {name: CompileConfig(model="tiny-dense", out_dir=tmp_path / name, store=team) for name in "ab"}
    first = {name: Session(config, lambda line: None).run_id for name, config in configs.items()}
    assert first["a"] != first["b"]
    for name, config in configs.items():
        assert stored_run(tmp_path / name, team).id == first[name]
        assert Session(dataclasses.replace(config, resume=True), lambda line: None).run_id == first[name]
    with pytest.raises(ConfigError, match="already holds run"):
        Session(configs["a"], lambda line: None)
