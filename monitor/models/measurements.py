"""Measurements: each probe's result, the slot it fills, races, scenario results, the span of
generated demo history and the processes' heartbeats."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import BrinIndex
from django.db import connection, models
from django.utils import timezone

from monitor.models.choices import (
    BODY_ENCODINGS,
    BODY_JSON,
    ERROR_KINDS,
    OUTCOME_OK,
    OUTCOMES,
    PREFIX_MODES,
    PREFIX_STABLE,
    TOKEN_SOURCES,
)
from monitor.models.providers import Region, Route
from monitor.models.tasks import EvalCase, Task


class ProbeResult(models.Model):
    """One measured call. Field names and units follow PRODUCT.md's metric table."""

    # No index of their own: result_one_per_slot leads with task, result_route_started with
    # route (each a 99 MB index fewer to write per year of 50 routes x 3 regions).
    task = models.ForeignKey(
        Task, on_delete=models.CASCADE, null=True, related_name="results", db_index=False
    )
    route = models.ForeignKey(
        Route, on_delete=models.CASCADE, related_name="results", db_index=False
    )
    region = models.ForeignKey(Region, on_delete=models.CASCADE, related_name="results")
    eval_case = models.ForeignKey(EvalCase, on_delete=models.SET_NULL, null=True, blank=True)
    # The schedule slot this probe fills (null for ad-hoc probes); one result per slot.
    slot_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(default=timezone.now)
    # Planned start to actual start (ms), measured by the region worker: the tick planned the
    # start, the worker's queue and its probe loop delayed it. Null for rows written before it
    # was measured and for ad-hoc probes. A `missed` row with a lag is a probe the worker did
    # not start because it was past settings.START_LAG_MAX_SECONDS (monitor.stats.health).
    start_lag_ms = models.FloatField(null=True, blank=True)

    # options probed
    http2 = models.BooleanField(default=False)
    body_encoding = models.CharField(max_length=20, choices=BODY_ENCODINGS, default=BODY_JSON)
    cold = models.BooleanField(default=False)
    prefix_mode = models.CharField(max_length=10, choices=PREFIX_MODES, default=PREFIX_STABLE)
    max_tokens = models.PositiveIntegerField(null=True, blank=True)
    # Probed with the task's reference option set (Task.reference) when it ran: only these
    # rank routes (set at ingest).
    reference = models.BooleanField(default=False, db_default=False)

    # connection and transfer
    dns_ms = models.FloatField(null=True, blank=True)
    connect_ms = models.FloatField(null=True, blank=True)
    tls_ms = models.FloatField(null=True, blank=True)
    upload_ms = models.FloatField(null=True, blank=True)
    request_bytes = models.PositiveIntegerField(null=True, blank=True)
    ttfb_ms = models.FloatField(null=True, blank=True)
    ttft_ms = models.FloatField(null=True, blank=True)
    ttfat_ms = models.FloatField(null=True, blank=True)
    e2e_ms = models.FloatField(null=True, blank=True)
    # A failed probe: request sent -> the failure was known (OpenTelemetry exports it as the
    # failed operation's duration). Null for completed probes and for probes never sent.
    failed_after_ms = models.FloatField(null=True, blank=True)
    # The provider's own time as it reports it (Bedrock's metrics.latencyMs, else
    # openai-processing-ms): the rest of e2e was the path's. Null: not reported.
    server_ms = models.FloatField(null=True, blank=True)
    http_version = models.CharField(max_length=10, blank=True)

    # tokens and speed
    output_tokens = models.PositiveIntegerField(null=True, blank=True)
    token_source = models.CharField(max_length=10, choices=TOKEN_SOURCES, blank=True)
    tps = models.FloatField("tokens/s", null=True, blank=True)
    tpot_ms = models.FloatField(null=True, blank=True)
    itl_p50_ms = models.FloatField(null=True, blank=True)
    itl_max_ms = models.FloatField(null=True, blank=True)
    input_tokens = models.PositiveIntegerField(null=True, blank=True)
    # null = the provider did not report it, which differs from 0
    cached_tokens = models.PositiveIntegerField(null=True, blank=True)
    # Reasoning the provider reports (streamed or not), and the part of it billed but never
    # streamed: shown apart, never counted as speed (tps counts streamed tokens only).
    reasoning_tokens = models.PositiveIntegerField(null=True, blank=True)
    hidden_reasoning_tokens = models.PositiveIntegerField(null=True, blank=True)
    # Output tokens streamed in the timed window: what tps counts (output_tokens is billed).
    streamed_output_tokens = models.PositiveIntegerField(null=True, blank=True)
    tps_token_source = models.CharField(
        "how speed's tokens were counted", max_length=40, blank=True, default="", db_default=""
    )

    # What actually served the probe (comparisons group by these, not by what was asked).
    # Defaults in the database too: writers that insert rows in SQL (the bench loader, an
    # admin's fix) need not know these columns.
    served_model = models.CharField(max_length=200, blank=True, default="", db_default="")
    request_id = models.CharField(max_length=100, blank=True, default="", db_default="")
    service_tier = models.CharField(max_length=30, blank=True, default="", db_default="")
    connection_reused = models.BooleanField(null=True, blank=True)

    # rate limits, as received
    ratelimit_remaining_requests = models.IntegerField(null=True, blank=True)
    ratelimit_remaining_tokens = models.IntegerField(null=True, blank=True)
    retry_after_s = models.FloatField(null=True, blank=True)

    outcome = models.CharField(max_length=10, choices=OUTCOMES, default=OUTCOME_OK)
    error_kind = models.CharField(max_length=30, choices=ERROR_KINDS, blank=True)
    error_detail = models.CharField(max_length=500, blank=True)
    text = models.TextField(blank=True)
    quality_pass = models.BooleanField(null=True, blank=True)
    cost_usd = models.DecimalField(max_digits=12, decimal_places=6, null=True, blank=True)
    # Demo history made up from the simulator's profiles on a fresh demo (monitor.demo_history),
    # never measured: pages say so and can leave it out. Set only in this process, never taken
    # from a region worker's message (monitor.pipeline.ingest).
    generated = models.BooleanField(default=False, db_default=False)
    # One call of a scenario (its slot is the scenario's: slot_at stays null here), and the
    # index of its step (0-based).
    scenario = models.ForeignKey["ScenarioResult | None", "ScenarioResult | None"](
        "ScenarioResult",
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        default=None,
        db_default=None,
        related_name="calls",
        db_index=False,  # result_scenario_calls: scenario calls only, not every probe
    )
    step = models.PositiveSmallIntegerField(null=True, blank=True, default=None, db_default=None)

    class Meta:
        indexes = [
            # The "includes generated demo history" banner on every page: the generated span's
            # ends from an index that is empty on every real deployment.
            models.Index(
                fields=["started_at"],
                name="result_generated_started",
                condition=models.Q(generated=True),
            ),
            # Time-range scans over the whole table (rollups, retention, probe log): BRIN is
            # tiny and fits an append-mostly table ordered by time.
            BrinIndex(fields=["started_at"], name="result_started_brin"),
            # Route page raw reads (median probe, headroom, option comparisons): one route,
            # last 24 h. No percentile is computed from raw rows (rollups hold them), so the
            # index carries no measurement columns: a third of the size it was, cheaper ingest.
            models.Index(fields=["route", "started_at"], name="result_route_started"),
            # A scenario's calls (its waterfall, deleting it): partial, so single probes (the
            # bulk of the table) write nothing to it.
            models.Index(
                fields=["scenario"],
                name="result_scenario_calls",
                condition=models.Q(scenario__isnull=False),
            ),
        ]
        constraints = [
            # The table is partitioned by day on started_at (migration 0017, monitor.partitions),
            # so its unique keys hold started_at; one result per slot is kept by ingest.
            models.UniqueConstraint(
                fields=["task", "route", "region", "slot_at", "started_at"],
                name="result_one_per_slot",
            )
        ]

    def __str__(self) -> str:
        return f"{self.route} @ {self.region} {self.started_at:%Y-%m-%d %H:%M:%S} {self.outcome}"


