from __future__ import annotations

import secrets
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Create the first admin user (password printed once) unless a superuser exists."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--username", default="admin")

    def handle(self, *args: Any, **options: Any) -> None:
        User = get_user_model()
        if User.objects.filter(is_superuser=True).exists():
            self.stdout.write(
                "Admin user exists (its password was printed on the first run; "
                "reset it with: .venv/bin/python manage.py changepassword admin)."
            )
            return
        password = secrets.token_urlsafe(12)
        User.objects.create_superuser(options["username"], "", password)
        self.stdout.write(
            self.style.SUCCESS(
                f"Created admin user {options['username']!r} with password: {password}\n"
                "  (shown only this once; change it with manage.py changepassword)"
            )
        )
