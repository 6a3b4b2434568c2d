"""`python -m mncloud.doctor node …`: the node preflight."""

import sys

from mncloud.doctor.node import main

sys.exit(main())
