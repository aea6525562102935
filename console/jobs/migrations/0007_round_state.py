"""A round's life becomes one state (RoundPhase) instead of six fields: existing rows mapped.

- ended (``ended_at`` set): ENDED, with the outcome it had ("replaced" if it had none);
- open and failed (``awaiting_settlement``, or outcome "failed"): SETTLING, outcome cleared (it is
  set when the round ends), ``failed_at`` kept (the creation time if it was never stamped);
- open, in place (``carry_over`` not empty) and not formed: FORMING;
- open otherwise: RUNNING once it formed, took a step or a host reported it running; else STARTING.

``inplace`` is set where ``carry_over`` is not empty, and a host's in-place word "pending" is now
"forming" (protocol.InplaceStatus). Migration 0008 then drops ``awaiting_settlement`` and adds the
constraints that keep the columns true to the state.
"""

from typing import Any

from django.db import migrations, models
from django.db.models import F, Q
from django.db.models.functions import Coalesce


def forwards(apps: Any, schema_editor: Any) -> None:
    Round = apps.get_model("jobs", "Round")
    Allocation = apps.get_model("jobs", "Allocation")
    Round.objects.filter(outcome="").update(outcome=None)
    Round.objects.exclude(carry_over={}).update(inplace=True)
    ended = Round.objects.filter(ended_at__isnull=False)
    ended.filter(outcome__isnull=True).update(outcome="replaced")
    ended.update(state="ended")
    open_rounds = Round.objects.filter(ended_at__isnull=True)
    open_rounds.filter(Q(awaiting_settlement=True) | Q(outcome="failed")).update(
        state="settling", outcome=None, failed_at=Coalesce(F("failed_at"), F("created_at"))
    )
    # An outcome without an end (never written so, but a row may say it): ended when it was made.
    open_rounds.filter(outcome__isnull=False).update(state="ended", ended_at=F("created_at"))
    starting = Round.objects.filter(state="starting")
    starting.filter(inplace=True, formed_at__isnull=True).update(state="forming")
    running = Allocation.objects.filter(state="RUNNING").values("round_id")
    starting.filter(Q(formed_at__isnull=False) | Q(first_step_at__isnull=False) | Q(pk__in=running)).update(
        state="running"
    )
    Allocation.objects.filter(inplace="pending").update(inplace="forming")


def backwards(apps: Any, schema_editor: Any) -> None:
    Round = apps.get_model("jobs", "Round")
    Allocation = apps.get_model("jobs", "Allocation")
    Round.objects.filter(state="settling").update(awaiting_settlement=True, outcome="failed")
    Round.objects.filter(outcome__isnull=True).update(outcome="")
    Allocation.objects.filter(inplace="forming").update(inplace="pending")


class Migration(migrations.Migration):
    dependencies = [("jobs", "0006_inplace_rounds")]

    operations = [
        migrations.AddField(
            model_name="round",
            name="state",
            field=models.CharField(
                choices=[
                    ("starting", "starting"),
                    ("forming", "forming"),
                    ("running", "running"),
                    ("settling", "settling a failure"),
                    ("ended", "ended"),
                ],
                default="starting",
                max_length=16,
            ),
        ),
        migrations.AddField(
            model_name="round",
            name="inplace",
            field=models.BooleanField(default=False, help_text="The previous round's ranks carried over"),
        ),
        migrations.AlterField(
            model_name="round",
            name="outcome",
            field=models.CharField(
                blank=True,
                choices=[
                    ("replaced", "replaced"),
                    ("succeeded", "succeeded"),
                    ("failed", "failed"),
                    ("stopped", "stopped"),
                    ("requeued", "requeued"),
                ],
                help_text="How it ended",
                max_length=16,
                null=True,
            ),
        ),
        migrations.AlterField(
            model_name="allocation",
            name="inplace",
            field=models.CharField(
                blank=True,
                choices=[
                    ("forming", "forming"),
                    ("formed", "formed"),
                    ("failed", "failed"),
                    ("left", "left"),
                    ("waiting", "waiting"),
                ],
                max_length=16,
            ),
        ),
        migrations.RunPython(forwards, backwards),
    ]
