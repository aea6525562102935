"""Alerts under /api/v1/alerts/: each user's channels and rules (their subscriptions), and the
alerts that fired for them with every delivery attempt. Anyone signed in may subscribe (viewers
see every job anyway); each sees and changes only their own, staff see every alert."""

from __future__ import annotations

import base64
import secrets
from typing import Any

from django.db.models import QuerySet
from rest_framework import mixins, serializers, viewsets

from console.alerts import targets
from console.alerts.models import Alert, Attempt, Channel, ChannelKind, Delivery, Rule, RuleKind


def new_secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


class ChannelSerializer(serializers.ModelSerializer):
    class Meta:
        model = Channel
        fields = ["id", "name", "kind", "url", "email", "secret", "created_at"]
        read_only_fields = ["id", "secret", "created_at"]

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        kind = attrs.get("kind", getattr(self.instance, "kind", None))
        if kind == ChannelKind.EMAIL:
            if not attrs.get("email", getattr(self.instance, "email", "")):
                raise serializers.ValidationError({"email": "an e-mail channel needs an address"})
            attrs["url"] = ""
            return attrs
        url = attrs.get("url", getattr(self.instance, "url", ""))
        if not url:
            raise serializers.ValidationError({"url": "a webhook channel needs a URL"})
        try:
            targets.resolve(url)
        except targets.TargetRefused as error:
            raise serializers.ValidationError({"url": str(error)}) from None
        return attrs


class RuleSerializer(serializers.ModelSerializer):
    channels = serializers.PrimaryKeyRelatedField(many=True, queryset=Channel.objects.all())

    class Meta:
        model = Rule
        fields = [
            "id", "name", "kind", "event_kinds", "metric", "above", "threshold", "window_seconds", "scope",
            "job", "channels", "cooldown_seconds", "max_per_hour", "enabled", "created_at",
        ]  # fmt: skip
        read_only_fields = ["id", "created_at"]

    def validate_channels(self, channels: list[Channel]) -> list[Channel]:
        user = self.context["request"].user
        if not channels:
            raise serializers.ValidationError("a rule needs at least one channel")
        if any(c.owner_id != user.pk for c in channels):
            raise serializers.ValidationError("only your own channels")
        return channels

    def validate_event_kinds(self, kinds: Any) -> list[str]:
        if not isinstance(kinds, list) or not all(isinstance(k, str) and 0 < len(k) <= 64 for k in kinds):
            raise serializers.ValidationError('a list of event kinds, e.g. ["job.failed", "job.hang"]')
        return kinds

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        def current(name: str) -> Any:
            return attrs.get(name, getattr(self.instance, name, None))

        kind = current("kind")
        if kind == RuleKind.EVENT and not current("event_kinds"):
            raise serializers.ValidationError({"event_kinds": "an event rule names at least one kind"})
        if kind == RuleKind.METRIC and (not current("metric") or current("threshold") is None):
            raise serializers.ValidationError({"threshold": "a metric rule needs a metric and a threshold"})
        if kind == RuleKind.GOODPUT:
            threshold = current("threshold")
            if threshold is None or not 0 < threshold <= 1:
                raise serializers.ValidationError(
                    {"threshold": "a goodput rule's threshold is a share, 0 < x <= 1"}
                )
            if current("window_seconds") < 60:
                raise serializers.ValidationError({"window_seconds": "at least 60 s"})
        return attrs


class AttemptSerializer(serializers.ModelSerializer):
    class Meta:
        model = Attempt
        fields = ["at", "ok", "status_code", "error", "duration_ms"]


class DeliverySerializer(serializers.ModelSerializer):
    attempts_made = AttemptSerializer(source="attempt_log", many=True)

    class Meta:
        model = Delivery
        fields = ["id", "channel", "state", "attempts", "next_attempt_at", "sent_at", "attempts_made"]


class AlertSerializer(serializers.ModelSerializer):
    deliveries = DeliverySerializer(many=True)

    class Meta:
        model = Alert
        fields = [
            "id", "rule", "key", "event", "job", "subject", "state", "severity", "title", "payload",
            "happened_at", "created_at", "deliveries",
        ]  # fmt: skip


class ChannelViewSet(viewsets.ModelViewSet):  # type: ignore[type-arg]
    serializer_class = ChannelSerializer
    cursor_ordering = ("id",)

    def get_queryset(self) -> QuerySet[Channel]:
        return Channel.objects.filter(owner_id=self.request.user.pk)

    def perform_create(self, serializer: serializers.BaseSerializer[Channel]) -> None:
        serializer.save(owner=self.request.user, secret=new_secret())


class RuleViewSet(viewsets.ModelViewSet):  # type: ignore[type-arg]
    serializer_class = RuleSerializer
    cursor_ordering = ("id",)

    def get_queryset(self) -> QuerySet[Rule]:
        return Rule.objects.filter(owner_id=self.request.user.pk).prefetch_related("channels")

    def perform_create(self, serializer: serializers.BaseSerializer[Rule]) -> None:
        serializer.save(owner=self.request.user)


class AlertViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):  # type: ignore[type-arg]
    serializer_class = AlertSerializer
    cursor_ordering = ("-id",)

    def get_queryset(self) -> QuerySet[Alert]:
        alerts = Alert.objects.prefetch_related("deliveries__attempt_log")
        if getattr(self.request.user, "is_staff", False):
            return alerts
        return alerts.filter(rule__owner_id=self.request.user.pk)
