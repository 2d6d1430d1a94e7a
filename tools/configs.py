#!/usr/bin/env python
"""`detens configs` as a script; the logic lives in detens/cli/configs.py."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a clone without `pip install -e .` works too
from detens.cli import run_command  # noqa: E402

sys.exit(run_command("configs", prog="configs.py"))