GENERATED_SPAN_KEY = "results"


class GeneratedSpan(models.Model):
    """The span of the generated demo history's results (ProbeResult.generated), kept in one
    row so that every page need not search the results for it: over a year of daily
    partitions that search is planned across all of them (31-35 ms on each page). Ingest
    widens it in the transaction that writes generated rows; retention reads it again from the
    results after dropping or deleting any (refresh). No row: no generated history."""

    key = models.CharField(max_length=20, primary_key=True, default=GENERATED_SPAN_KEY)
    start = models.DateTimeField()
    last = models.DateTimeField()

    def __str__(self) -> str:
        return f"generated {self.start} - {self.last}"

    @classmethod
    def widen(cls, start: dt.datetime, last: dt.datetime) -> None:
        """Take in generated results from `start` to `last` (in the writer's transaction)."""
        table = cls._meta.db_table
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {table} (key, start, last) VALUES (%s, %s, %s) "
                f"ON CONFLICT (key) DO UPDATE SET start = least({table}.start, excluded.start), "
                f"last = greatest({table}.last, excluded.last)",
                [GENERATED_SPAN_KEY, start, last],
            )

    @classmethod
    def refresh(cls) -> GeneratedSpan | None:
        """Read the span again from the results (after retention removed some of them)."""
        generated = ProbeResult.objects.filter(generated=True)
        first = generated.order_by("started_at").values_list("started_at", flat=True).first()
        last = generated.order_by("-started_at").values_list("started_at", flat=True).first()
        if first is None or last is None:
            cls.objects.filter(pk=GENERATED_SPAN_KEY).delete()
            return None
        span, _ = cls.objects.update_or_create(
            pk=GENERATED_SPAN_KEY, defaults={"start": first, "last": last}
        )
        return span


