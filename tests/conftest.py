"""Fixtures every test package shares: the three users of the healthchecks habit."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User


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
