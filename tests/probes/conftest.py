from tests.sim_fixtures import sim, tls_sim  # noqa: F401 (fixtures)