# Beat's tick (monitor.tasks.tick) checks in under this name: its freshness says whether beat
# is ticking.
HEARTBEAT_TICK = "tick"
# A counter every configuration change adds to (monitor.apps): pages built for every viewer
# are keyed by it (monitor.pages.shared).
HEARTBEAT_CONFIG_VERSION = "config-version"


class Heartbeat(models.Model):
    """Last time a periodic process checked in (beat's tick, workers); shown as freshness."""

    name = models.CharField(max_length=100, primary_key=True)
    last_seen = models.DateTimeField()
    count = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.name} @ {self.last_seen}"

    @classmethod
    def add(cls, name: str, n: int = 1) -> None:
        """Add n to a durable counter: one statement, so concurrent writers never lose an
        increment; inside a transaction, it counts only if that commits."""
        table = cls._meta.db_table
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {table} (name, last_seen, count) VALUES (%s, now(), %s) "
                f"ON CONFLICT (name) DO UPDATE SET count = {table}.count + EXCLUDED.count, "
                "last_seen = EXCLUDED.last_seen",
                [name, n],
            )


SLOT_DISPATCHED = "dispatched"
SLOT_DONE = "done"
SLOT_MISSED = "missed"
SLOT_STATUSES = [(SLOT_DISPATCHED, "dispatched"), (SLOT_DONE, "done"), (SLOT_MISSED, "missed")]


class ProbeSlot(models.Model):
    """One scheduled (task, route, region, time): created once by whichever beat ticks first,
    ends done (a result arrived) or missed (none by its deadline)."""

    task = models.ForeignKey(Task, on_delete=models.CASCADE)
    route = models.ForeignKey(Route, on_delete=models.CASCADE)
    region = models.ForeignKey(Region, on_delete=models.CASCADE)
    slot_at = models.DateTimeField()
    deadline_at = models.DateTimeField()
    status = models.CharField(max_length=12, choices=SLOT_STATUSES, default=SLOT_DISPATCHED)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["task", "route", "region", "slot_at"], name="slot_key_unique"
            )
        ]
        indexes = [
            # The missed-slot sweep: dispatched slots past their deadline.
            models.Index(
                fields=["deadline_at"],
                name="slot_open_deadline",
                condition=models.Q(status="dispatched"),
            ),
            # Retention: slots are created in time order, so a block range index finds the
            # old ones for a fraction of a B-tree's size.
            BrinIndex(fields=["slot_at"], name="slot_at_brin"),
        ]

    def __str__(self) -> str:
        return f"{self.task_id}/{self.route_id}/{self.region_id}@{self.slot_at:%H:%M:%S}"


