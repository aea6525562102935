"""The Django app config."""

from typing import Any

from django.apps import AppConfig
from django.db.models.signals import post_migrate


def ensure_role_groups(sender: AppConfig, using: str = "default", **kwargs: Any) -> None:
    """The role groups exist whenever the schema does: made by migration core.0002, and again
    after anything that empties the tables and signals post_migrate (``manage.py flush``, which
    the transactional tests run after each test), as Django's own permissions are."""
    from django.contrib.auth.models import Group

    from console.core.roles import OPERATOR, VIEWER

    for name in (OPERATOR, VIEWER):
        Group.objects.using(using).get_or_create(name=name)


class CoreConfig(AppConfig):
    name = "console.core"
    label = "core"
    verbose_name = "Trainyard"

    def ready(self) -> None:
        from console.core import admin_actions, receivers  # noqa: F401  (connects the audit receivers)

        admin_actions.install()
        post_migrate.connect(ensure_role_groups, sender=self, dispatch_uid="trainyard-role-groups")
