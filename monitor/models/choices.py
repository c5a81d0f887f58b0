"""The vocabulary the models share: wire formats and request settings, probe options,
latency classes and metrics, graders, outcomes and budget statuses (admin choices and
stored values alike)."""

from __future__ import annotations

from probes import formats, graders, model
from probes.bedrock import BedrockConverse
from probes.errors import Kind
from probes.formats import PROTECTED_BODY_KEYS, AnthropicMessages, AzureOpenAIChat, OpenAIChat
from probes.gemini import GeminiNative
from probes.graders import GRADER_CONTAINS as GRADER_CONTAINS
from probes.graders import GRADER_EXACT as GRADER_EXACT
from probes.graders import GRADER_JSON_SCHEMA as GRADER_JSON_SCHEMA
from probes.graders import GRADER_NUMERIC as GRADER_NUMERIC
from probes.graders import GRADER_REGEX as GRADER_REGEX
from probes.model import BODY_JSON as BODY_JSON
from probes.model import BODY_MSGPACK_GZIP as BODY_MSGPACK_GZIP
from probes.responses import OpenAIResponses

# Wire formats are probes.formats' registry: each format's name is its stored value, its
# label the admin's choice (declared once, on the format).
WIRE_OPENAI = OpenAIChat.name
WIRE_ANTHROPIC = AnthropicMessages.name
WIRE_AZURE = AzureOpenAIChat.name
WIRE_RESPONSES = OpenAIResponses.name
WIRE_GEMINI = GeminiNative.name
WIRE_BEDROCK = BedrockConverse.name
WIRE_FORMATS = [(name, fmt.label) for name, fmt in formats.WIRE_FORMATS.items()]
# Formats that speak OpenAI's Chat Completions body (reasoning_effort, max_completion_tokens).
OPENAI_BODIES = (WIRE_OPENAI, WIRE_AZURE)
# Formats that take reasoning_effort (Gemini as its thinking level) and a thinking budget.
TAKES_REASONING_EFFORT = (WIRE_OPENAI, WIRE_AZURE, WIRE_RESPONSES, WIRE_GEMINI)
TAKES_THINKING_BUDGET = (WIRE_ANTHROPIC, WIRE_GEMINI, WIRE_BEDROCK)
# Formats whose output cap bounds reasoning and answer together when reasoning_effort is set.
EFFORT_WITHIN_CAP = (WIRE_RESPONSES, WIRE_GEMINI)
BEDROCK_SERVICE_TIERS = ("priority", "default", "flex")

# Route request settings, as the real APIs name them.
# Parameter names, not secrets (S105 reads "token" as a password).
TOKEN_LIMIT_MAX_TOKENS = "max_tokens"  # noqa: S105
TOKEN_LIMIT_MAX_COMPLETION_TOKENS = "max_completion_tokens"  # noqa: S105
TOKEN_LIMIT_PARAMS = [
    (TOKEN_LIMIT_MAX_TOKENS, "max_tokens (chat models, Anthropic, most compatible servers)"),
    (
        TOKEN_LIMIT_MAX_COMPLETION_TOKENS,
        "max_completion_tokens (OpenAI reasoning models: o-series, GPT-5)",
    ),
]
REASONING_EFFORTS = [
    ("", "not sent"),
    ("minimal", "minimal"),
    ("low", "low"),
    ("medium", "medium"),
    ("high", "high"),
]
SERVICE_TIERS = [
    ("", "not sent"),
    ("auto", "auto"),
    ("default", "default"),
    ("flex", "flex (cheaper, slower)"),
    ("priority", "priority (faster, dearer)"),
]
# Body keys a route's extra fields may not set: those the probe owns (the engine refuses them
# too) and those the route's own settings send.
RESERVED_BODY_KEYS = PROTECTED_BODY_KEYS | {
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "reasoning_effort",
    "service_tier",
    "thinking",
    # the newer formats' prompt, output cap and storage, which the probe sets
    "input",
    "instructions",
    "store",
    "max_output_tokens",
    "contents",
    "systemInstruction",
    "inferenceConfig",
}
# Anthropic's smallest extended-thinking budget.
MIN_THINKING_BUDGET = 1024
# What a max_completion_tokens route may spend on hidden reasoning on top of the task's answer
# bound: OpenAI advises reserving at least 25,000 tokens for reasoning and output when starting
# out (its reasoning guide). A cap, not a charge: only what the model uses is billed.
REASONING_ALLOWANCE_TOKENS = 25_000