class RaceRun(models.Model):
    """One race: the task's request fired at all its routes at once from one region; the first
    complete valid answer won and the rest were cancelled (probes.race)."""

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="races")
    region = models.ForeignKey(Region, on_delete=models.CASCADE, related_name="races")
    # The race slot: the row is created when the race is dispatched (by exactly one beat,
    # INSERT ... ON CONFLICT), filled in when its result arrives, or marked missed by the
    # sweep once past its deadline, like a ProbeSlot.
    slot_at = models.DateTimeField()
    deadline_at = models.DateTimeField()
    status = models.CharField(max_length=12, choices=SLOT_STATUSES, default=SLOT_DISPATCHED)
    started_at = models.DateTimeField(default=timezone.now)
    winner = models.ForeignKey(
        Route, on_delete=models.SET_NULL, null=True, blank=True, related_name="races_won"
    )
    winner_ms = models.FloatField(null=True, blank=True)
    # Per route id (as a string): {"elapsed_ms", "cancelled", "tokens_paid", "saved_ms",
    # "outcome", "error_kind"}; saved_ms is the time the race saved against that route alone.
    lanes = models.JSONField(default=dict)
    loser_tokens = models.PositiveIntegerField(default=0)
    loser_cost_usd = models.DecimalField(max_digits=12, decimal_places=6, default=Decimal("0"))
    # All lanes together, the winner's included (counts toward the task's monthly spend).
    cost_usd = models.DecimalField(max_digits=12, decimal_places=6, default=Decimal("0"))
    # Demo history (monitor.demo_history), as ProbeResult.generated.
    generated = models.BooleanField(default=False, db_default=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["task", "region", "slot_at"], name="race_one_per_slot")
        ]
        indexes = [
            # Races page: one task's races over a window.
            models.Index(fields=["task", "started_at"], name="race_task_time"),
            # The missed-race sweep: dispatched races past their deadline.
            models.Index(
                fields=["deadline_at"],
                name="race_open_deadline",
                condition=models.Q(status="dispatched"),
            ),
        ]

    def __str__(self) -> str:
        return f"race {self.task_id}@{self.region_id} {self.started_at:%Y-%m-%d %H:%M:%S}"


class ScenarioResult(models.Model):
    """One scenario slot's result: the application's end-to-end time and its calls (the
    ProbeResult rows whose `scenario` is this one)."""

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="scenario_results")
    route = models.ForeignKey(Route, on_delete=models.CASCADE, related_name="scenario_results")
    region = models.ForeignKey(Region, on_delete=models.CASCADE, related_name="scenario_results")
    slot_at = models.DateTimeField()
    started_at = models.DateTimeField(default=timezone.now)
    # User action to validated result (to the failure, for a failed scenario).
    app_e2e_ms = models.FloatField(null=True, blank=True)
    calls_e2e_ms = models.FloatField(null=True, blank=True)
    gaps_ms = ArrayField(models.FloatField(), default=list, blank=True)
    outcome = models.CharField(max_length=10, choices=OUTCOMES, default=OUTCOME_OK)
    failed_step = models.PositiveSmallIntegerField(null=True, blank=True)  # 0-based
    error_kind = models.CharField(max_length=30, choices=ERROR_KINDS, blank=True)
    error_detail = models.CharField(max_length=500, blank=True)
    validation_ms = models.FloatField(null=True, blank=True)
    validation_pass = models.BooleanField(null=True, blank=True)
    eval_case = models.ForeignKey(EvalCase, on_delete=models.SET_NULL, null=True, blank=True)
    call_count = models.PositiveIntegerField(default=0)
    input_tokens = models.PositiveIntegerField(default=0)
    output_tokens = models.PositiveIntegerField(default=0)
    cached_tokens = models.PositiveIntegerField(null=True, blank=True)
    cost_usd = models.DecimalField(max_digits=12, decimal_places=6, null=True, blank=True)
    # Demo history (monitor.demo_history), as ProbeResult.generated (its calls are marked too).
    # A measured scenario can have no call (one that failed before its first): this flag, not
    # its calls', tells the history's guard that the database holds measurements.
    generated = models.BooleanField(default=False, db_default=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["task", "route", "region", "slot_at"], name="scenario_one_per_slot"
            )
        ]
        indexes = [
            # Route page: the median scenario of one route over the last day.
            models.Index(fields=["route", "started_at"], name="scenario_route_started"),
            # Retention: the scenarios older than the raw results kept (ingest).
            models.Index(fields=["slot_at"], name="scenario_slot_at"),
        ]

    def __str__(self) -> str:
        return f"scenario {self.task_id}/{self.route_id}/{self.region_id} {self.outcome}"
