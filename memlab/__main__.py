"""``python -m memlab`` runs the ``memlab`` command (:func:`memlab.cli.main`)."""

import sys

from memlab.cli import main

sys.exit(main())
