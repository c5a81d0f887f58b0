from __future__ import annotations

import pytest
from django.contrib.auth.models import User


@pytest.fixture
def teammate(django_user_model: type[User]) -> User:
    """A logged-in user without staff rights: may read pages, may not use the admin."""
    return django_user_model.objects.create_user(
        "teammate", "teammate@example.com", "pw-teammate-1"
    )