# Body encodings and graders: the engine's registries (probes.model, probes.graders), read here
# for the admin's choices.
BODY_ENCODINGS = list(model.BODY_ENCODINGS.items())

HTTP_1_1 = "1.1"
HTTP_2 = "2"
HTTP_VERSIONS = [(HTTP_1_1, "HTTP/1.1"), (HTTP_2, "HTTP/2")]

CONN_WARM = "warm"
CONN_COLD = "cold"
CONNECTION_MODES = [(CONN_WARM, "warm (pooled)"), (CONN_COLD, "cold (new connection)")]

PREFIX_STABLE = "stable"
PREFIX_FRESH = "fresh"
PREFIX_MODES = [(PREFIX_STABLE, "stable prefix (cache can hit)"), (PREFIX_FRESH, "fresh prefix")]

CLASS_INTERACTIVE = "interactive"
CLASS_ASYNC = "async"
CLASS_BATCH = "batch"
LATENCY_CLASSES = [
    (CLASS_INTERACTIVE, "interactive"),
    (CLASS_ASYNC, "async"),
    (CLASS_BATCH, "batch"),
]

METRIC_E2E_P50 = "e2e_p50"
METRIC_E2E_P95 = "e2e_p95"
METRIC_TTFT_P50 = "ttft_p50"
METRIC_TTFT_P95 = "ttft_p95"
# Time to first answer token: for routes that reason, the first token the user can read (TTFT
# of a reasoning route is its first thinking token).
METRIC_TTFAT_P50 = "ttfat_p50"
METRIC_TTFAT_P95 = "ttfat_p95"
# Application end-to-end (scenario tasks): user action to validated result, every call of
# the scenario and the work between them included.
METRIC_APP_E2E_P50 = "app_e2e_p50"
METRIC_APP_E2E_P95 = "app_e2e_p95"
APP_E2E_METRICS = (METRIC_APP_E2E_P50, METRIC_APP_E2E_P95)
METRIC_AUTO = ""  # the latency class's default (CLASS_DEFAULTS)
LATENCY_METRICS = [
    (METRIC_AUTO, "the latency class's default"),
    (METRIC_E2E_P50, "e2e p50"),
    (METRIC_E2E_P95, "e2e p95"),
    (METRIC_TTFT_P50, "TTFT p50"),
    (METRIC_TTFT_P95, "TTFT p95"),
    (METRIC_TTFAT_P50, "time to first answer token p50"),
    (METRIC_TTFAT_P95, "time to first answer token p95"),
    (METRIC_APP_E2E_P50, "app e2e p50 (scenario tasks)"),
    (METRIC_APP_E2E_P95, "app e2e p95 (scenario tasks)"),
]

# The reference option set: the probes that rank routes. Other option probes feed the route
# page's comparisons only, so changing a task's option mix never moves its winner.
REF_AUTO = ""  # per option: warm, JSON, stable prefix, the best HTTP version the provider has
HTTP_BEST = "best"


GRADERS = list(graders.GRADERS.items())

OUTCOME_OK = "ok"
OUTCOME_ERROR = "error"
OUTCOME_MISSED = "missed"
OUTCOMES = [(OUTCOME_OK, "ok"), (OUTCOME_ERROR, "error"), (OUTCOME_MISSED, "missed")]

# One taxonomy (probes.errors.Kind): the engine's failure kinds, ours (config, engine) and the
# monitor's `missed` (a slot with no result by its deadline). Stored as the kind's string.
ERROR_KINDS = [(kind.value, kind.value) for kind in Kind]

TOKEN_SOURCES = [("usage", "server usage"), ("tokenizer", "counted (o200k_base)")]

# Where a figure stands against the task's latency budget (Task.budget_status).
STATUS_OK = "ok"
STATUS_NEAR = "near"
STATUS_OVER = "over"
STATUS_UNKNOWN = "unknown"  # no budget set, or no figure to hold against it
BUDGET_STATUSES = [
    (STATUS_OK, "within budget"),
    (STATUS_NEAR, "near budget"),
    (STATUS_OVER, "over budget"),
    (STATUS_UNKNOWN, "no data"),
]
NEAR_FRACTION = 0.9  # within 90-100% of a budget is "near"
