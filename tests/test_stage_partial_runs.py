"""scripts/stage_partial_runs.py: an unfinished run's newest good checkpoint is staged for commit (so a fresh clone
resumes it), and finished runs' checkpoints are untracked; run in a scratch git repository."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import torch

from conftest import fake_run_dir
from seqmem.train.checkpoint import save_checkpoint

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "stage_partial_runs.py"


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def _stage(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=repo, capture_output=True, text=True, timeout=120)


def _tracked_ckpts(repo: Path) -> set[str]:
    return {str(Path(f).parent) for f in _git(repo, "ls-files").splitlines() if "/checkpoints/" in f}


def _run_dir(repo: Path, name: str, steps: list[int], finished: bool) -> Path:
    return fake_run_dir(repo / "docs" / "results" / "p" / "runs" / name, steps, finished)


def test_stages_the_newest_good_checkpoint_of_unfinished_runs_and_untracks_finished_ones(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "t@t")
    _git(repo, "config", "user.name", "t")
    (repo / ".gitignore").write_text("docs/results/**/checkpoints/\n")
    partial = _run_dir(repo, "partial", [100, 200, 300], finished=False)
    done = _run_dir(repo, "done", [100], finished=True)
    # the newest checkpoint of the partial run is corrupt: the newest *good* one (step 200) is staged
    (partial / "checkpoints" / "ckpt-00000300" / "trainer.pt").write_bytes(b"torn write")
    # a checkpoint of the finished run was committed by an earlier session (while it was unfinished)
    _git(repo, "add", "-f", str(done / "checkpoints" / "ckpt-00000100"))
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "init")

    dry = _stage(repo, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "would stage 1 unfinished run(s)" in dry.stdout and "would untrack 1 checkpoint(s)" in dry.stdout
    assert _git(repo, "diff", "--cached", "--name-only") == ""  # a dry run changes nothing

    p = _stage(repo)
    assert p.returncode == 0, p.stderr
    assert _tracked_ckpts(repo) == {"docs/results/p/runs/partial/checkpoints/ckpt-00000200"}
    assert (done / "checkpoints" / "ckpt-00000100").is_dir()  # untracked, not deleted
    _git(repo, "commit", "-q", "-m", "partial")

    # the run goes on and checkpoints again: the newer one replaces the committed one
    shutil.rmtree(partial / "checkpoints" / "ckpt-00000300")
    save_checkpoint(partial / "checkpoints", 400, torch.nn.Linear(2, 2), {"step": 400}, keep=3)
    assert _stage(repo).returncode == 0
    assert _tracked_ckpts(repo) == {"docs/results/p/runs/partial/checkpoints/ckpt-00000400"}
    _git(repo, "commit", "-q", "-m", "partial 2")

    # once it finishes, nothing of it stays tracked; a fresh clone then has no checkpoint at all
    (partial / "result.json").write_text("{}")
    assert _stage(repo).returncode == 0
    assert _tracked_ckpts(repo) == set()


def test_a_missing_root_is_a_clear_error(tmp_path):
    _git(tmp_path, "init", "-q")
    p = _stage(tmp_path, "no/such/dir")
    assert p.returncode == 2 and "no/such/dir is not a directory" in p.stderr
