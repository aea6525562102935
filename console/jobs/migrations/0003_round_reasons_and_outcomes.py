# Round reasons and outcomes become enums: "scale" splits into autoscale, preemption and drain;
# the free-text outcome becomes RoundOutcome plus an explicit awaiting_settlement flag.

from django.db import migrations, models
from django.db.models import F

ACTIVE = ["STARTING", "RUNNING", "RESIZING", "RESTARTING"]
# The explanatory event the controller emitted (as of the previous round) before a "scale" round.
SCALE_CAUSES = {"job.shrunk": "preemption", "job.drained_off": "drain"}
OLD_REASONS = {"start", "resume", "resize", "restart", "failure", "node_loss", "scale"}


def split_scale_and_type_outcomes(apps, schema_editor):
    Round = apps.get_model("jobs", "Round")
    Event = apps.get_model("telemetry", "Event")
    for rnd in Round.objects.filter(reason="scale").iterator():
        cause = (
            Event.objects.filter(job_id=rnd.job_id, round_number=rnd.number - 1, kind__in=list(SCALE_CAUSES))
            .values_list("kind", flat=True)
            .first()
        )
        rnd.reason = SCALE_CAUSES.get(cause, "autoscale")
        rnd.save(update_fields=["reason"])
        Event.objects.filter(job_id=rnd.job_id, round_number=rnd.number, kind="round.scale").update(
            kind=f"round.{rnd.reason}"
        )
    # The outcome held the next round's reason, "pending", a final state, or "failed" (a rank
    # failure, settled or not).
    Round.objects.filter(outcome__in=OLD_REASONS).update(outcome="replaced")
    Round.objects.filter(outcome="pending").update(outcome="requeued")
    Round.objects.filter(
        outcome="failed", ended_at__isnull=True, number=F("job__round_number"), job__state__in=ACTIVE
    ).update(awaiting_settlement=True)


def join_scale_and_untype_outcomes(apps, schema_editor):
    Round = apps.get_model("jobs", "Round")
    Event = apps.get_model("telemetry", "Event")
    new = ["autoscale", "preemption", "drain"]
    Event.objects.filter(kind__in=[f"round.{r}" for r in new]).update(kind="round.scale")
    Round.objects.filter(reason__in=new).update(reason="scale")
    Round.objects.filter(outcome="requeued").update(outcome="pending")
    for rnd in Round.objects.filter(outcome="replaced").iterator():
        following = Round.objects.filter(job_id=rnd.job_id, number=rnd.number + 1).first()
        rnd.outcome = following.reason if following else "replaced"
        rnd.save(update_fields=["outcome"])


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0002_round_failure"),
        ("telemetry", "0003_metric_without_db_foreign_key"),
    ]

    operations = [
        migrations.AddField(
            model_name="round",
            name="awaiting_settlement",
            field=models.BooleanField(
                default=False,
                help_text="A rank failed; the controller has not yet decided what it costs the job",
            ),
        ),
        migrations.AlterField(
            model_name="round",
            name="outcome",
            field=models.CharField(
                blank=True,
                choices=[
                    ("", "open"),
                    ("replaced", "replaced"),
                    ("succeeded", "succeeded"),
                    ("failed", "failed"),
                    ("stopped", "stopped"),
                    ("requeued", "requeued"),
                ],
                default="",
                max_length=32,
            ),
        ),
        migrations.AlterField(
            model_name="round",
            name="reason",
            field=models.CharField(
                choices=[
                    ("start", "start"),
                    ("resume", "resume"),
                    ("resize", "resize"),
                    ("autoscale", "auto-scale"),
                    ("preemption", "preemption"),
                    ("drain", "drain"),
                    ("restart", "restart"),
                    ("failure", "failure"),
                    ("node_loss", "node loss"),
                ],
                max_length=16,
            ),
        ),
        migrations.RunPython(split_scale_and_type_outcomes, join_scale_and_untype_outcomes),
    ]
