"""Configuration: what is probed. Tasks (a prompt, a latency class and its budgets, a quality
bar, options and schedule), their eval cases and, for a scenario task, its steps."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass

from django.contrib.postgres.fields import ArrayField
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from monitor.limits import PROBE_TIMEOUT_MAX_S
from monitor.models.choices import (
    APP_E2E_METRICS,
    BODY_ENCODINGS,
    BODY_JSON,
    CLASS_ASYNC,
    CLASS_BATCH,
    CLASS_INTERACTIVE,
    CONN_COLD,
    CONN_WARM,
    CONNECTION_MODES,
    GRADER_EXACT,
    GRADER_JSON_SCHEMA,
    GRADER_NUMERIC,
    GRADER_REGEX,
    GRADERS,
    HTTP_1_1,
    HTTP_2,
    HTTP_BEST,
    HTTP_VERSIONS,
    LATENCY_CLASSES,
    LATENCY_METRICS,
    METRIC_APP_E2E_P50,
    METRIC_APP_E2E_P95,
    METRIC_AUTO,
    METRIC_E2E_P50,
    METRIC_E2E_P95,
    METRIC_TTFAT_P95,
    METRIC_TTFT_P95,
    NEAR_FRACTION,
    PREFIX_MODES,
    PREFIX_STABLE,
    REF_AUTO,
    STATUS_NEAR,
    STATUS_OK,
    STATUS_OVER,
    STATUS_UNKNOWN,
)
from monitor.models.providers import Provider, Region, Route, slug_validator


@dataclass(frozen=True)
class ClassDefaults:
    """What a latency class means when the task leaves a setting empty (each is overridable
    on the task). Interactive users wait for the first token: rank on its tail. Async and batch
    users wait for the whole answer: rank on e2e; batch also prefers the cheaper of routes
    tied within noise."""

    metric: str
    reasoning_metric: str  # when any of the task's routes reasons
    max_error_rate: float
    min_graded: int
    ttft_p95_budget_ms: int | None
    e2e_p95_budget_ms: int | None
    prefer_cheaper: bool


CLASS_DEFAULTS = {
    CLASS_INTERACTIVE: ClassDefaults(
        metric=METRIC_TTFT_P95,
        reasoning_metric=METRIC_TTFAT_P95,
        max_error_rate=0.02,
        min_graded=20,
        ttft_p95_budget_ms=2_000,
        e2e_p95_budget_ms=None,
        prefer_cheaper=False,
    ),
    CLASS_ASYNC: ClassDefaults(
        metric=METRIC_E2E_P50,
        reasoning_metric=METRIC_E2E_P50,
        max_error_rate=0.05,
        min_graded=20,
        ttft_p95_budget_ms=None,
        e2e_p95_budget_ms=30_000,
        prefer_cheaper=False,
    ),
    CLASS_BATCH: ClassDefaults(
        metric=METRIC_E2E_P50,
        reasoning_metric=METRIC_E2E_P50,
        max_error_rate=0.10,
        min_graded=10,
        ttft_p95_budget_ms=None,
        e2e_p95_budget_ms=None,
        prefer_cheaper=True,
    ),
}


def _default_http_versions() -> list[str]:
    return [HTTP_1_1]


def _default_body_encodings() -> list[str]:
    return [BODY_JSON]


def _default_connection_modes() -> list[str]:
    return [CONN_WARM]


def _default_prefix_modes() -> list[str]:
    return [PREFIX_STABLE]


class Task(models.Model):
    name = models.CharField(max_length=100, unique=True)
    slug = models.SlugField(max_length=50, unique=True, validators=[slug_validator])
    description = models.TextField(blank=True)
    system_prompt = models.TextField(blank=True)
    user_template = models.TextField(
        help_text="The user message. {input} is replaced by an eval case's input, if any."
    )
    input_tokens = models.PositiveIntegerField(
        default=1000, help_text="Target prompt size; padding is added up to this many tokens."
    )
    max_tokens = models.PositiveIntegerField(default=256, validators=[MinValueValidator(1)])
    latency_class = models.CharField(
        max_length=20, choices=LATENCY_CLASSES, default=CLASS_INTERACTIVE
    )
    ttft_p95_budget_ms = models.PositiveIntegerField(
        "TTFT p95 budget (ms)",
        null=True,
        blank=True,
        help_text="Empty: the latency class's default (interactive 2,000 ms). Held against time "
        "to first answer token when the task ranks on it.",
    )
    e2e_p95_budget_ms = models.PositiveIntegerField(
        "e2e p95 budget (ms)",
        null=True,
        blank=True,
        help_text="Empty: the latency class's default (async 30,000 ms).",
    )
    latency_metric = models.CharField(
        max_length=20,
        choices=LATENCY_METRICS,
        default=METRIC_AUTO,
        blank=True,
        help_text="What 'fastest' means for this task. Empty: the latency class's default "
        "(interactive: TTFT p95, or time to first answer token p95 when a route reasons; "
        "async and batch: e2e p50).",
    )
    max_error_rate = models.FloatField(
        "maximum error rate",
        null=True,
        blank=True,
        validators=[MinValueValidator(0.0), MaxValueValidator(1.0)],
        help_text="Availability bar (0 to 1): a route failing more often than this in a region "
        "does not qualify there. Errors that are ours (configuration, engine, missed slots) "
        "never count. Empty: the latency class's default (interactive 2%, async 5%, batch 10%).",
    )
    min_graded = models.PositiveIntegerField(
        "minimum graded probes",
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Graded probes a route needs before its pass rate is judged. Empty: the "
        "latency class's default (interactive and async 20, batch 10).",
    )
    ttft_budget_on_answer = models.BooleanField(
        "TTFT budget counts the first answer token",
        null=True,
        blank=True,
        help_text="Hold the TTFT budget against the first answer token instead of the first "
        "token (thinking included). Empty: yes when one of the task's routes reasons.",
    )
    reference_http_version = models.CharField(
        "reference HTTP version",
        max_length=5,
        blank=True,
        default=REF_AUTO,
        choices=[(REF_AUTO, "the best the provider supports"), *HTTP_VERSIONS],
        help_text="The reference option set ranks routes; other option probes feed comparisons.",
    )
    reference_connection_mode = models.CharField(
        max_length=10,
        blank=True,
        default=REF_AUTO,
        choices=[(REF_AUTO, "warm"), *CONNECTION_MODES],
    )
    reference_body_encoding = models.CharField(
        max_length=20, blank=True, default=REF_AUTO, choices=[(REF_AUTO, "JSON"), *BODY_ENCODINGS]
    )
    reference_prefix_mode = models.CharField(
        max_length=10,
        blank=True,
        default=REF_AUTO,
        choices=[(REF_AUTO, "stable prefix"), *PREFIX_MODES],
    )
    min_pass_rate = models.FloatField(
        null=True,
        blank=True,
        validators=[MinValueValidator(0.0), MaxValueValidator(1.0)],
        help_text="Quality bar: minimum measured pass rate on the eval cases (0 to 1).",
    )
    min_quality_index = models.FloatField(
        null=True, blank=True, help_text="Quality bar: minimum external quality index of a route."
    )
    routes = models.ManyToManyField(Route, related_name="tasks", blank=True)
    regions = models.ManyToManyField(Region, related_name="tasks", blank=True)
    probe_interval_s = models.PositiveIntegerField(
        "probe interval (s)", default=300, validators=[MinValueValidator(10)]
    )
    probe_timeout_s = models.PositiveIntegerField(
        "probe deadline (s)",
        default=180,
        # The longest one allowed bounds the region tasks' time limits (monitor.limits).
        validators=[MinValueValidator(5), MaxValueValidator(PROBE_TIMEOUT_MAX_S)],
        help_text="Total wall-clock bound of one probe; a slot with no result by then plus a "
        "minute of grace is recorded as missed.",
    )
    http_versions = ArrayField(
        models.CharField(max_length=5, choices=HTTP_VERSIONS), default=_default_http_versions
    )
    body_encodings = ArrayField(
        models.CharField(max_length=20, choices=BODY_ENCODINGS), default=_default_body_encodings
    )
    connection_modes = ArrayField(
        models.CharField(max_length=10, choices=CONNECTION_MODES),
        default=_default_connection_modes,
    )
    prefix_modes = ArrayField(
        models.CharField(max_length=10, choices=PREFIX_MODES), default=_default_prefix_modes
    )
    race_interval_s = models.PositiveIntegerField(
        "race interval (s)",
        null=True,
        blank=True,
        validators=[MinValueValidator(10)],
        help_text="Race all candidate routes against each other this often from each region "
        "(the first complete valid answer wins, the rest are cancelled). Empty: no races.",
    )
    monthly_spend_cap_usd = models.DecimalField(
        "monthly probe-spend cap ($)", max_digits=12, decimal_places=2, null=True, blank=True
    )
    is_active = models.BooleanField(default=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        for field in ("http_versions", "body_encodings", "connection_modes", "prefix_modes"):
            if not getattr(self, field):
                raise ValidationError({field: "Pick at least one."})
        for field, options in (
            ("reference_http_version", self.http_versions),
            ("reference_connection_mode", self.connection_modes),
            ("reference_body_encoding", self.body_encodings),
            ("reference_prefix_mode", self.prefix_modes),
        ):
            chosen = getattr(self, field)
            if chosen and chosen not in options:
                raise ValidationError({field: "The reference must be one of the task's options."})

    @property
    def defaults(self) -> ClassDefaults:
        return CLASS_DEFAULTS.get(self.latency_class, CLASS_DEFAULTS[CLASS_INTERACTIVE])

    def ranking_metric(self, routes: Iterable[Route] | None = None) -> str:
        """The metric that ranks routes: the task's own, or its class's default (time to first
        answer token for an interactive task whose routes reason)."""
        if self.is_scenario:
            # A scenario's user waits for the whole sequence: it ranks on app e2e (its tail
            # for interactive tasks), whatever single-call metric is set.
            if self.latency_metric in APP_E2E_METRICS:
                return self.latency_metric
            return (
                METRIC_APP_E2E_P95
                if self.latency_class == CLASS_INTERACTIVE
                else METRIC_APP_E2E_P50
            )
        if self.latency_metric:
            return self.latency_metric
        reasoning = any(r.reasons for r in (self.routes.all() if routes is None else routes))
        return self.defaults.reasoning_metric if reasoning else self.defaults.metric

    @property
    def is_scenario(self) -> bool:
        """A task with steps is a scenario: each slot runs them all (probes.scenario)."""
        prefetched = getattr(self, "_prefetched_objects_cache", {})
        if "steps" in prefetched:
            return bool(prefetched["steps"])
        return self.pk is not None and self.steps.exists()

    def ttft_budget_metric(self, routes: Iterable[Route] | None = None) -> str:
        """What the TTFT p95 budget is held against: TTFT, or time to first answer token."""
        on_answer = self.ttft_budget_on_answer
        if on_answer is None:
            on_answer = any(r.reasons for r in (self.routes.all() if routes is None else routes))
        return METRIC_TTFAT_P95 if on_answer else METRIC_TTFT_P95

    def error_ceiling(self) -> float:
        return (
            self.max_error_rate if self.max_error_rate is not None else self.defaults.max_error_rate
        )

    def graded_needed(self) -> int:
        return self.min_graded if self.min_graded is not None else self.defaults.min_graded

    def reference(self, provider: Provider) -> tuple[str, str, str, str]:
        """The reference option set (HTTP version, body, connection, prefix) for a provider's
        routes. Each option is the task's choice, else the preferred value (the best HTTP
        version the provider supports, JSON, warm, stable prefix) when the task probes it, else
        the task's first option of that kind; never one the provider cannot take."""

        def pick(chosen: str, preferred: str, options: list[str]) -> str:
            if chosen in options:
                return chosen
            return preferred if preferred in options else options[0]

        https = [v for v in self.http_versions if provider.supports(http2=v == HTTP_2)]
        bodies = [b for b in self.body_encodings if provider.supports(body_encoding=b)]
        http = self.reference_http_version
        return (
            pick("" if http == HTTP_BEST else http, HTTP_2, https or [HTTP_1_1]),
            pick(self.reference_body_encoding, BODY_JSON, bodies or [BODY_JSON]),
            pick(
                self.reference_connection_mode,
                CONN_WARM,
                list(self.connection_modes) or [CONN_WARM],
            ),
            pick(
                self.reference_prefix_mode,
                PREFIX_STABLE,
                list(self.prefix_modes) or [PREFIX_STABLE],
            ),
        )

    def reference_label(self) -> str:
        """The reference option set in words (the HTTP version depends on the provider)."""
        http = self.reference_http_version
        labels = dict(HTTP_VERSIONS + CONNECTION_MODES + BODY_ENCODINGS + PREFIX_MODES)
        parts = [
            labels[http]
            if http in (HTTP_1_1, HTTP_2)
            else "the best HTTP version each provider supports",
            labels.get(self.reference_connection_mode, "warm") + " connection"
            if self.reference_connection_mode
            else "warm connection",
            labels.get(self.reference_body_encoding, "JSON") + " body"
            if self.reference_body_encoding
            else "JSON body",
            labels.get(self.reference_prefix_mode, "stable prefix")
            if self.reference_prefix_mode
            else "stable prefix",
        ]
        return ", ".join(parts)

    def is_reference(
        self, provider: Provider, *, http2: bool, body_encoding: str, cold: bool, prefix_mode: str
    ) -> bool:
        """Was a probe with these options one of the reference set's (Task.reference)?"""
        return self.reference(provider) == (
            HTTP_2 if http2 else HTTP_1_1,
            body_encoding,
            CONN_COLD if cold else CONN_WARM,
            prefix_mode,
        )

    def stale_after(self) -> dt.timedelta:
        """No result for this long means the figures are stale: three intervals, or one interval
        plus the probe deadline and a minute, whichever is longer."""
        return max(
            dt.timedelta(seconds=3 * self.probe_interval_s),
            dt.timedelta(seconds=self.probe_interval_s + self.probe_timeout_s + 60),
        )

    def is_fresh(self, last_probe_at: dt.datetime | None, now: dt.datetime) -> bool:
        """Figures whose last probe is this recent are current; older ones are stale (and a
        route with nothing recent in a region cannot be its fastest)."""
        return fresh_within(last_probe_at, now, self.stale_after())

    def budget_ms(self, metric: str) -> int | None:
        """The latency budget set on a metric (ttft_p95, e2e_p95); None for other metrics."""
        if metric in (METRIC_TTFT_P95, METRIC_TTFAT_P95):
            if self.ttft_p95_budget_ms is not None:
                return self.ttft_p95_budget_ms
            return self.defaults.ttft_p95_budget_ms
        if metric == METRIC_E2E_P95:
            if self.e2e_p95_budget_ms is not None:
                return self.e2e_p95_budget_ms
            return self.defaults.e2e_p95_budget_ms
        return None

    def budget_status(self, metric: str, value_ms: float | None) -> str:
        """STATUS_OK, STATUS_NEAR (within NEAR_FRACTION of the budget), STATUS_OVER, or
        STATUS_UNKNOWN when the metric has no budget or there is no figure."""
        budget_ms = self.budget_ms(metric)
        if budget_ms is None or value_ms is None:
            return STATUS_UNKNOWN
        if value_ms > budget_ms:
            return STATUS_OVER
        if value_ms > budget_ms * NEAR_FRACTION:
            return STATUS_NEAR
        return STATUS_OK


