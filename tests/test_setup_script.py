"""scripts/setup.sh chooses the torch build it installs: checked offline through its dry run.

``SEQMEM_SETUP_DRY_RUN=1`` prints the decisions (stderr) and the commands (stdout, ``+ ...``) without creating a
venv or installing anything.  A fake ``nvidia-smi`` on PATH stands for the GPU, a private pip configuration and a
fake wheel directory for the machine's local wheels.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "setup.sh"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _fake_wheel(directory: Path, version: str = "2.13.0+cpu") -> None:
    info = f"torch-{version}.dist-info"
    with zipfile.ZipFile(directory / f"torch-{version}-py3-none-any.whl", "w") as z:
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")


def _setup(tmp_path: Path, mode: str = "test", *, gpu: bool = False, local_wheel: bool = False, **env_extra):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: Fake GPU (UUID: GPU-0)'\n" if gpu else "#!/bin/sh\nexit 9\n")
    smi.chmod(0o755)
    wheels = tmp_path / "wheels"
    wheels.mkdir(exist_ok=True)
    if local_wheel:
        _fake_wheel(wheels)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "SEQMEM_", "TORCH_"))}
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        PIP_CONFIG_FILE=os.devnull,  # no machine-wide pip configuration (its find-links, indexes)
        PIP_FIND_LINKS=str(wheels),
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        PYTHON=sys.executable,
        SEQMEM_VENV=str(tmp_path / "venv"),
        SEQMEM_SETUP_DRY_RUN="1",
    )
    env.update(env_extra)
    p = subprocess.run(["bash", str(SCRIPT), mode], capture_output=True, text=True, env=env, timeout=120)
    cmds = [line[2:] for line in p.stdout.splitlines() if line.startswith("+ ")]
    return p, cmds


def _torch_cmd(cmds: list[str]) -> str:
    (cmd,) = [c for c in cmds if " torch==" in c]
    return cmd


def test_cpu_index_by_default_without_gpu(tmp_path):
    p, cmds = _setup(tmp_path)
    assert p.returncode == 0, p.stderr
    assert not (tmp_path / "venv").exists()  # a dry run creates nothing
    assert cmds[0].endswith(f"-m venv {tmp_path / 'venv'}")
    assert _torch_cmd(cmds).endswith(f"torch==2.13.0 --index-url {CPU_INDEX}")
    assert cmds[-1].endswith("pip install -q -e .[dev,hf,plot]")
    assert cmds.index(_torch_cmd(cmds)) < len(cmds) - 1  # torch first


def test_local_wheel_is_used_first(tmp_path):
    p, cmds = _setup(tmp_path, local_wheel=True)
    assert p.returncode == 0, p.stderr
    assert _torch_cmd(cmds).endswith("pip install -q torch==2.13.0+cpu")
    assert "local wheel" in p.stderr


def test_gpu_gets_the_default_index(tmp_path):
    p, cmds = _setup(tmp_path, gpu=True)
    assert p.returncode == 0, p.stderr
    assert _torch_cmd(cmds).endswith("pip install -q torch==2.13.0")


@pytest.mark.parametrize("gpu", [False, True])
def test_overrides(tmp_path, gpu):
    _, cmds = _setup(tmp_path, gpu=gpu, SEQMEM_TORCH="cuda")
    assert _torch_cmd(cmds).endswith("pip install -q torch==2.13.0")
    _, cmds = _setup(tmp_path, gpu=gpu, SEQMEM_TORCH="cpu")
    assert _torch_cmd(cmds).endswith(f"--index-url {CPU_INDEX}")
    _, cmds = _setup(tmp_path, gpu=gpu, local_wheel=True, TORCH_INDEX_URL="https://example.org/simple",
                     TORCH_VERSION="2.9.1")
    assert _torch_cmd(cmds).endswith("torch==2.9.1 --index-url https://example.org/simple")
    p, _ = _setup(tmp_path, gpu=gpu, SEQMEM_TORCH="rocm")
    assert p.returncode == 2 and "SEQMEM_TORCH" in p.stderr


@pytest.mark.parametrize("mode, target", [("demo", "-e .[plot]"), ("test", "-e .[dev,hf,plot]"), ("plain", ".")])
def test_modes_install_what_they_need(tmp_path, mode, target):
    p, cmds = _setup(tmp_path, mode)
    assert p.returncode == 0, p.stderr
    assert cmds[-1].endswith(f"pip install -q {target}")
    assert "dev" not in cmds[-1] or mode == "test"


def test_bad_mode(tmp_path):
    p, cmds = _setup(tmp_path, "everything")
    assert p.returncode == 2 and not cmds
