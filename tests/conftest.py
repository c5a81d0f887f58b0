"""Fixtures every test package shares: the three users of the healthchecks habit."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.contrib.auth.hashers import PBKDF2PasswordHasher
from django.contrib.auth.models import User
from django.test.signals import setting_changed


class FastPBKDF2(PBKDF2PasswordHasher):
    """The product's hasher with 1,000 iterations, not 1,000,000 (0.3 s a password here, and
    the suite makes and checks hundreds). Its hashes name the same algorithm and carry their
    iteration count, so the product's own hasher (a test's gunicorn or worker) verifies them."""

    iterations = 1000


@pytest.fixture(autouse=True, scope="session")
def _fast_password_hashing() -> None:
    from django.conf import settings

    value = ["tests.conftest.FastPBKDF2", *settings.PASSWORD_HASHERS]
    settings.PASSWORD_HASHERS = value
    # What override_settings sends: django.contrib.auth forgets the hashers it loaded.
    setting_changed.send(sender=None, setting="PASSWORD_HASHERS", value=value, enter=True)


@pytest.fixture(autouse=True)
def _forget_settled_stats() -> Iterator[None]:
    """Stats a process keeps between reads (monitor.stats.rollups.stats_over) belong to one
    test's database: each test starts without them."""
    from monitor.stats import rollups

    rollups.forget_settled()
    yield
    rollups.forget_settled()


@pytest.fixture
def owner(django_user_model: type[User]) -> User:
    return django_user_model.objects.create_user("owner", "owner@example.com", "pw-owner-1")


@pytest.fixture
def teammate(django_user_model: type[User]) -> User:
    """A logged-in user without staff rights: may read pages, may not use the admin."""
    return django_user_model.objects.create_user(
        "teammate", "teammate@example.com", "pw-teammate-1"
    )


@pytest.fixture
def outsider(django_user_model: type[User]) -> User:
    return django_user_model.objects.create_user("outsider", "outsider@example.com", "pw-out-1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Interop tests run last, and the independent servers they need install meanwhile.

    Installing them (a few hundred MB of other projects' packages, into their own virtualenvs
    under var/interop-venv) takes minutes on a fresh machine; started here, in the background
    and at low priority, it overlaps the rest of the suite instead of adding to it."""
    interop = [item for item in items if item.get_closest_marker("interop")]
    if not interop:
        return
    items[:] = [item for item in items if not item.get_closest_marker("interop")] + interop
    from tests.interop.servers import prefetch

    prefetch()
