"""The monitor app's models, one module per concern (docs/architecture.md). Every model,
choice and rule is importable from here, as when this was one module."""

from monitor.models.answer import *  # noqa: F403
from monitor.models.choices import *  # noqa: F403
from monitor.models.digest import *  # noqa: F403
from monitor.models.keys import *  # noqa: F403
from monitor.models.measurements import *  # noqa: F403
from monitor.models.providers import *  # noqa: F403
from monitor.models.rollups import *  # noqa: F403
from monitor.models.tasks import *  # noqa: F403
from monitor.models.tasks import _default_body_encodings as _default_body_encodings
from monitor.models.tasks import _default_connection_modes as _default_connection_modes
from monitor.models.tasks import _default_http_versions as _default_http_versions
from monitor.models.tasks import _default_prefix_modes as _default_prefix_modes
