#!/usr/bin/env python
"""Django's command-line utility. Starts (or reuses) the embedded PostgreSQL and Redis when
DATABASE_URL / REDIS_URL are unset, so it reaches the same servers as `make run`."""

from __future__ import annotations

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "monitor.settings")
    if not os.environ.get("DATABASE_URL") or not os.environ.get("REDIS_URL"):
        from pathlib import Path

        from devstack import embedded

        # A stack of its own (`python -m devstack run --var-dir DIR`): RW_VAR_DIR=DIR.
        var_dir = os.environ.get("RW_VAR_DIR")
        try:
            embedded.ensure(Path(var_dir) if var_dir else embedded.DEFAULT_VAR)
        except embedded.EmbeddedError as exc:
            sys.exit(f"manage.py: {exc}")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
