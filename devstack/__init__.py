"""The local stack behind `make run` and `make test`: embedded PostgreSQL and Redis, the demo's
per-region delay proxies and the process supervisor. Not shipped: nothing in monitor/, probes/
or simulator/ imports it (tests/monitor/test_project_rules.py holds that)."""
