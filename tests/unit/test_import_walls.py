"""The import walls of pyproject.toml ([tool.importlinter]) hold, and each one can break.

``lint-imports`` runs on a copy of the repository's packages in a temporary folder (cwd and
PYTHONPATH point there), so a deliberate violation never touches the working tree.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
CONTRACTS = {c["id"]: c["name"] for c in CONFIG["contracts"]}

# The contracts that hold on this tree today; each is checked, and each is broken on purpose.
HOLDS = [
    "schemas-import-nothing-of-ours",
    "edge-apart-from-workers",
    "workers-apart-from-edge",
    "telemetry-only-from-harness",
    "simulator-only-from-deploy",
    "runtime-never-imports-deploy",
    "model-client-only-in-engine",
    "anthropic-only-in-engine",
    "runtime-never-imports-harness",
]
# Contracts written before the tree obeys them (none now); each names why it cannot hold yet.
PENDING: dict[str, str] = {}

# One violation per contract: (module file in the copy, the line appended to it). Those of
# HOLDS are applied together and each contract must then be broken.
VIOLATIONS = {
    "schemas-import-nothing-of-ours": ("schemas/__init__.py", "import streams.ids"),
    "edge-apart-from-workers": ("api/__init__.py", "import consumers"),
    "workers-apart-from-edge": ("streams/__init__.py", "import api"),
    "telemetry-only-from-harness": ("consumers/__init__.py", "import telemetry"),
    "simulator-only-from-deploy": ("telemetry/__init__.py", "import deploy.simulator"),
    "runtime-never-imports-deploy": ("schemas/__init__.py", "import deploy"),
    "runtime-never-imports-harness": ("deploy/__init__.py", "import tests.support"),
    "model-client-only-in-engine": ("consumers/__init__.py", "import consumers.engine.client"),
    "anthropic-only-in-engine": ("streams/__init__.py", "import anthropic"),
}


def lint_imports(tree: Path, *contracts: str) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` on ``tree`` (cwd and import path), limited to ``contracts``."""
    script = Path(sys.executable).with_name("lint-imports")
    command = [str(script)] if script.exists() else [shutil.which("lint-imports") or "lint-imports"]
    for contract in contracts:
        command += ["--contract", contract]
    env = {**os.environ, "PYTHONPATH": str(tree), "COLUMNS": "1000"}  # no wrapped names
    return subprocess.run([*command, "--no-logo", "--no-cache"], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=120)


def verdicts(output: str) -> dict[str, str]:
    """Contract name -> KEPT or BROKEN, from lint-imports' summary."""
    return {m["name"]: m["verdict"] for m in
            re.finditer(r"^(?P<name>.+) (?P<verdict>KEPT|BROKEN)$", output, re.MULTILINE)}


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of pyproject.toml and every root package's Python files."""
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    for package in CONFIG["root_packages"]:
        shutil.copytree(ROOT / package, tmp_path / package, ignore=lambda folder, names: [
            n for n in names if not n.endswith(".py") and not (Path(folder) / n).is_dir()
            or n == "__pycache__"])
    return tmp_path


def test_every_contract_is_either_holding_or_pending() -> None:
    assert not set(HOLDS) & set(PENDING)
    assert set(HOLDS) | set(PENDING) == set(CONTRACTS)
    assert set(VIOLATIONS) == set(CONTRACTS)


def test_the_holding_contracts_hold_on_the_copy(tree: Path) -> None:
    run = lint_imports(tree, *HOLDS)
    assert run.returncode == 0, run.stdout + run.stderr
    assert verdicts(run.stdout) == {CONTRACTS[c]: "KEPT" for c in HOLDS}, run.stdout


def test_each_holding_contract_fails_on_its_violation(tree: Path) -> None:
    for path, line in (VIOLATIONS[c] for c in HOLDS):
        with open(tree / path, "a") as f:
            f.write(f"\n{line}\n")
    run = lint_imports(tree, *HOLDS)
    assert run.returncode == 1, run.stdout + run.stderr
    assert verdicts(run.stdout) == {CONTRACTS[c]: "BROKEN" for c in HOLDS}, run.stdout
    # The report names the offending import of the two walls the edge and the records keep.
    assert "api -> consumers" in run.stdout and "schemas -> streams.ids" in run.stdout
