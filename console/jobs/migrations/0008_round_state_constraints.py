"""``awaiting_settlement`` is the SETTLING state now (0007 mapped the rows); the columns that
record a round's life are held true to its state by constraints."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("jobs", "0007_round_state")]

    operations = [
        migrations.RemoveField(model_name="round", name="awaiting_settlement"),
        migrations.AddConstraint(
            model_name="round",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    models.Q(("ended_at__isnull", False), ("outcome__isnull", False), ("state", "ended")),
                    models.Q(
                        models.Q(("state", "ended"), _negated=True),
                        ("ended_at__isnull", True),
                        ("outcome__isnull", True),
                    ),
                    _connector="OR",
                ),
                name="round_ended_with_outcome",
            ),
        ),
        migrations.AddConstraint(
            model_name="round",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    models.Q(("state", "settling"), _negated=True),
                    ("failed_at__isnull", False),
                    _connector="OR",
                ),
                name="round_settling_since_failure",
            ),
        ),
        migrations.AddConstraint(
            model_name="round",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    models.Q(("state", "forming"), _negated=True), ("inplace", True), _connector="OR"
                ),
                name="round_forming_in_place",
            ),
        ),
        migrations.AddConstraint(
            model_name="round",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    models.Q(("inplace", True), models.Q(("carry_over", {}), _negated=True)),
                    models.Q(("carry_over", {}), ("inplace", False)),
                    _connector="OR",
                ),
                name="round_inplace_carries_over",
            ),
        ),
    ]