def fresh_within(
    last_probe_at: dt.datetime | None, now: dt.datetime, stale_after: dt.timedelta
) -> bool:
    """The one freshness rule (Task.is_fresh), also for figures kept apart from their task
    (the overview snapshot keeps each cell's stale_after)."""
    return last_probe_at is not None and now - last_probe_at <= stale_after


class EvalCase(models.Model):
    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="eval_cases")
    name = models.CharField(max_length=100)
    input = models.TextField(help_text="Replaces {input} in the task's user template.")
    grader = models.CharField(max_length=20, choices=GRADERS, default=GRADER_EXACT)
    expected = models.TextField(
        blank=True, help_text="Expected text, substring, regex or number, by grader."
    )
    json_schema = models.JSONField(null=True, blank=True, help_text="For the JSON schema grader.")
    tolerance = models.FloatField(
        default=0.0, validators=[MinValueValidator(0.0)], help_text="For the numeric grader."
    )
    is_active = models.BooleanField(default=True)

    class Meta:
        ordering = ["task", "name"]
        constraints = [models.UniqueConstraint(fields=["task", "name"], name="evalcase_task_name")]

    def __str__(self) -> str:
        return f"{self.task.name}: {self.name}"

    def clean(self) -> None:
        import re

        if self.grader == GRADER_REGEX:
            try:
                re.compile(self.expected)
            except re.error as exc:
                raise ValidationError(
                    {"expected": f"Not a valid regular expression: {exc}"}
                ) from None
        if self.grader == GRADER_NUMERIC:
            try:
                float(self.expected)
            except ValueError:
                raise ValidationError({"expected": "The numeric grader needs a number."}) from None
        if self.grader == GRADER_JSON_SCHEMA:
            from jsonschema import Draft202012Validator
            from jsonschema.exceptions import SchemaError

            if not isinstance(self.json_schema, dict):
                raise ValidationError({"json_schema": "The JSON schema grader needs a schema."})
            try:
                Draft202012Validator.check_schema(self.json_schema)
            except SchemaError as exc:
                raise ValidationError({"json_schema": f"Invalid schema: {exc.message}"}) from None


