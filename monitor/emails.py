"""Outgoing e-mail: one message per template name, rendered from templates/emails/."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.core.mail import EmailMultiAlternatives
from django.template.loader import render_to_string


def make_message(
    name: str, to: str, ctx: Mapping[str, Any], headers: Mapping[str, str] | None = None
) -> EmailMultiAlternatives:
    """Render emails/<name>-subject.html, -body-text.html and -body-html.html into one message."""
    subject = " ".join(render_to_string(f"emails/{name}-subject.html", ctx).split())
    text = render_to_string(f"emails/{name}-body-text.html", ctx)
    html = render_to_string(f"emails/{name}-body-html.html", ctx)
    message = EmailMultiAlternatives(subject, text, to=[to], headers=dict(headers or {}))
    message.attach_alternative(html, "text/html")
    return message
