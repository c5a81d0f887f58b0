from __future__ import annotations

import sys

from devstack.stack import main

sys.exit(main())
