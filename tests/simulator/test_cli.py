"""The simulator's command line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from simulator.testing import ROOT


def test_the_cli_refuses_a_broken_config(tmp_path: Path) -> None:
    broken = tmp_path / "broken.toml"
    broken.write_text("[[providers]]\nslug = 'x'\nformat = 'soap'\n")
    done = subprocess.run(
        [sys.executable, "-m", "simulator", "--config", str(broken), "--port", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "format must be one of openai, anthropic, responses, gemini, bedrock" in done.stderr
