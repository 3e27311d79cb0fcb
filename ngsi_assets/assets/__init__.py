"""The platform's software-defined assets, one module per family.

``backfill_policy=BackfillPolicy.single_run()`` (one run for a backfill's hours) is a beta parameter
of Dagster's ``@asset``: each decorator would print a ``BetaWarning`` at import, eight lines in every
command's output. The platform relies on it knowingly, so exactly that warning is silenced here, for
this package's decorators; every other warning still shows.
"""

import warnings

from dagster import BetaWarning

warnings.filterwarnings("ignore", message=r"Parameter `backfill_policy` of function", category=BetaWarning)
