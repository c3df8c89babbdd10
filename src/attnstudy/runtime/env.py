"""Settings read from environment variables: one parser for every number of seconds
(``$ATTNSTUDY_TRACKING_TIMEOUT``, ``$ATTNSTUDY_TRAINING_WAIT``, ``$ATTNSTUDY_LEASE_SECONDS``,
``$ATTNSTUDY_PROGRESS_SECONDS``, ``$ATTNSTUDY_PROGRESS_METRIC_SECONDS``,
``$ATTNSTUDY_SYSTEM_METRICS_SECONDS``). Standard library only: the command line reads some before
torch or MLflow load.
"""

from __future__ import annotations

import math
import os


def env_seconds(
    var: str, default: float, *, low: float, high: float, low_open: bool = False, why: str = ""
) -> float:
    """A number of seconds from ``$var``, else ``default`` (unset or blank).

    Args:
        var: the variable's name.
        default: the value when it is unset or blank.
        low, high: the accepted range, ``high`` included; ``low`` too unless ``low_open``.
        low_open: refuse ``low`` itself (a timeout of 0 s).
        why: what the number is for, said in the refusal.

    Raises:
        ConfigError: not a number in the range (one line naming the variable, its value, the
            range and the default).
    """
    text = os.environ.get(var, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if (low < value if low_open else low <= value) and value <= high:
        return value
    from attnstudy.config import ConfigError

    shown = f"{'(' if low_open else '['}{low:g}, {high:g}]"
    raise ConfigError(
        f"{var}={text!r} is not a number of seconds in {shown}{f' ({why})' if why else ''}; "
        f"unset it for the default ({default:g} s)"
    )
