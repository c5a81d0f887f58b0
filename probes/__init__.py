"""The measuring engine: one LLM call measured the way an application experiences it.

    from probes import ProbeSpec, probe, run_batch, race, grade
    result = await probe(ProbeSpec(base_url=..., format="openai", model=..., api_key=...))

No Django here. Public surface:
- ProbeSpec, Measurement (probes.model): what to call / what was measured (to_dict/from_dict)
- probe(spec) -> Measurement: never raises; failures are outcomes with an error_kind
- Kind, Blame, ProbeError (probes.errors): the one failure taxonomy, each kind with its
  meaning and the party it blames (`Kind(result.error_kind).counts_against_provider`)
- probes.redact.redact(text, secrets): the one redactor for secrets (logs use it too)
- run_batch(specs, window_s=, max_in_flight=) -> list[Measurement]
- race(specs_by_name) -> RaceMeasurement
- grade(grader, text, expected, schema, tolerance) -> bool
- WIRE_FORMATS: the registry of wire formats ("openai", "azure", "anthropic", "responses",
  "gemini", "bedrock"), one module each for the newer three
"""

from __future__ import annotations

from probes.batch import run_batch
from probes.engine import probe
from probes.errors import Blame, Kind, ProbeError
from probes.formats import WIRE_FORMATS
from probes.graders import grade
from probes.model import Measurement, ProbeSpec
from probes.race import RaceMeasurement, race

__all__ = [
    "WIRE_FORMATS",
    "Blame",
    "Kind",
    "Measurement",
    "ProbeError",
    "ProbeSpec",
    "RaceMeasurement",
    "grade",
    "probe",
    "race",
    "run_batch",
]