STEP_SEQUENTIAL = "sequential"
STEP_FAN_OUT = "fan-out"
STEP_KINDS = [(STEP_SEQUENTIAL, "one call"), (STEP_FAN_OUT, "fan-out (calls in parallel)")]


class ScenarioStep(models.Model):
    """One step of a scenario task: a call (or a fan-out of parallel calls) on the route being
    probed. A task with steps is a scenario; its slots run every step (probes.scenario), then
    validate the final answer with the task's eval case."""

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="steps")
    order = models.PositiveIntegerField(default=0)
    kind = models.CharField(max_length=10, choices=STEP_KINDS, default=STEP_SEQUENTIAL)
    fan_out = models.PositiveIntegerField(
        default=1,
        validators=[MinValueValidator(1), MaxValueValidator(32)],
        help_text="Calls in parallel (fan-out steps); the step waits for the slowest.",
    )
    prompt_template = models.TextField(
        help_text="{previous}: the previous step's answer; {input}: the eval case's input; "
        "{step}, {branch}: the step's and fan-out branch's numbers."
    )
    input_tokens = models.PositiveIntegerField(
        default=0,
        help_text="A stable document of this many tokens before the conversation (the same in "
        "every step, so a prompt cache can serve it).",
    )
    max_tokens = models.PositiveIntegerField(default=256, validators=[MinValueValidator(1)])
    carry_context = models.BooleanField(
        default=True,
        help_text="Send the conversation so far (earlier steps' prompts and answers) first.",
    )
    timeout_s = models.PositiveIntegerField(
        "call deadline (s)",
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Each call's deadline; empty: what is left of the scenario's (the task's "
        "probe deadline).",
    )

    class Meta:
        ordering = ["task", "order", "pk"]

    def __str__(self) -> str:
        return f"{self.task.name}: step {self.order}"

    def clean(self) -> None:
        try:
            self.prompt_template.replace("{input}", "").format(previous="", step=1, branch=1)
        except (KeyError, IndexError, ValueError) as exc:
            raise ValidationError(
                {
                    "prompt_template": f"Only {{previous}}, {{input}}, {{step}} and {{branch}} "
                    f"may be used ({exc.__class__.__name__}: {exc})."
                }
            ) from None
        if self.kind == STEP_SEQUENTIAL and self.fan_out != 1:
            raise ValidationError({"fan_out": "A one-call step has a fan-out of 1."})
